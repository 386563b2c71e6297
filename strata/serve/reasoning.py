"""Reasoning: `<think>…</think>` split out of the output; how reasoning effort reaches the model.

Output. Qwen3-style models write their reasoning between `<think>` and `</think>` before the
answer. `ReasoningParser` turns generated text, in pieces of any size, into ("reasoning", text)
and ("content", text) pieces; the chat server sends the first kind as `reasoning_content` (as
deltas when streaming). Whitespace around the reasoning (the newlines after `<think>`, before and
after `</think>`) belongs to neither. When the prompt already ends inside `<think>` (templates that
open the block themselves), the parser starts in reasoning. Text that never opens a think block
is content, unchanged; a block still open when generation stops is reasoning.

Effort. Effort is one of `EFFORTS`: the deployment default comes from `strata serve
--reasoning-effort` (or `STRATA_REASONING_EFFORT`), a request's `reasoning_effort` overrides it,
and with neither the template's own default applies (Qwen3: thinking on). What we chose:

- The effort string is always passed to the chat template as `reasoning_effort` (templates that
  grade effort, such as gpt-oss's, read it).
- `none` and `minimal` turn thinking off; `low`, `medium`, `high` and `xhigh` turn it on. Qwen3
  thinks or does not; it has no graded budget, so the three "on" levels behave the same.
- On/off reaches the template as `enable_thinking=False/True` when the template mentions
  `enable_thinking` (Qwen3's templates, and the embedded model's, then pre-fill an empty
  `<think>\\n\\n</think>` when off). A template that knows `<think>` but not `enable_thinking`
  gets Qwen3's soft switch instead: ` /no_think` (or ` /think`) appended to the last user
  message. A template that knows neither is left alone: effort then only reaches it as
  `reasoning_effort`.
"""

from __future__ import annotations

from typing import Any

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
_OFF = frozenset({"none", "minimal"})
_MAX_LEADING = 64  # chars of leading whitespace we wait through for a `<think>`


def check_effort(effort: str | None) -> str | None:
    """`effort` itself if it is a known level (or None); ValueError otherwise."""
    if effort is None or effort in EFFORTS:
        return effort
    raise ValueError(f"reasoning effort must be one of {', '.join(EFFORTS)}; got {effort!r}")


def thinking_enabled(effort: str | None) -> bool | None:
    """True/False for a given effort, None when nothing was asked (template default)."""
    return None if effort is None else effort not in _OFF


def apply_effort(
    messages: list[dict], template: str, effort: str | None
) -> tuple[list[dict], dict[str, Any]]:
    """Messages (maybe with a soft switch) and template kwargs that carry `effort`."""
    if effort is None:
        return messages, {}
    on = thinking_enabled(effort)
    kwargs: dict[str, Any] = {"reasoning_effort": effort}
    if "enable_thinking" in template:
        kwargs["enable_thinking"] = on
    elif THINK_OPEN in template or THINK_CLOSE in template:
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        if users:
            i = users[-1]
            m = dict(messages[i])
            m["content"] = f"{m.get('content') or ''} {'/think' if on else '/no_think'}"
            messages = [*messages[:i], m, *messages[i + 1 :]]
    return messages, kwargs


def prompt_opens_think(prompt: str) -> bool:
    """Whether the rendered prompt leaves the model inside an open `<think>` block."""
    i = prompt.rfind(THINK_OPEN)
    return i >= 0 and THINK_CLOSE not in prompt[i:]


def _partial(text: str, tag: str) -> int:
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


_START, _THINK_LEAD, _THINK, _ANSWER_LEAD, _ANSWER = range(5)


class ReasoningParser:
    """Splits text into reasoning and content; `feed` any pieces, then `finish` once."""

    def __init__(self, in_reasoning: bool = False) -> None:
        self._state = _THINK_LEAD if in_reasoning else _START
        self._buf = ""  # held text: see each state below

    def feed(self, text: str) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        buf = self._buf + text
        self._buf = ""
        while buf:
            st = self._state
            if st == _START:  # leading whitespace, maybe a partial `<think>`
                s = buf.lstrip()
                if s.startswith(THINK_OPEN):
                    self._state, buf = _THINK_LEAD, s[len(THINK_OPEN) :]
                elif THINK_OPEN.startswith(s) and len(buf) <= _MAX_LEADING:
                    self._buf, buf = buf, ""
                else:
                    self._state = _ANSWER
            elif st == _THINK_LEAD or st == _ANSWER_LEAD:  # whitespace dropped
                buf = buf.lstrip()
                if buf:
                    self._state = _THINK if st == _THINK_LEAD else _ANSWER
            elif st == _THINK:  # reasoning; trailing whitespace and a partial `</think>` held
                i = buf.find(THINK_CLOSE)
                if i >= 0:
                    _put(out, "reasoning", buf[:i].rstrip())
                    self._state, buf = _ANSWER_LEAD, buf[i + len(THINK_CLOSE) :]
                    continue
                keep = _partial(buf, THINK_CLOSE)
                body = buf[: len(buf) - keep]
                ws = len(body) - len(body.rstrip())
                _put(out, "reasoning", body[: len(body) - ws])
                self._buf, buf = buf[len(body) - ws :], ""
            else:
                _put(out, "content", buf)
                buf = ""
        return out

    def finish(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        buf, self._buf = self._buf, ""
        if self._state == _START:
            _put(out, "content", buf)
        elif self._state == _THINK:
            _put(out, "reasoning", buf.rstrip())
        return out


def _put(out: list[tuple[str, str]], kind: str, text: str) -> None:
    if not text:
        return
    if out and out[-1][0] == kind:
        out[-1] = (kind, out[-1][1] + text)
    else:
        out.append((kind, text))
