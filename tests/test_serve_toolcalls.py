"""Tool-call and reasoning parsers: unit cases, and properties over random splits of the stream."""

from __future__ import annotations

import json

import pytest

from strata.serve.output import ChatOutput
from strata.serve.reasoning import ReasoningParser, apply_effort, prompt_opens_think
from strata.serve.toolcalls import CLOSE, OPEN, ToolCall, ToolCallParser, parse_all

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _call(name: str, args: dict) -> str:
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': args})}\n{CLOSE}"


def _feed(parser: ToolCallParser, pieces: list[str]) -> list:
    out: list = []
    for p in pieces:
        out += parser.feed(p)
    return _merge(out + parser.finish())


def _merge(events: list) -> list:
    out: list = []
    for e in events:
        if isinstance(e, str) and out and isinstance(out[-1], str):
            out[-1] += e
        elif not (isinstance(e, str) and not e):
            out.append(e)
    return out


def _split(text: str, cuts: list[int]) -> list[str]:
    cuts = sorted({c % (len(text) + 1) for c in cuts})
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


# ---- tool calls: units ----------------------------------------------------------------------


def test_a_call_between_texts_becomes_a_tool_call_with_json_arguments():
    ev = parse_all("before " + _call("get_weather", {"city": "Paris"}) + " after")
    assert ev[0] == "before "
    assert isinstance(ev[1], ToolCall)
    assert ev[1].name == "get_weather" and json.loads(ev[1].arguments) == {"city": "Paris"}
    assert ev[2] == " after"


def test_several_calls_come_out_in_order_with_distinct_ids():
    ev = parse_all(_call("a", {}) + "\n" + _call("b", {"x": [1, 2]}))
    calls = [e for e in ev if isinstance(e, ToolCall)]
    assert [c.name for c in calls] == ["a", "b"]
    assert calls[0].id != calls[1].id and calls[0].id.startswith("call_")


def test_string_arguments_pass_through_and_parameters_is_an_alias():
    (c1,) = parse_all(f'{OPEN}{{"name": "f", "arguments": "{{\\"q\\": 1}}"}}{CLOSE}')
    (c2,) = parse_all(f'{OPEN}{{"name": "g", "parameters": {{"q": 2}}}}{CLOSE}')
    assert c1.arguments == '{"q": 1}' and json.loads(c2.arguments) == {"q": 2}


@pytest.mark.parametrize(
    "body",
    [
        "{not json}",
        '{"arguments": {}}',
        "[1, 2]",
        '{"name": 3}',
        '{"name": "f", "arguments": 5}',
        "",
    ],
)
def test_a_malformed_call_is_delivered_as_content_with_its_tags(body):
    text = f"x {OPEN}{body}{CLOSE} y"
    assert parse_all(text) == [text]


def test_an_unterminated_call_is_delivered_as_content_at_the_end():
    text = 'ok <tool_call>{"name": "f", "argu'
    p = ToolCallParser()
    assert p.feed(text) == ["ok "]  # the call is held while it may still close
    assert p.finish() == ['<tool_call>{"name": "f", "argu']


def test_a_partial_open_tag_at_the_end_is_content():
    assert parse_all("text <tool_ca") == ["text <tool_ca"]


def test_tags_split_at_every_position_still_parse():
    text = "a" + _call("f", {"k": "v"}) + "b"
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1):
            ev = _feed(ToolCallParser(), [text[:i], text[i:j], text[j:]])
            assert [type(e) for e in ev] == [str, ToolCall, str], (i, j)
            assert ev[0] == "a" and ev[2] == "b"


def test_a_call_over_the_byte_cap_is_content_and_the_buffer_stays_bounded():
    cap = 32
    text = "a" + _call("f", {"long": "x" * 100}) + "b"
    p = ToolCallParser(max_call_bytes=cap)
    out = []
    for ch in text:
        out += p.feed(ch)
        assert p.buffered_bytes <= cap + len(CLOSE) - 1
    out = _merge(out + p.finish())
    assert out == [text]  # nothing dropped
    assert p.calls == 0


def test_the_cap_counts_utf8_bytes_not_characters():
    body = json.dumps({"name": "f", "arguments": {"s": "é" * 20}}, ensure_ascii=False)
    assert len(body) <= 60 < len(body.encode())
    assert parse_all(OPEN + body + CLOSE, max_call_bytes=60) == [OPEN + body + CLOSE]
    (call,) = parse_all(OPEN + body + CLOSE, max_call_bytes=len(body.encode()))
    assert json.loads(call.arguments) == {"s": "é" * 20}


# ---- tool calls: properties -----------------------------------------------------------------

_TAGGY = st.text(alphabet='<>/_tolcaé{}":, \nnme', max_size=30)
_PLAIN = st.text(alphabet=st.characters(blacklist_characters="<", codec="utf-8"), max_size=20)
_NAME = st.text(
    alphabet=st.characters(blacklist_characters="<", codec="utf-8"), min_size=1, max_size=8
)
_ARGS = st.dictionaries(_PLAIN, st.integers() | _PLAIN, max_size=3)


@st.composite
def _segments(draw):
    """(kind, text, expected) segments: plain text, valid calls, malformed calls."""
    segs = []
    for _ in range(draw(st.integers(0, 5))):
        kind = draw(st.sampled_from(["text", "call", "bad"]))
        if kind == "text":
            t = draw(_PLAIN)
            segs.append((kind, t, t))
        elif kind == "call":
            name, args = draw(_NAME), draw(_ARGS)
            segs.append((kind, _call(name, args), (name, args)))
        else:
            t = OPEN + draw(_PLAIN.filter(lambda s: not _valid_body(s))) + CLOSE
            segs.append((kind, t, t))
    if draw(st.booleans()):  # an unterminated call at the end
        t = OPEN + draw(_PLAIN)
        segs.append(("bad", t, t))
    return segs


def _valid_body(s: str) -> bool:
    return parse_all(OPEN + s + CLOSE) != [OPEN + s + CLOSE]


@settings(max_examples=300, deadline=None)
@given(_segments(), st.lists(st.integers(0, 10_000), max_size=12))
def test_any_split_gives_the_calls_and_all_other_text(segs, cuts):
    text = "".join(t for _, t, _ in segs)
    ev = _feed(ToolCallParser(), _split(text, cuts))
    calls = [(e.name, json.loads(e.arguments)) for e in ev if isinstance(e, ToolCall)]
    content = "".join(e for e in ev if isinstance(e, str))
    assert calls == [x for k, _, x in segs if k == "call"]
    assert content == "".join(x for k, _, x in segs if k != "call")


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_TAGGY | st.sampled_from([OPEN, CLOSE, _call("f", {"a": 1})]), max_size=8),
    st.lists(st.integers(0, 10_000), max_size=12),
    st.integers(1, 40),
)
def test_splits_never_change_the_result_and_the_buffer_stays_under_the_cap(parts, cuts, cap):
    text = "".join(parts)
    whole = _feed(ToolCallParser(cap), [text])
    p = ToolCallParser(cap)
    out = []
    for piece in _split(text, cuts):
        out += p.feed(piece)
        assert p.buffered_bytes <= cap + len(CLOSE) - 1
    split = _merge(out + p.finish())
    assert [(e.name, e.arguments) if isinstance(e, ToolCall) else e for e in split] == [
        (e.name, e.arguments) if isinstance(e, ToolCall) else e for e in whole
    ]
    # nothing is lost: without calls, the content is the text itself
    if not any(isinstance(e, ToolCall) for e in whole):
        assert "".join(whole) == text


# ---- reasoning --------------------------------------------------------------------------------


def _reason(pieces: list[str], in_reasoning: bool = False) -> tuple[str, str]:
    p = ReasoningParser(in_reasoning)
    parts = [x for piece in pieces for x in p.feed(piece)] + p.finish()
    return (
        "".join(t for k, t in parts if k == "reasoning"),
        "".join(t for k, t in parts if k == "content"),
    )


def test_think_block_goes_to_reasoning_and_the_rest_to_content():
    assert _reason(["<think>\nplan it\n</think>\n\nThe answer."]) == ("plan it", "The answer.")


def test_text_without_a_think_block_is_content_unchanged():
    assert _reason(["  Hello <think> there"]) == ("", "  Hello <think> there")


def test_a_prompt_that_opens_think_starts_the_output_in_reasoning():
    assert prompt_opens_think("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_think("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert _reason(["step 1</think>answer"], in_reasoning=True) == ("step 1", "answer")


def test_an_unclosed_think_block_is_reasoning():
    assert _reason(["<think>still thinking"]) == ("still thinking", "")


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet="ab \n", max_size=10),
    st.text(alphabet="ab<>/ \n", max_size=15),
    st.text(alphabet="ab \n<", max_size=10),
    st.booleans(),
    st.lists(st.integers(0, 1000), max_size=10),
)
def test_reasoning_split_does_not_depend_on_where_the_stream_is_cut(
    lead, think, answer, close, cuts
):
    text = lead.replace("a", "").replace("b", "") + "<think>" + think  # no `</think>` in think
    text += ("</think>" + answer) if close else ""
    whole = _reason([text])
    assert _reason(_split(text, cuts)) == whole
    assert whole[0] == think.strip()
    assert whole[1] == (answer.lstrip() if close else "")


# ---- the chat output pipeline -----------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 1000), max_size=10))
def test_streamed_deltas_sum_to_the_non_streamed_message(cuts):
    text = "<think>\nhmm\n</think>\n\nSure." + _call("f", {"a": 1}) + "\n"
    out = ChatOutput(tools=True)
    deltas = [d for piece in _split(text, cuts) for d in out.feed(piece)] + out.finish()
    msg = out.message()
    assert "".join(d.get("reasoning_content", "") for d in deltas) == msg["reasoning_content"]
    assert "".join(d.get("content", "") for d in deltas) == msg["content"] == "Sure."
    assert [d["tool_calls"][0]["function"]["name"] for d in deltas if "tool_calls" in d] == ["f"]
    assert out.finish_reason("stop") == "tool_calls"


def test_without_tools_tool_call_text_is_plain_content():
    out = ChatOutput(tools=False)
    text = _call("f", {})
    out.feed(text)
    out.finish()
    assert out.message() == {"role": "assistant", "content": text}


def test_effort_none_turns_thinking_off_through_the_template_or_the_soft_switch():
    msgs = [{"role": "user", "content": "hi"}]
    assert apply_effort(msgs, "{{ enable_thinking }}", "none") == (
        msgs,
        {"reasoning_effort": "none", "enable_thinking": False},
    )
    m2, kw = apply_effort(msgs, "...<think>...", "none")
    assert m2[-1]["content"] == "hi /no_think" and "enable_thinking" not in kw
    assert apply_effort(msgs, "{{ x }}", "high") == (msgs, {"reasoning_effort": "high"})
    assert apply_effort(msgs, "{{ enable_thinking }}", None) == (msgs, {})
