"""Render a GGUF chat template (`tokenizer.chat_template`, Jinja) the way HF transformers does.

Sandboxed Jinja with trim_blocks/lstrip_blocks, the `raise_exception` and `strftime_now` globals
and a `tojson` filter that keeps non-ASCII text, so templates written for transformers render
identically here. Any template failure is a `ValueError` with a one-line reason.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Fallback for models whose GGUF carries no template: plain ChatML (Qwen, many others).
CHATML_TEMPLATE = """\
{%- for message in messages %}
{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

# Fallback for harmony models (gpt-oss) whose GGUF carries no template: the layout of gpt-oss's
# own template (system block with `Reasoning:`, developer instructions and tools, tool calls on
# the commentary channel), with tool parameters as JSON schema instead of TypeScript.
HARMONY_TEMPLATE = """\
{{- "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\\n" }}
{{- "Knowledge cutoff: 2024-06\\n\\nReasoning: " + (reasoning_effort or "medium") + "\\n\\n" }}
{{- "# Valid channels: analysis, commentary, final. Channel must be included for every message." }}
{%- if tools %}
{{- "\\nCalls to these tools must go to the commentary channel: 'functions'." }}
{%- endif %}
{{- "<|end|>" }}
{%- set system = messages and messages[0].role == "system" %}
{%- if system or tools %}
{{- "<|start|>developer<|message|>" }}
{%- if system %}
{{- "# Instructions\\n\\n" + messages[0].content + "\\n\\n" }}
{%- endif %}
{%- if tools %}
{{- "# Tools\\n\\n## functions\\n\\nnamespace functions {\\n\\n" }}
{%- for t in tools %}
{{- "// " + (t.function.description or "") + "\\ntype " + t.function.name + " = (_: " }}
{{- (t.function.parameters or {}) | tojson + ") => any;\\n\\n" }}
{%- endfor %}
{{- "} // namespace functions" }}
{%- endif %}
{{- "<|end|>" }}
{%- endif %}
{%- set last = namespace(name="") %}
{%- for m in (messages[1:] if system else messages) %}
{%- if m.role == "assistant" and m.tool_calls %}
{%- for c in m.tool_calls %}
{{- "<|start|>assistant to=functions." + c.function.name }}
{{- "<|channel|>commentary json<|message|>" }}
{{- (c.function.arguments if c.function.arguments is string else c.function.arguments | tojson) }}
{{- "<|call|>" }}
{%- set last.name = c.function.name %}
{%- endfor %}
{%- elif m.role == "assistant" %}
{{- "<|start|>assistant<|channel|>final<|message|>" + m.content + "<|end|>" }}
{%- elif m.role == "tool" %}
{{- "<|start|>functions." + last.name + " to=assistant<|channel|>commentary<|message|>" }}
{{- m.content | tojson + "<|end|>" }}
{%- else %}
{{- "<|start|>" + m.role + "<|message|>" + m.content + "<|end|>" }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- "<|start|>assistant" }}
{%- endif %}
"""


class _TemplateRaised(Exception):
    """`raise_exception(msg)` called by the template itself."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@functools.lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text or type(err).__name__


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    try:
        return _environment().from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise ValueError(
            f"chat template does not parse (line {e.lineno}): {_one_line(e)}"
        ) from None


def render_chat(
    messages: list[dict],
    template: str | None,
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    **kwargs: Any,
) -> str:
    """The prompt text for `messages` under `template` (ChatML when None or empty).

    Extra keyword arguments (`tools`, `enable_thinking`, ...) are passed to the template.
    """
    compiled = _compile(template or CHATML_TEMPLATE)
    try:
        return compiled.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
            **kwargs,
        )
    except _TemplateRaised as e:
        raise ValueError(f"chat template refused the conversation: {_one_line(e)}") from None
    except (jinja2.TemplateError, TypeError, KeyError, AttributeError, IndexError) as e:
        raise ValueError(f"chat template failed: {_one_line(e)}") from None
