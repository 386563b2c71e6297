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
