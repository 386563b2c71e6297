"""The harmony format (gpt-oss): channels and tool calls parsed out of generated text as it comes.

A harmony conversation is a sequence of messages (openai/harmony; llama.cpp's
common/parsers/gpt-oss.cpp parses the same grammar):

    <|start|>ROLE[ to=TO]<|channel|>CHANNEL[ to=TO][ [<|constrain|>]TYPE]<|message|>BODY END
    TO = the recipient; END = <|end|> (another message follows) | <|return|> | <|call|> (the
    generation ends)

The prompt ends with `<|start|>assistant`, so generated text begins inside the first header.
`<|return|>` and `<|call|>` end generation, so they are usually absent from the text: the text's
end closes the last message. What each message becomes:

- `analysis` channel: reasoning (`reasoning_content`);
- `final` channel, `commentary` without a recipient (a preamble), no channel or an unknown one:
  content;
- recipient `functions.NAME` (on any channel), when the request has tools: a tool call whose
  arguments are the body, a JSON object. Only a call's body is held (until its message ends),
  at most `max_call_bytes`; a longer one, one that is not a JSON object, and any message to
  another recipient (`python`, `browser.search`, ...; `to=assistant` is no recipient) are given
  back as content with their header, so text is never dropped. Other bodies stream as they come.

Fallbacks, never an exception: a header that is malformed (a character no header has, longer
than `MAX_HEADER_CHARS`, or cut short by the end of the text) is content, tags included; text
between messages is content (whitespace there is dropped); a `<|start|>` or `<|channel|>` inside a
body ends that message and begins the next (the model skipped `<|end|>`); an analysis message
still open when the text ends stays reasoning. Consecutive messages of one kind are joined with a
newline. The result does not depend on where the pieces were cut, and the parser never holds more
than a partial tag, one header and one call body.
"""

from __future__ import annotations

import json
import re
from typing import Any

from strata.serve.toolcalls import DEFAULT_MAX_CALL_BYTES, ToolCall

START, END, MESSAGE = "<|start|>", "<|end|>", "<|message|>"
CHANNEL, CONSTRAIN, RETURN, CALL = "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"
TAGS = (START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL)
_LONGEST_TAG = max(map(len, TAGS))
GENERATION_PROMPT = START + "assistant"
EFFORTS = ("low", "medium", "high")  # what gpt-oss knows (its system message's `Reasoning:`)
MAX_HEADER_CHARS = 256
_HEADER_TEXT = re.compile(r"[\w.:=/\- ]*")  # roles, recipients, channels, content types
_RECIPIENT = re.compile(r"(?:^|[\s>])to=([^\s<]+)")
_CHANNEL_NAME = re.compile(re.escape(CHANNEL) + r"\s*([^\s<]*)")

# What `feed` and `finish` return, in order: (kind, text) with kind "reasoning" or "content", and
# tool calls.
Event = tuple[str, str] | ToolCall


def uses_harmony(template: str | None, arch: str | None = None) -> bool:
    """Whether a model speaks harmony: its chat template has channels, or it is gpt-oss."""
    return CHANNEL in (template or "") or arch == "gpt-oss"


def harmony_effort(effort: str | None) -> str:
    """Strata's effort levels on gpt-oss's three: off-ish is low, xhigh is high, unset medium."""
    if effort in ("none", "minimal", "low"):
        return "low"
    if effort in ("high", "xhigh"):
        return "high"
    return "medium"


def template_messages(messages: list[dict]) -> list[dict]:
    """Messages as the gpt-oss template reads them: earlier reasoning in `thinking`, and no
    content beside it in a tool-call turn (the template refuses both; llama.cpp does the same)."""
    out = []
    for m in messages:
        if isinstance(m.get("reasoning_content"), str):
            m = {**m, "thinking": m["reasoning_content"]}
            if m.get("tool_calls"):
                m.pop("content", None)
        out.append(m)
    return out


def template_tools(tools: list[dict]) -> list[dict]:
    """Tools with a description, which the gpt-oss template concatenates unconditionally."""
    out = []
    for t in tools:
        fn = t.get("function") or {}
        if not isinstance(fn.get("description"), str):
            t = {**t, "function": {**fn, "description": ""}}
        out.append(t)
    return out


class _Lexer:
    """Text pieces to ("tag", tag) and ("text", text) tokens; a partial tag at the end is held."""

    def __init__(self) -> None:
        self.hold = ""

    def feed(self, text: str) -> list[tuple[str, str]]:
        buf, self.hold = self.hold + text, ""
        out: list[tuple[str, str]] = []
        pos = 0
        while True:
            i = buf.find("<|", pos)
            if i < 0:
                keep = 1 if buf.endswith("<") else 0
                _text(out, buf[pos : len(buf) - keep])
                self.hold = buf[len(buf) - keep :]
                return out
            tag = next((t for t in TAGS if buf.startswith(t, i)), None)
            if tag is not None:
                _text(out, buf[pos:i])
                out.append(("tag", tag))
                pos = i + len(tag)
            elif len(buf) - i < _LONGEST_TAG and any(t.startswith(buf[i:]) for t in TAGS):
                # a tag cut by the piece's end
                _text(out, buf[pos:i])
                self.hold = buf[i:]
                return out
            else:
                _text(out, buf[pos : i + 2])
                pos = i + 2

    def finish(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        _text(out, self.hold)
        self.hold = ""
        return out


def _text(out: list[tuple[str, str]], s: str) -> None:
    if s:
        out.append(("text", s))


_HEADER, _BODY, _BETWEEN = range(3)


class HarmonyParser:
    """Harmony text to reasoning, content and tool calls; `feed` any pieces, then `finish` once.

    `in_header`: the prompt ends with `<|start|>assistant` (the text starts in a header).
    `tools`: whether messages to `functions.NAME` are tool calls (the request has tools).
    """

    def __init__(
        self,
        *,
        in_header: bool = True,
        tools: bool = True,
        max_call_bytes: int = DEFAULT_MAX_CALL_BYTES,
    ) -> None:
        if max_call_bytes < 1:
            raise ValueError(f"max_call_bytes must be >= 1, got {max_call_bytes}")
        self.tools, self.max_call_bytes = tools, max_call_bytes
        self._lex = _Lexer()
        self._state = _HEADER if in_header else _BETWEEN
        self._opener = ""  # the tag that opened the current header ("" for the prompt's)
        self._head = ""  # header text so far, tags included
        self._kind = ""  # body: "reasoning", "content", "call" or "raw" (content with header)
        self._name = ""  # body "call": the function's name
        self._call = ""  # body "call": the arguments so far
        self._call_bytes = 0
        self._stray = False  # between messages: text seen since the last message (no lstrip)
        self._said: set[str] = set()  # kinds that have had text (for the newline between)
        self._sep = False  # the current message still owes its separating newline
        self.calls = 0

    @property
    def buffered_bytes(self) -> int:
        """Bytes held back now: a partial tag, a header, a call body (each bounded)."""
        return _utf8_len(self._lex.hold) + _utf8_len(self._opener + self._head) + self._call_bytes

    def feed(self, text: str) -> list[Event]:
        out: list[Event] = []
        for kind, value in self._lex.feed(text):
            self._token(kind, value, out)
        return _merge(out)

    def finish(self) -> list[Event]:
        out: list[Event] = []
        for kind, value in self._lex.finish():
            self._token(kind, value, out)
        if self._state == _HEADER:
            self._put(out, "content", self._opener + self._head)
        elif self._state == _BODY:
            self._end_body("", out)
        self._state, self._opener, self._head = _BETWEEN, "", ""
        return _merge(out)

    # ---- the state machine -------------------------------------------------------------------

    def _token(self, kind: str, value: str, out: list[Event]) -> None:
        if self._state == _HEADER:
            self._header_token(kind, value, out)
        elif self._state == _BODY:
            self._body_token(kind, value, out)
        elif kind == "tag" and value in (START, CHANNEL):
            self._open(value)
        else:  # text between messages
            if not self._stray:
                value = value.lstrip()
                if value and "content" in self._said:
                    value = "\n" + value  # a new run of content, as a new message is
            if value:
                self._stray = True
                self._put(out, "content", value)

    def _open(self, tag: str) -> None:
        """A header begins at `tag`: after `<|start|>`, or straight at a `<|channel|>`."""
        self._state = _HEADER
        self._opener, self._head = (START, "") if tag == START else ("", tag)

    def _header_token(self, kind: str, value: str, out: list[Event]) -> None:
        if kind == "tag" and value == MESSAGE:
            self._begin_body(out)
            return
        if not self._head:
            if kind == "tag" and value == START:
                self._opener = START  # `<|start|>` again (or after the prompt's): no header yet
                return
            value = value.lstrip() if kind == "text" else value  # whitespace before a header
            if not value:
                return
        ok = (
            value in (CHANNEL, CONSTRAIN)
            if kind == "tag"
            else _HEADER_TEXT.fullmatch(value) is not None
        )
        if ok and len(self._opener) + len(self._head) + len(value) <= MAX_HEADER_CHARS:
            self._head += value
            return
        # not a header: what we held is content; `<|start|>`/`<|channel|>` may begin a real one
        raw = self._opener + self._head
        self._state, self._opener, self._head = _BETWEEN, "", ""
        self._stray = True
        if kind == "tag" and value in (START, CHANNEL):
            self._put(out, "content", raw)
            self._open(value)
        else:
            self._put(out, "content", raw + value)

    def _begin_body(self, out: list[Event]) -> None:
        head = self._head
        recipients = [r for r in _RECIPIENT.findall(head) if r != "assistant"]
        channels = _CHANNEL_NAME.findall(head)
        channel = channels[-1] if channels else None
        self._state, self._call, self._call_bytes = _BODY, "", 0
        if recipients:
            to = recipients[-1]
            name = to.removeprefix("functions.")
            if self.tools and to.startswith("functions.") and name:
                self._kind, self._name = "call", name
            else:
                self._kind = "raw"
                self._put(out, "content", self._opener + head + MESSAGE)
        else:
            self._kind = "reasoning" if channel == "analysis" else "content"
            self._sep = self._kind in self._said
        if self._kind != "call":  # a call keeps its header for the fallback
            self._opener, self._head = "", ""

    def _body_token(self, kind: str, value: str, out: list[Event]) -> None:
        if kind == "tag" and value in (END, RETURN, CALL):
            self._end_body(value, out)
            self._state, self._opener, self._head, self._stray = _BETWEEN, "", "", False
        elif kind == "tag" and value in (START, CHANNEL):
            self._end_body("", out)  # the model skipped `<|end|>`
            self._stray = False
            self._open(value)
        elif self._kind == "call":
            self._call += value
            self._call_bytes += _utf8_len(value)
            if self._call_bytes > self.max_call_bytes:  # not a call: content from here on
                self._put(out, "content", self._opener + self._head + MESSAGE + self._call)
                self._kind, self._call, self._call_bytes = "raw", "", 0
                self._opener, self._head = "", ""
        else:
            self._body_text(value, out)

    def _body_text(self, text: str, out: list[Event]) -> None:
        kind = "content" if self._kind == "raw" else self._kind
        if self._sep:
            self._put(out, kind, "\n")
            self._sep = False
        self._put(out, kind, text)

    def _end_body(self, tag: str, out: list[Event]) -> None:
        if self._kind == "call":
            call = _parse_arguments(self._name, self._call)
            if call is None:
                raw = self._opener + self._head + MESSAGE + self._call + tag
                self._put(out, "content", raw)
            else:
                out.append(call)
                self.calls += 1
        elif self._kind == "raw":
            self._put(out, "content", tag)
        self._call, self._call_bytes = "", 0

    def _put(self, out: list[Event], kind: str, text: str) -> None:
        if text:
            self._said.add(kind)
            out.append((kind, text))


def _parse_arguments(name: str, body: str) -> ToolCall | None:
    """The call a body stands for: its arguments must be a JSON object."""
    try:
        args: Any = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(args, dict):
        return None
    return ToolCall(name, json.dumps(args, ensure_ascii=False))


def _utf8_len(s: str) -> int:
    return len(s.encode("utf-8", "surrogatepass"))


def _merge(events: list[Event]) -> list[Event]:
    """Adjacent pieces of one kind joined."""
    out: list[Event] = []
    for e in events:
        if isinstance(e, tuple) and out and isinstance(out[-1], tuple) and out[-1][0] == e[0]:
            out[-1] = (e[0], out[-1][1] + e[1])
        else:
            out.append(e)
    return out


def parse_all(text: str, **kw: Any) -> list[Event]:
    p = HarmonyParser(**kw)
    return _merge(p.feed(text) + p.finish())
