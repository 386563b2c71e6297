"""Chat messages to prompt text through the model's chat template (ChatML when it has none).

Tools are rendered by the template when it knows the `tools` variable; for templates that do
not, a Hermes-style tools block (the one Qwen templates use) is added to the system message and
earlier assistant tool calls are written back as `<tool_call>` text, so the model sees the same
conversation either way. Reasoning effort goes through `reasoning.apply_effort`.

Harmony models (gpt-oss) take tools, earlier reasoning (as `thinking`) and the effort (as
`reasoning_effort`: low, medium or high) through their own template;
`chat_template.HARMONY_TEMPLATE` stands in when the GGUF has none.
"""

from __future__ import annotations

import json

from strata.model.chat_template import CHATML_TEMPLATE, HARMONY_TEMPLATE, render_chat
from strata.serve import harmony as hm
from strata.serve.reasoning import apply_effort
from strata.serve.toolcalls import CLOSE, OPEN, tools_system_prompt


def _inline_tool_calls(messages: list[dict]) -> list[dict]:
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if m["role"] == "assistant" and calls:
            text = "".join(
                f"\n{OPEN}\n"
                + json.dumps(
                    {"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
                    ensure_ascii=False,
                )
                + f"\n{CLOSE}"
                for c in calls
            )
            m = {k: v for k, v in m.items() if k != "tool_calls"}
            m["content"] = (m.get("content") or "") + text
        out.append(m)
    return out


def _with_tools_system(messages: list[dict], tools: list[dict]) -> list[dict]:
    block = tools_system_prompt(tools)
    if messages and messages[0]["role"] == "system":
        first = dict(messages[0])
        first["content"] = f"{first['content']}\n\n{block}" if first["content"] else block
        return [first, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]


def render_prompt(
    messages: list[dict],
    template: str | None,
    *,
    tools: list[dict] | None = None,
    effort: str | None = None,
    bos_token: str = "",
    eos_token: str = "",
    harmony: bool = False,
) -> str:
    """Prompt text for a chat request; ValueError (one line) when the template refuses it.

    `harmony`: the model speaks harmony (`harmony.uses_harmony`, decided once per model)."""
    specials = {"bos_token": bos_token, "eos_token": eos_token}
    if harmony:
        kw: dict = {"reasoning_effort": hm.harmony_effort(effort)}
        if tools:
            kw["tools"] = hm.template_tools(tools)
        messages = hm.template_messages(messages)
        template = template or HARMONY_TEMPLATE
        return render_chat(messages, template, add_generation_prompt=True, **specials, **kw)
    template = template or CHATML_TEMPLATE
    kwargs = {}
    if "tool_calls" not in template:
        messages = _inline_tool_calls(messages)
    if tools:
        if "tools" in template.replace("tool_calls", ""):
            kwargs["tools"] = tools
        else:
            messages = _with_tools_system(messages, tools)
    messages, effort_kwargs = apply_effort(messages, template, effort)
    kwargs.update(effort_kwargs)
    return render_chat(messages, template, add_generation_prompt=True, **specials, **kwargs)
