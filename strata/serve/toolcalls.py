"""Tool calls: `<tool_call>{json}</tool_call>` parsed out of generated text, incrementally.

The format is the one Qwen (Hermes-style) chat templates teach the model: a JSON object with
`name` and `arguments` between the tags. `ToolCallParser` takes text in pieces of any size and
returns content text and `ToolCall`s; the result does not depend on where the pieces were cut.

It is bounded: a call whose body (the bytes between the tags) passes `max_call_bytes` is not a
call. Its opening tag and the first `max_call_bytes` bytes of the body are given back as content
and scanning resumes from there, so the parser never holds more than `max_call_bytes` plus a
closing tag. Bodies that are not a JSON object with a string `name` (malformed calls), and a call
still open when the text ends, are given back as content too, tags included: text is never dropped.

`tools_system_prompt` is the fallback for chat templates that do not render `tools` themselves.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
DEFAULT_MAX_CALL_BYTES = 64 * 1024


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text of the arguments object, as OpenAI sends it
    id: str = field(default_factory=new_call_id, compare=False)

    def to_openai(self, index: int | None = None) -> dict:
        d = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        return d if index is None else {"index": index, **d}


# What `feed` and `finish` return, in order: content text (str) and calls.
Event = str | ToolCall


def parse_call(body: str) -> ToolCall | None:
    """The call a tag body stands for, or None when it is not a well-formed call."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        return ToolCall(obj["name"], args)
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


def _partial_tag(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def _utf8_len(s: str) -> int:
    return len(s.encode("utf-8", "surrogatepass"))


def _cut_bytes(s: str, limit: int) -> int:
    """The largest char index c with utf8 length of s[:c] <= limit."""
    b = s.encode("utf-8", "surrogatepass")[:limit]
    return len(b.decode("utf-8", "ignore"))


class ToolCallParser:
    def __init__(self, max_call_bytes: int = DEFAULT_MAX_CALL_BYTES) -> None:
        if max_call_bytes < 1:
            raise ValueError(f"max_call_bytes must be >= 1, got {max_call_bytes}")
        self.max_call_bytes = max_call_bytes
        self._hold = ""  # content mode: a possible partial OPEN at the end of the text so far
        self._call: str | None = None  # call mode: the body since OPEN
        self._call_bytes = 0
        self.calls = 0  # calls delivered so far

    @property
    def buffered_bytes(self) -> int:
        """Bytes held back right now (never more than max_call_bytes + len(CLOSE) - 1)."""
        return _utf8_len(self._hold) + self._call_bytes

    def feed(self, text: str) -> list[Event]:
        out: list[Event] = []
        while text:
            if self._call is None:
                text = self._feed_content(text, out)
            else:
                text = self._feed_call(text, out)
        return _merge(out)

    def finish(self) -> list[Event]:
        """End of text: whatever is held is content (an unterminated call with its tag)."""
        out: list[Event] = []
        if self._call is not None:
            out.append(OPEN + self._call)
            self._call, self._call_bytes = None, 0
        if self._hold:
            out.append(self._hold)
            self._hold = ""
        return _merge([e for e in out if e])

    def _feed_content(self, text: str, out: list[Event]) -> str:
        buf = self._hold + text
        i = buf.find(OPEN)
        if i < 0:
            keep = _partial_tag(buf, OPEN)
            out.append(buf[: len(buf) - keep])
            self._hold = buf[len(buf) - keep :]
            return ""
        out.append(buf[:i])
        self._hold = ""
        self._call, self._call_bytes = "", 0
        return buf[i + len(OPEN) :]

    def _feed_call(self, text: str, out: list[Event]) -> str:
        assert self._call is not None
        prev = self._call
        buf = prev + text
        j = buf.find(CLOSE, max(0, len(prev) - len(CLOSE) + 1))
        limit = self.max_call_bytes
        if j >= 0 and _utf8_len(buf[:j]) <= limit:
            body, rest = buf[:j], buf[j + len(CLOSE) :]
            call = parse_call(body.strip())
            out.append(call if call is not None else OPEN + body + CLOSE)
            self.calls += call is not None
            self._call, self._call_bytes = None, 0
            return rest
        size = self._call_bytes + _utf8_len(text)
        if j >= 0 or size >= limit + len(CLOSE):
            # No CLOSE can start within the first `limit` body bytes any more: not a call.
            c = _cut_bytes(buf, limit)
            out.append(OPEN + buf[:c])
            self._call, self._call_bytes = None, 0
            return buf[c:]
        self._call, self._call_bytes = buf, size
        return ""


def _merge(events: list[Event]) -> list[Event]:
    """Adjacent content pieces joined, empty ones dropped."""
    out: list[Event] = []
    for e in events:
        if isinstance(e, str):
            if not e:
                continue
            if out and isinstance(out[-1], str):
                out[-1] += e
                continue
        out.append(e)
    return out


def parse_all(text: str, max_call_bytes: int = DEFAULT_MAX_CALL_BYTES) -> list[Event]:
    p = ToolCallParser(max_call_bytes)
    return _merge(p.feed(text) + p.finish())


def tools_system_prompt(tools: list[dict]) -> str:
    """Hermes-style tool instructions, for templates that ignore the `tools` variable."""
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        f"{OPEN}{CLOSE} XML tags:\n"
        f'{OPEN}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n{CLOSE}'
    )
