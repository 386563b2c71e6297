"""The harmony parser (gpt-oss): units, the same result at every split of a stream, bounds, and the
prompt side (effort, tools, earlier reasoning) through gpt-oss's own chat template.

`fixtures/gpt-oss.jinja` is the chat template gpt-oss GGUFs carry (llama.cpp's
models/templates/openai-gpt-oss-120b.jinja, from OpenAI's gpt-oss release).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from strata.model.chat_template import HARMONY_TEMPLATE
from strata.serve.harmony import (
    MAX_HEADER_CHARS,
    HarmonyParser,
    harmony_effort,
    parse_all,
    uses_harmony,
)
from strata.serve.output import ChatOutput
from strata.serve.prompt import render_prompt
from strata.serve.toolcalls import ToolCall

GPT_OSS_TEMPLATE = (Path(__file__).parent / "fixtures" / "gpt-oss.jinja").read_text()

ANSWER = (
    "<|channel|>analysis<|message|>The user says hi. Answer briefly.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?"
)
CALL = (
    "<|channel|>analysis<|message|>Need the weather tool.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris", "unit": "°C"}'
)
CALL_IN_ROLE = (
    "<|channel|>analysis<|message|>Need it.<|end|>"
    "<|start|>assistant to=functions.get_weather<|channel|>commentary json"
    '<|message|>{"city":"Paris"}<|call|>'
)
PREAMBLE = (
    "<|channel|>analysis<|message|>Plan: look it up.<|end|>"
    "<|start|>assistant<|channel|>commentary<|message|>Checking the weather now.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris"}<|call|>'
)
TWO_THOUGHTS = (
    "<|channel|>analysis<|message|>First thought.<|end|>"
    "<|start|>assistant<|channel|>analysis<|message|>Second thought.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Done.<|return|>"
)
STRAY = (  # gpt-oss-20b sometimes prefixes a channel with a stray commentary one
    "<|channel|>commentary to=assistant<|channel|>analysis<|message|>Hm.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Yes."
)
TRANSCRIPTS = [ANSWER, CALL, CALL_IN_ROLE, PREAMBLE, TWO_THOUGHTS, STRAY]


def _weather(args: dict) -> ToolCall:
    return ToolCall("get_weather", json.dumps(args, ensure_ascii=False))


def _feed(pieces: list[str], **kw) -> list:
    p = HarmonyParser(**kw)
    out: list = []
    for piece in pieces:
        out += p.feed(piece)
    return _merge(out + p.finish())


def _merge(events: list) -> list:
    out: list = []
    for e in events:
        if isinstance(e, tuple) and out and isinstance(out[-1], tuple) and out[-1][0] == e[0]:
            out[-1] = (e[0], out[-1][1] + e[1])
        else:
            out.append(e)
    return out


# ---- units --------------------------------------------------------------------------------------


def test_analysis_is_reasoning_and_final_is_content():
    assert parse_all(ANSWER) == [
        ("reasoning", "The user says hi. Answer briefly."),
        ("content", "Hello! How can I help?"),
    ]


@pytest.mark.parametrize("text", [CALL, CALL_IN_ROLE])
def test_a_call_to_functions_becomes_a_tool_call_with_the_recipient_in_either_header(text):
    ev = parse_all(text)
    assert ev[0][0] == "reasoning" and len(ev) == 2
    call = ev[1]
    assert isinstance(call, ToolCall) and call.name == "get_weather"
    assert json.loads(call.arguments)["city"] == "Paris"
    assert call.id.startswith("call_")
    assert "°C" in parse_all(CALL)[1].arguments  # non-ASCII kept as text


def test_a_preamble_on_commentary_is_content_before_the_call():
    assert parse_all(PREAMBLE) == [
        ("reasoning", "Plan: look it up."),
        ("content", "Checking the weather now."),
        _weather({"city": "Paris"}),
    ]


def test_consecutive_analysis_messages_are_joined_by_a_newline():
    assert parse_all(TWO_THOUGHTS) == [
        ("reasoning", "First thought.\nSecond thought."),
        ("content", "Done."),
    ]


def test_a_stray_commentary_prefix_does_not_hide_the_analysis():
    assert parse_all(STRAY) == [("reasoning", "Hm."), ("content", "Yes.")]


def test_a_prompt_without_the_generation_header_starts_between_messages():
    text = "<|start|>assistant<|channel|>final<|message|>Hi"
    assert parse_all(text, in_header=False) == [("content", "Hi")]
    assert parse_all(text, in_header=True) == [("content", "Hi")]


def test_plain_text_that_is_not_harmony_is_content_unchanged():
    assert parse_all("Hello there, no channels here!") == [
        ("content", "Hello there, no channels here!")
    ]
    assert parse_all("Hello") == [("content", "Hello")]


# ---- fallbacks ----------------------------------------------------------------------------------


def test_unterminated_analysis_stays_reasoning_and_a_missing_final_means_no_content():
    assert parse_all("<|channel|>analysis<|message|>Still thinking about") == [
        ("reasoning", "Still thinking about")
    ]
    assert parse_all("<|channel|>analysis<|message|>Thought.<|end|>") == [("reasoning", "Thought.")]


def test_a_header_cut_short_is_content_with_its_tags():
    assert parse_all("<|channel|>analy") == [("content", "<|channel|>analy")]
    text = "<|channel|>final<|message|>Hi<|end|><|start|>assistant<|chan"
    assert parse_all(text) == [("content", "Hi<|start|>assistant<|chan")]


def test_a_malformed_header_is_content_and_parsing_resumes_at_the_next_message():
    text = (
        "<|channel|>final, oops<|message|>x<|end|><|start|>assistant<|channel|>final<|message|>ok"
    )
    assert parse_all(text) == [("content", "<|channel|>final, oops<|message|>x<|end|>\nok")]


def test_a_call_with_bad_json_is_content_with_its_header():
    text = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{not json}<|call|>"
    assert parse_all(text) == [("content", text)]
    cut = '<|channel|>commentary to=functions.f<|message|>{"a": [1, 2'  # max_tokens hit
    assert parse_all(cut) == [("content", cut)]
    array = "<|channel|>commentary to=functions.f<|message|>[1, 2]"
    assert parse_all(array) == [("content", array)]


def test_an_unknown_channel_or_no_channel_is_content():
    assert parse_all("<|channel|>weird<|message|>hi there<|end|>") == [("content", "hi there")]
    assert parse_all("<|message|>no channel") == [("content", "no channel")]


def test_calls_are_content_without_tools_and_other_recipients_always_are():
    assert parse_all(CALL_IN_ROLE, tools=False)[1] == ("content", CALL_IN_ROLE.split("<|end|>")[1])
    py = "<|channel|>analysis to=python code<|message|>print(1)<|call|>"
    assert parse_all(py) == [("content", py)]


def test_a_body_without_end_ends_at_the_next_start_or_channel():
    text = "<|channel|>analysis<|message|>think<|channel|>final<|message|>answer"
    assert parse_all(text) == [("reasoning", "think"), ("content", "answer")]


def test_text_between_messages_is_content_and_unknown_tags_are_text():
    text = (
        "<|channel|>final<|message|>a <|foo|> <| b < c<|end|>\n  stray"
        "<|start|>assistant<|channel|>final<|message|>z"
    )
    assert parse_all(text) == [("content", "a <|foo|> <| b < c\nstray\nz")]


# ---- bounds -------------------------------------------------------------------------------------


def test_a_call_body_over_the_limit_is_content_and_the_buffer_stays_bounded():
    body = json.dumps({"text": "x" * 500})
    head = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>"
    text = head + body
    p = HarmonyParser(max_call_bytes=100)
    out, peak = [], 0
    for ch in text:
        out += p.feed(ch)
        peak = max(peak, p.buffered_bytes)
    out = _merge(out + p.finish())
    assert out == [("content", text)]
    assert peak <= 100 + len(head) + len("<|constrain|>")
    assert parse_all(text, max_call_bytes=len(body)) == [ToolCall("f", body)]


def test_an_over_long_header_is_content_and_the_buffer_stays_bounded():
    text = "<|channel|>" + "a" * (3 * MAX_HEADER_CHARS) + "<|message|>x"
    p = HarmonyParser()
    peak = 0
    out: list = []
    for ch in text:
        out += p.feed(ch)
        peak = max(peak, p.buffered_bytes)
    out = _merge(out + p.finish())
    assert out == [("content", text)]
    assert peak <= MAX_HEADER_CHARS + len("<|message|>")


def test_streamed_bodies_are_not_held():
    p = HarmonyParser()
    p.feed("<|channel|>analysis<|message|>")
    assert p.feed("abc def") == [("reasoning", "abc def")]
    assert p.feed(" more <|e") == [("reasoning", " more ")]
    assert p.buffered_bytes == len("<|e")


# ---- every split gives the same result ----------------------------------------------------------

MALFORMED = [
    "<|channel|>analysis<|message|>unterminated",
    "<|channel|>commentary to=functions.f<|message|>{bad",
    "<|channel|>weird<|message|>x<|end|>stray text<|start|>assistant<|channel|>final<|message|>y",
    "plain, not harmony <|start|> then <|channel|>final<|message|>ok",
    "<|chan",
]


@pytest.mark.parametrize("text", TRANSCRIPTS + MALFORMED)
def test_every_split_into_two_or_into_characters_gives_the_whole_result(text):
    whole = parse_all(text)
    for i in range(len(text) + 1):
        assert _feed([text[:i], text[i:]]) == whole, i
    assert _feed(list(text)) == whole


def test_every_split_of_the_utf8_bytes_decoded_incrementally_gives_the_whole_result():
    import codecs

    data = CALL.encode()
    whole = parse_all(CALL)
    for i in range(len(data) + 1):
        dec = codecs.getincrementaldecoder("utf-8")()
        assert _feed([dec.decode(data[:i]), dec.decode(data[i:], final=True)]) == whole, i


hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_ALPHABET = st.sampled_from(
    ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>"]
    + ["assistant", "analysis", "final", "commentary", " to=functions.f", " json", "{}", '{"a":1}']
    + ["x", " ", "\n", "<", "|", "<|", ",", "é"]
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_ALPHABET, max_size=30), st.lists(st.integers(0, 400), max_size=6))
def test_random_token_soups_never_raise_stay_bounded_or_depend_on_splits(parts, cuts):
    text = "".join(parts)
    whole = parse_all(text, max_call_bytes=8)
    cuts = sorted({c % (len(text) + 1) for c in cuts})
    bounds = [0, *cuts, len(text)]
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    assert _feed(pieces, max_call_bytes=8) == whole
    p = HarmonyParser(max_call_bytes=8)
    for piece in pieces:
        p.feed(piece)
        assert p.buffered_bytes <= 8 + 4 * MAX_HEADER_CHARS + len("<|constrain|>")
    for e in whole:
        assert isinstance(e, ToolCall) or (e[0] in ("reasoning", "content") and e[1])


# ---- through ChatOutput (what the server sends) -------------------------------------------------


def test_chat_output_streams_reasoning_content_and_tool_calls_and_sums_to_the_message():
    out = ChatOutput(harmony=True, tools=True)
    deltas = [d for ch in PREAMBLE for d in out.feed(ch)] + out.finish()
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Plan: look it up."
    assert sum(1 for d in deltas if "reasoning_content" in d) > 1  # streamed, not one lump
    calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert [(c["index"], c["function"]["name"]) for c in calls] == [(0, "get_weather")]
    msg = out.message()
    assert msg["content"] == "Checking the weather now."
    assert msg["reasoning_content"] == "Plan: look it up."
    assert json.loads(msg["tool_calls"][0]["function"]["arguments"]) == {"city": "Paris"}
    assert out.finish_reason("stop") == "tool_calls"


def test_chat_output_without_tools_gives_harmony_calls_back_as_content():
    out = ChatOutput(harmony=True, tools=False)
    out.feed(CALL)
    out.finish()
    assert out.message()["content"].startswith("<|start|>assistant<|channel|>commentary to=")
    assert out.finish_reason("stop") == "stop"


# ---- the prompt side ----------------------------------------------------------------------------


def test_harmony_is_chosen_by_the_template_or_the_architecture():
    assert uses_harmony(GPT_OSS_TEMPLATE, "llama")
    assert uses_harmony(None, "gpt-oss")
    assert not uses_harmony("{{ messages }}<think>", "qwen3moe")
    assert not uses_harmony(None, None)


@pytest.mark.parametrize(
    "effort, level",
    [(None, "medium"), ("none", "low"), ("minimal", "low"), ("low", "low")]
    + [("medium", "medium"), ("high", "high"), ("xhigh", "high")],
)
def test_effort_reaches_the_system_message_as_gpt_oss_reads_it(effort, level):
    for template in (GPT_OSS_TEMPLATE, None):
        text = render_prompt(
            [{"role": "user", "content": "Hi"}], template, effort=effort, harmony=True
        )
        assert f"\nReasoning: {level}\n" in text
        assert text.endswith("<|start|>user<|message|>Hi<|end|><|start|>assistant")
    assert harmony_effort(effort) == level


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
    {"type": "function", "function": {"name": "now"}},  # no description, no parameters
]


@pytest.mark.parametrize("template", [GPT_OSS_TEMPLATE, HARMONY_TEMPLATE])
def test_tools_and_an_earlier_call_render_through_the_harmony_templates(template):
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Need the tool.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    text = render_prompt(history, template, tools=TOOLS, effort="high", harmony=True)
    assert "type get_weather = " in text and "type now = " in text
    assert "<|start|>developer<|message|># Instructions\n\nBe brief." in text
    assert (
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>" in text
    )
    assert '{"city": "Paris"}<|call|>' in text
    assert (
        '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"sunny, 21 C"'
        in text
    )
    assert text.endswith("<|start|>assistant")
    if template is GPT_OSS_TEMPLATE:  # its tool-call turns keep their analysis
        assert "<|channel|>analysis<|message|>Need the tool.<|end|>" in text


# ---- with gpt-oss's special tokens: what a Session gives the parser ------------------------------

HARMONY_TAGS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>"]
HARMONY_TAGS += ["<|return|>", "<|call|>"]


@pytest.fixture(scope="module")
def oss_tok(tmp_path_factory):
    """A vocabulary with harmony's tags as gpt-oss GGUFs type them (CONTROL, fixed up at load)."""
    import gguf
    from gguf.constants import Keys

    from strata.model.gguf_file import GGUFModel
    from strata.model.tokenizer import Tokenizer
    from tests.test_tokenizer import _write_vocab_gguf

    meta = dict(GGUFModel(_write_vocab_gguf(tmp_path_factory.mktemp("v") / "v.gguf")).metadata)
    meta[Keys.Tokenizer.LIST] = [*meta[Keys.Tokenizer.LIST], *HARMONY_TAGS]
    control = [int(gguf.TokenType.CONTROL)] * len(HARMONY_TAGS)
    meta[Keys.Tokenizer.TOKEN_TYPE] = [*meta[Keys.Tokenizer.TOKEN_TYPE], *control]
    return Tokenizer.from_metadata(meta)


def _generate(tok, text: str, tools: bool) -> ChatOutput:
    """Decode `text`'s ids one token at a time up to an end-of-generation id, as Session does."""
    out, dec = ChatOutput(harmony=True, tools=tools), tok.stream()
    for tid in tok.encode(text, add_bos=False):
        if tid in tok.eos_ids:
            break
        out.feed(dec.push(tid))
    out.feed(dec.flush())
    out.finish()
    return out


def test_harmony_tags_are_single_tokens_and_only_return_and_call_end_generation(oss_tok):
    ids = {t: oss_tok.encode(t, add_bos=False) for t in HARMONY_TAGS}
    assert all(len(v) == 1 for v in ids.values())
    ends = {t for t, (i,) in ids.items() if i in oss_tok.eos_ids}
    assert ends == {"<|return|>", "<|call|>"}  # `<|end|>` separates messages, it does not stop
    assert all(oss_tok.decode(v) == t for t, v in ids.items() if t not in ends)


def test_a_generated_harmony_call_stops_at_call_and_parses(oss_tok):
    out = _generate(oss_tok, CALL + "<|call|><|start|>assistant never seen", tools=True)
    msg = out.message()
    assert msg["reasoning_content"] == "Need the weather tool."
    assert msg["content"] is None
    (call,) = msg["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "unit": "°C"}
    assert out.finish_reason("stop") == "tool_calls"


def test_a_generated_harmony_answer_stops_at_return(oss_tok):
    msg = _generate(oss_tok, TWO_THOUGHTS + "never seen", tools=False).message()
    assert msg == {
        "role": "assistant",
        "content": "Done.",
        "reasoning_content": "First thought.\nSecond thought.",
    }
