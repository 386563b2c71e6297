"""The harmony path of the server (gpt-oss), over real HTTP with the real `openai` client.

The embedded model, copied with gpt-oss's chat template as its `tokenizer.chat_template` (so the
server picks the harmony parser, as it would for a gpt-oss GGUF), serves a *scripted token
stream* (`test_serve.ScriptedEngine`): harmony text we choose, decoded token by token, so tags
arrive cut at arbitrary places. `<|return|>` and `<|call|>` end generation in gpt-oss and are
never in the text; the script just ends there.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

pytest.importorskip("starlette")
openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from gguf.constants import Keys  # noqa: E402

from strata.cli.common import DEFAULT_MODEL  # noqa: E402
from strata.model.loader import load_model  # noqa: E402
from strata.serve.app import create_app  # noqa: E402
from tests.gguf_edit import rewrite_gguf  # noqa: E402
from tests.test_serve import ScriptedEngine, ScriptedSession, _serve  # noqa: E402

TEMPLATE = (Path(__file__).parent / "fixtures" / "gpt-oss.jinja").read_text()
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
ANSWER = (
    "<|channel|>analysis<|message|>The user asks about the weather. I should answer.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>It is sunny in Paris."
)
CALL = (
    "<|channel|>analysis<|message|>Need the weather tool for Paris.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris"}'
)
BAD_CALL = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{city: Paris"


@pytest.fixture(scope="module")
def oss(tmp_path_factory):
    """oss(**create_app kwargs) -> (url, engine), one server per distinct kwargs."""
    path = rewrite_gguf(
        DEFAULT_MODEL,
        tmp_path_factory.mktemp("oss") / "harmony.gguf",
        meta={Keys.Tokenizer.CHAT_TEMPLATE: TEMPLATE},
    )
    model = load_model(path)
    made: dict = {}
    with contextlib.ExitStack() as stack:

        def make(**kw):
            key = tuple(sorted(kw.items()))
            if key not in made:
                engine = ScriptedEngine(model.tokenizer)
                app = create_app(
                    model, session_factory=lambda: ScriptedSession(model, engine), **kw
                )
                made[key] = (stack.enter_context(_serve(app)), engine)
            url, engine = made[key]
            engine.say("")
            return url, engine

        yield make


def _client(url: str):
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=30)


def _reasoning(x) -> str | None:
    return (x.model_extra or {}).get("reasoning_content")


def test_the_server_chooses_harmony_for_a_gpt_oss_template(oss):
    url, engine = oss()
    engine.say(ANSWER)
    msg = _client(url).chat.completions.create(model="harmony", messages=USER).choices[0].message
    assert msg.content == "It is sunny in Paris."
    assert _reasoning(msg) == "The user asks about the weather. I should answer."
    prompt = engine.prompts[-1]
    assert "\nReasoning: medium\n" in prompt and prompt.endswith("<|start|>assistant")


def test_analysis_streams_as_reasoning_deltas_and_final_as_content(oss):
    url, engine = oss()
    engine.say(ANSWER)
    chunks = list(_client(url).chat.completions.create(model="harmony", messages=USER, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = [r for d in deltas if (r := _reasoning(d))]
    assert "".join(reasoning) == "The user asks about the weather. I should answer."
    assert len(reasoning) > 1  # deltas, not one lump
    assert "".join(d.content or "" for d in deltas) == "It is sunny in Paris."
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_harmony_call_streams_as_tool_calls_and_the_next_turn_renders_it(oss):
    url, engine = oss()
    engine.say(CALL)
    client = _client(url)
    chunks = list(
        client.chat.completions.create(model="harmony", messages=USER, tools=TOOLS, stream=True)
    )
    assert "type get_weather = " in engine.prompts[-1]  # the tools reached the template
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert [(c.index, c.function.name) for c in calls] == [(0, "get_weather")]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert calls[0].id.startswith("call_")
    assert "".join(r for d in deltas if (r := _reasoning(d))) == "Need the weather tool for Paris."
    assert not "".join(d.content or "" for d in deltas)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    history = [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "Need the weather tool for Paris.",
            "tool_calls": [
                {
                    "id": calls[0].id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": calls[0].function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": calls[0].id, "content": "sunny, 21 C"},
    ]
    engine.say("<|channel|>final<|message|>Sunny, 21 C.")
    r = client.chat.completions.create(model="harmony", messages=history, tools=TOOLS)
    assert r.choices[0].message.content == "Sunny, 21 C." and r.choices[0].finish_reason == "stop"
    prompt = engine.prompts[-1]
    assert "<|channel|>analysis<|message|>Need the weather tool for Paris.<|end|>" in prompt
    assert "to=functions.get_weather<|channel|>commentary json<|message|>" in prompt
    assert '"sunny, 21 C"' in prompt


def test_the_deployment_effort_is_the_default_and_a_request_overrides_it(oss):
    url, engine = oss(reasoning_effort="high")
    client = _client(url)
    client.chat.completions.create(model="harmony", messages=USER)
    assert "\nReasoning: high\n" in engine.prompts[-1]
    client.chat.completions.create(model="harmony", messages=USER, reasoning_effort="low")
    assert "\nReasoning: low\n" in engine.prompts[-1]
    client.chat.completions.create(
        model="harmony", messages=USER, extra_body={"reasoning_effort": "none"}
    )
    assert "\nReasoning: low\n" in engine.prompts[-1]


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_with_bad_json_comes_back_as_content_without_an_error(oss, stream):
    url, engine = oss()
    engine.say(BAD_CALL)
    r = _client(url).chat.completions.create(
        model="harmony", messages=USER, tools=TOOLS, stream=stream
    )
    if stream:
        chunks = list(r)
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        content = "".join(d.content or "" for d in deltas)
        assert not any(d.tool_calls for d in deltas)
        finish = chunks[-1].choices[0].finish_reason
    else:
        content, finish = r.choices[0].message.content, r.choices[0].finish_reason
        assert r.choices[0].message.tool_calls is None
    assert content == BAD_CALL and finish == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_unterminated_analysis_is_reasoning_cut_by_the_token_limit(oss, stream):
    url, engine = oss()
    engine.say("<|channel|>analysis<|message|>" + "thinking " * 200)
    r = _client(url).chat.completions.create(
        model="harmony", messages=USER, max_tokens=40, stream=stream
    )
    if stream:
        chunks = list(r)
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        reasoning = "".join(x for d in deltas if (x := _reasoning(d)))
        content = "".join(d.content or "" for d in deltas)
        finish = chunks[-1].choices[0].finish_reason
    else:
        msg = r.choices[0].message
        reasoning, content, finish = _reasoning(msg), msg.content, r.choices[0].finish_reason
    assert reasoning.startswith("thinking thinking") and not content and finish == "length"


def test_a_broken_header_and_an_unknown_channel_come_back_as_content(oss):
    url, engine = oss()
    client = _client(url)
    engine.say("<|channel|>final, or not<|message|>hi")
    msg = client.chat.completions.create(model="harmony", messages=USER).choices[0].message
    assert msg.content == "<|channel|>final, or not<|message|>hi" and _reasoning(msg) is None
    engine.say("<|channel|>mystery<|message|>still an answer")
    msg = client.chat.completions.create(model="harmony", messages=USER).choices[0].message
    assert msg.content == "still an answer"
