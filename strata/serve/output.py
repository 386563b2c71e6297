"""Generated text to OpenAI chat deltas: reasoning split first, then tool calls in the content.

For a harmony model (gpt-oss) one parser does both: `harmony.HarmonyParser` splits the channels
and the tool calls at once.

`ChatOutput.feed(piece)` returns the deltas a streaming response sends for that piece
(`{"reasoning_content": ...}`, `{"content": ...}`, `{"tool_calls": [...]}`); `finish()` returns
what was held back. A non-streaming response is the same deltas summed (`message()`), so both
paths give identical text. Trailing whitespace of the content is held until more content
follows: whitespace next to a tool call is formatting, not answer, and is dropped.
"""

from __future__ import annotations

import json
from typing import Any

from strata.serve.harmony import HarmonyParser
from strata.serve.reasoning import ReasoningParser
from strata.serve.toolcalls import DEFAULT_MAX_CALL_BYTES, ToolCall, ToolCallParser


class ChatOutput:
    def __init__(
        self,
        *,
        in_reasoning: bool = False,
        tools: bool = False,
        max_call_bytes: int = DEFAULT_MAX_CALL_BYTES,
        harmony: bool = False,
        in_header: bool = True,
    ) -> None:
        """`harmony`: the text is harmony (`in_header`: the prompt opened its first header)."""
        self._split: HarmonyParser | ReasoningParser = (
            HarmonyParser(in_header=in_header, tools=tools, max_call_bytes=max_call_bytes)
            if harmony
            else ReasoningParser(in_reasoning)
        )
        self._tools = ToolCallParser(max_call_bytes) if tools and not harmony else None
        self._ws = ""  # whitespace-only content held back
        self.reasoning: list[str] = []
        self.content: list[str] = []
        self.tool_calls: list[ToolCall] = []

    def feed(self, piece: str) -> list[dict]:
        return self._route(self._split.feed(piece), final=False)

    def finish(self) -> list[dict]:
        return self._route(self._split.finish(), final=True)

    def _route(self, parts: list[tuple[str, str] | ToolCall], final: bool) -> list[dict]:
        out: list[dict] = []
        for part in parts:
            if isinstance(part, ToolCall):
                self._event(part, out)
                continue
            kind, text = part
            if kind == "reasoning":
                self.reasoning.append(text)
                out.append({"reasoning_content": text})
            elif self._tools is None:
                self._content(text, out)
            else:
                for ev in self._tools.feed(text):
                    self._event(ev, out)
        if final:
            if self._tools is not None:
                for ev in self._tools.finish():
                    self._event(ev, out)
            if self._ws and not self.tool_calls:
                self.content.append(self._ws)
                out.append({"content": self._ws})
            self._ws = ""
        return out

    def _event(self, ev: str | ToolCall, out: list[dict]) -> None:
        if isinstance(ev, str):
            self._content(ev, out)
            return
        self._ws = ""
        index = len(self.tool_calls)
        self.tool_calls.append(ev)
        out.append({"tool_calls": [ev.to_openai(index)]})

    def _content(self, text: str, out: list[dict]) -> None:
        body = text.rstrip()
        if not body:
            self._ws += text
            return
        text, self._ws = self._ws + body, text[len(body) :]
        self.content.append(text)
        out.append({"content": text})

    def message(self) -> dict[str, Any]:
        """The assistant message of a non-streaming response."""
        content = "".join(self.content)
        msg: dict[str, Any] = {
            "role": "assistant",
            "content": None if self.tool_calls and not content else content,
        }
        if self.reasoning:
            msg["reasoning_content"] = "".join(self.reasoning)
        if self.tool_calls:
            msg["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        return msg

    def finish_reason(self, engine_reason: str | None) -> str | None:
        if self.tool_calls and engine_reason == "stop":
            return "tool_calls"
        return engine_reason


def sse(obj: Any) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


SSE_DONE = "data: [DONE]\n\n"
