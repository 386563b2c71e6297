"""The OpenAI-compatible server, driven over real HTTP by the real `openai` client.

Servers run uvicorn on 127.0.0.1 in background threads. `server` serves the embedded default
model (random weights: nonsense text, real tokenizer and template). `scripted(...)` servers run
the real Session, parsers and HTTP stack on a *scripted token stream*: their engine's logits force
a token sequence we choose, so reasoning and tool-call output is deterministic; those tests say so.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

# the `serve` extra (and the test extra's client): skipped, not errors, without them
pytest.importorskip("starlette")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from strata.cli.common import DEFAULT_MODEL  # noqa: E402
from strata.engine.session import Session  # noqa: E402
from strata.model.loader import load_model  # noqa: E402
from strata.serve.app import create_app  # noqa: E402
from strata.serve.prompt import render_prompt  # noqa: E402

USER = [{"role": "user", "content": "Tell me a story"}]


@contextlib.contextmanager
def _serve(app):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()


@pytest.fixture(scope="session")
def model():
    return load_model(DEFAULT_MODEL)


@pytest.fixture(scope="session")
def servers():
    with contextlib.ExitStack() as stack:
        yield stack


@pytest.fixture(scope="session")
def server(model, servers) -> str:
    return servers.enter_context(_serve(create_app(model)))


@pytest.fixture(scope="session")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=60)


def _prompt_tokens(model, messages, **kw) -> int:
    tok = model.tokenizer
    text = render_prompt(
        messages,
        model.chat_template,
        bos_token=tok.token_text(tok.bos_id),
        eos_token=tok.token_text(tok.eos_id),
        **kw,
    )
    return len(tok.encode(text))


def _metric(url: str, name: str, **headers) -> float:
    for line in httpx.get(url + "/metrics", headers=headers).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def _wait(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# ---- the embedded model ---------------------------------------------------------------------


def test_models_health_and_metrics_answer(client, server):
    (m,) = client.models.list().data
    assert m.id == "default" and m.owned_by == "strata"
    assert httpx.get(server + "/health").json()["status"] == "ok"
    r = httpx.get(server + "/metrics")
    assert r.headers["content-type"].startswith("text/plain")
    assert "strata_queue_depth 0" in r.text and "# TYPE strata_requests_total counter" in r.text
    for name in (
        "batch_size_mean",
        "kv_blocks_used",
        "prefix_hit_tokens_total",
        "preemptions_total",
    ):
        assert f"# TYPE strata_{name} " in r.text  # the batch's figures


def test_chat_returns_text_and_exact_usage(client, model):
    r = client.chat.completions.create(model="default", messages=USER, max_tokens=6, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 6
    assert r.usage.prompt_tokens == _prompt_tokens(model, USER)
    assert r.usage.total_tokens == r.usage.prompt_tokens + 6


def test_streaming_chat_gives_the_same_text_and_a_final_usage_chunk(client):
    kw = dict(model="default", messages=USER, max_tokens=8, temperature=0)
    whole = client.chat.completions.create(**kw)
    chunks = list(
        client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_without_include_usage_still_reports_usage_on_the_last_chunk(client):
    # greedy: a sampled draw may end the reply with EOS inside 3 tokens ("stop"; seen once in CI)
    chunks = list(
        client.chat.completions.create(
            model="default", messages=USER, max_tokens=3, temperature=0, stream=True
        )
    )
    assert chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 3


def test_stop_strings_end_the_text_before_the_stop(client):
    kw = dict(model="default", messages=USER, max_tokens=12, temperature=0)
    text = client.chat.completions.create(**kw).choices[0].message.content
    stop = next(
        text[k : k + 2]
        for k in range(2, len(text) - 1)
        if text[k : k + 2].isascii() and text[k : k + 2].strip() and text.find(text[k : k + 2]) == k
    )
    r = client.chat.completions.create(**kw, stop=[stop, "never-seen"])
    assert r.choices[0].message.content == text[: text.find(stop)]
    assert r.choices[0].finish_reason == "stop"
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(**kw, stop=stop, stream=True)
        if c.choices
    )
    assert streamed == text[: text.find(stop)]


def test_a_seed_makes_sampling_reproducible(client):
    kw = dict(
        model="default",
        messages=USER,
        max_tokens=10,
        temperature=1.0,
        top_p=1.0,
        extra_body={"top_k": 0, "min_p": 0.0},
    )
    a = client.chat.completions.create(**kw, seed=1234).choices[0].message.content
    b = client.chat.completions.create(**kw, seed=1234).choices[0].message.content
    assert a == b
    others = {
        client.chat.completions.create(**kw, seed=s).choices[0].message.content for s in (1, 2)
    }
    assert others != {a}  # the seed is what made them equal


def test_completions_endpoint_streams_and_echoes(client, model):
    r = client.completions.create(
        model="default", prompt="Once upon", max_tokens=5, temperature=0, echo=True
    )
    assert r.choices[0].text.startswith("Once upon") and r.usage.completion_tokens == 5
    assert r.usage.prompt_tokens == len(model.tokenizer.encode("Once upon"))
    chunks = list(
        client.completions.create(
            model="default", prompt="Once upon", max_tokens=5, temperature=0, stream=True
        )
    )
    assert "Once upon" + "".join(c.choices[0].text for c in chunks) == r.choices[0].text
    ids = client.completions.create(model="default", prompt=[11, 12, 13], max_tokens=2)
    assert ids.usage.prompt_tokens == 3


def test_reasoning_effort_none_prefills_an_empty_think_block(client, model):
    r = client.chat.completions.create(
        model="default", messages=USER, max_tokens=1, reasoning_effort="none"
    )
    assert r.usage.prompt_tokens == _prompt_tokens(model, USER, effort="none")
    assert r.usage.prompt_tokens > _prompt_tokens(model, USER)


# ---- errors ---------------------------------------------------------------------------------


def _error(url: str, body, path: str = "/v1/chat/completions", status: int = 400) -> dict:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(url + path, content=data, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"",
        b"[1, 2]",
        b'"text"',
        b"\xff\xfe",
        b'{"messages": [], "temperature": NaN}',
        b"[" * 100_000,
    ],
)
def test_malformed_json_is_a_400(server, body):
    assert _error(server, body)["code"] == "invalid_json" or body.startswith(b'{"messages"')


@pytest.mark.parametrize(
    "field,value",
    [
        ("temperature", "hot"),
        ("temperature", -1),
        ("temperature", True),
        ("max_tokens", "10"),
        ("max_tokens", 0),
        ("max_tokens", 1.5),
        ("top_p", 0),
        ("top_k", "x"),
        ("min_p", 2),
        ("seed", "s"),
        ("stream", "yes"),
        ("stop", 5),
        ("stop", ["a", 1]),
        ("stop", "x" * 1001),
        ("messages", "hi"),
        ("messages", [{"role": "robot", "content": "x"}]),
        ("messages", [{"role": "user"}]),
        ("messages", [{"role": "user", "content": [{"type": "image_url"}]}]),
        ("messages", [1]),
        ("tools", {"a": 1}),
        ("tools", [{"type": "function"}]),
        ("tool_choice", "required"),
        ("reasoning_effort", "maximal"),
        ("stream_options", "yes"),
        ("model", 3),
        ("logprobs", True),
    ],
)
def test_a_wrong_field_is_a_400_naming_the_field(server, field, value):
    body = {"model": "default", "messages": USER, "max_tokens": 1, field: value}
    err = _error(server, body)
    assert err["type"] == "invalid_request_error"
    assert err["param"].split("[")[0].split(".")[0] == field


def test_missing_messages_and_prompt_are_400s(server):
    assert _error(server, {"model": "default"})["param"] == "messages"
    assert _error(server, {"model": "default"}, "/v1/completions")["param"] == "prompt"
    assert _error(server, {"prompt": [1, 99999]}, "/v1/completions")["param"] == "prompt"


def test_n_other_than_one_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="default", messages=USER, n=2)
    assert e.value.body["param"] == "n"


def test_response_format_other_than_text_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="default", messages=USER, response_format={"type": "json_object"}
        )
    assert e.value.body["param"] == "response_format"
    r = client.chat.completions.create(  # greedy: an unseeded draw may be EOS (a CI flake)
        model="default",
        messages=USER,
        max_tokens=1,
        temperature=0,
        response_format={"type": "text"},
    )
    assert r.usage.completion_tokens == 1


def test_prompt_plus_max_tokens_over_the_context_is_a_400_with_the_numbers(client, model):
    n = _prompt_tokens(model, USER)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="default", messages=USER, max_tokens=5000)
    assert e.value.body["code"] == "context_length_exceeded"
    assert f"{n + 5000} tokens ({n} in the prompt, 5000 for the completion)" in str(e.value)
    assert "4096" in str(e.value)
    long = [{"role": "user", "content": "word " * 5000}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="default", messages=long)
    assert e.value.body["code"] == "context_length_exceeded"


def test_unknown_paths_and_methods_are_openai_shaped(server):
    assert httpx.get(server + "/v1/nothing").json()["error"]["code"] == "not_found"
    r = httpx.get(server + "/v1/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    assert httpx.get(server + "/v1/models/other").status_code == 404


# ---- auth -----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def auth_server(model, servers) -> str:
    return servers.enter_context(_serve(create_app(model, api_key="s3cret")))


def test_with_an_api_key_requests_need_the_bearer_token(auth_server):
    kw = dict(base_url=auth_server + "/v1", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        openai.OpenAI(api_key="wrong", **kw).models.list()
    assert e.value.body["code"] == "invalid_api_key"
    r = httpx.post(auth_server + "/v1/chat/completions", json={"messages": USER})
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json()["error"]["message"].startswith("Missing API key")
    good = openai.OpenAI(api_key="s3cret", **kw)
    assert good.models.list().data[0].id == "default"
    assert (
        good.chat.completions.create(
            model="default", messages=USER, max_tokens=1
        ).usage.completion_tokens
        == 1
    )
    assert httpx.get(auth_server + "/health").status_code == 200  # health stays open
    assert httpx.get(auth_server + "/metrics").status_code == 401
    assert (
        httpx.get(auth_server + "/metrics", headers={"Authorization": "Bearer s3cret"}).status_code
        == 200
    )


def test_without_an_api_key_any_token_is_accepted(client):
    assert client.models.list().data  # the client sends "Bearer unused"


# ---- a scripted token stream ------------------------------------------------------------------


class ScriptedEngine:
    """Engine stand-in whose logits force a scripted token sequence (then end-of-text)."""

    def __init__(self, tokenizer, n_ctx: int = 4096):
        self.tok, self.n_ctx = tokenizer, n_ctx
        self.script: list[int] = []
        self.i = 0
        self.prompts: list[str] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail = False
        self.adaptive = None
        self.stats = SimpleNamespace(hit_rate=0.25, substitution_rate=0.5, swaps=7)

    def say(self, text: str) -> None:
        self.script = self.tok.encode(text, add_bos=False)

    def reset(self, keep: int = 0) -> None:
        self.i = 0

    def forward(self, tokens, all_logits: bool = False) -> np.ndarray:
        assert self.gate.wait(30)
        if self.fail:
            raise RuntimeError("scripted failure")
        tid = self.script[self.i] if self.i < len(self.script) else self.tok.eos_id
        self.i += 1
        logits = np.full(self.tok.vocab_size, -1e4, np.float32)
        logits[tid] = 0.0
        return logits


class ScriptedSession(Session):
    def begin(self, prompt):
        self.engine.prompts.append(self.tokenizer.decode(prompt))
        return super().begin(prompt)


@pytest.fixture(scope="session")
def scripted(model, servers):
    """scripted(**create_app kwargs) -> (url, engine); one server per distinct kwargs."""
    made: dict = {}

    def make(**kw):
        key = tuple(sorted(kw.items()))
        if key not in made:
            engine = ScriptedEngine(model.tokenizer)
            app = create_app(model, session_factory=lambda: ScriptedSession(model, engine), **kw)
            made[key] = (servers.enter_context(_serve(app)), engine)
        url, engine = made[key]
        engine.say("")
        engine.gate.set()
        engine.fail = False
        return url, engine

    return make


def test_a_client_that_disconnects_cancels_its_stream(scripted):
    # scripted, so the model cannot end the answer on its own before the hang-up is noticed
    url, engine = scripted()
    engine.say("word " * 3000)
    before = _metric(url, "strata_requests_cancelled_total")
    body = {"messages": USER, "max_tokens": 3000, "stream": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        while '"content":""' in (line := next(lines)) or not line:
            pass  # read up to the first real token, then hang up
        engine.gate.clear()  # hold the next token until the client is gone
    time.sleep(0.2)
    engine.gate.set()
    _wait(lambda: _metric(url, "strata_requests_cancelled_total") == before + 1)
    assert httpx.get(url + "/health").json()["active"] == 0


def test_a_client_that_times_out_cancels_its_plain_request(scripted):
    url, engine = scripted()
    engine.say("word " * 3000)
    before = _metric(url, "strata_requests_cancelled_total")
    engine.gate.clear()  # generation cannot finish before the client gives up
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            url + "/v1/chat/completions", timeout=0.5, json={"messages": USER, "max_tokens": 3000}
        )
    engine.gate.set()
    _wait(lambda: _metric(url, "strata_requests_cancelled_total") == before + 1)
    assert httpx.get(url + "/health").json()["active"] == 0


def _oai(url: str):
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=30)


THOUGHT = "<think>\nThe user wants a greeting.\n</think>\n\nHello there!"
CALL = (
    'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    "</tool_call>"
)
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


def test_scripted_think_block_goes_to_reasoning_content(scripted):
    url, engine = scripted()
    engine.say(THOUGHT)
    msg = _oai(url).chat.completions.create(model="default", messages=USER).choices[0].message
    assert msg.content == "Hello there!"
    assert msg.model_extra["reasoning_content"] == "The user wants a greeting."


def test_scripted_think_block_streams_as_reasoning_deltas(scripted):
    url, engine = scripted()
    engine.say(THOUGHT)
    chunks = list(_oai(url).chat.completions.create(model="default", messages=USER, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = [d.model_extra.get("reasoning_content") for d in deltas]
    assert "".join(r for r in reasoning if r) == "The user wants a greeting."
    assert sum(1 for r in reasoning if r) > 1  # streamed as deltas, not one lump
    assert "".join(d.content or "" for d in deltas) == "Hello there!"


def test_deployment_reasoning_effort_is_the_default_and_a_request_overrides_it(scripted):
    url, engine = scripted(reasoning_effort="none")
    _oai(url).chat.completions.create(model="default", messages=USER)
    assert engine.prompts[-1].endswith("<think>\n\n</think>\n\n")
    _oai(url).chat.completions.create(model="default", messages=USER, reasoning_effort="high")
    assert engine.prompts[-1].endswith("<|im_start|>assistant\n")


def test_scripted_tool_call_comes_back_as_tool_calls(scripted):
    url, engine = scripted()
    engine.say(CALL)
    r = _oai(url).chat.completions.create(model="default", messages=USER, tools=TOOLS)
    assert "get_weather" in engine.prompts[-1]  # the tools reached the prompt
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    assert msg.content == "Let me check."
    (call,) = msg.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {
        "city": "Paris"
    }
    assert call.id.startswith("call_") and call.type == "function"


def test_scripted_tool_call_streams_and_a_follow_up_turn_renders(scripted):
    url, engine = scripted()
    engine.say(CALL)
    chunks = list(
        _oai(url).chat.completions.create(model="default", messages=USER, tools=TOOLS, stream=True)
    )
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(c.index, c.function.name) for c in calls] == [(0, "get_weather")]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    history = [
        *USER,
        {
            "role": "assistant",
            "content": None,
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
    engine.say("It is sunny.")
    r = _oai(url).chat.completions.create(model="default", messages=history, tools=TOOLS)
    assert r.choices[0].message.content == "It is sunny."
    assert "sunny, 21 C" in engine.prompts[-1] and '"city": "Paris"' in engine.prompts[-1]


def test_scripted_malformed_tool_call_is_delivered_as_content(scripted):
    url, engine = scripted()
    engine.say("<tool_call>{not json}</tool_call>")
    r = _oai(url).chat.completions.create(model="default", messages=USER, tools=TOOLS)
    assert r.choices[0].message.content == "<tool_call>{not json}</tool_call>"
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason == "stop"


@contextlib.contextmanager
def _blocked(url: str, engine: ScriptedEngine, n: int):
    """`n` requests in flight while generation is blocked (the first holds the slot)."""
    engine.say("ok")
    engine.gate.clear()
    results: list = []

    def call():
        results.append(_oai(url).chat.completions.create(model="default", messages=USER))

    threads = [threading.Thread(target=call) for _ in range(n)]
    try:
        for t in threads:
            t.start()
        _wait(lambda: _health(url)[1:] == (1, n - 1))
        yield results
    finally:
        engine.gate.set()
        for t in threads:
            t.join(30)
    assert [r.choices[0].message.content for r in results] == ["ok"] * n


def _health(url: str) -> tuple[int, int, int]:
    h = httpx.get(url + "/health").json()
    return h["slots"], h["active"], h["queued"]


def test_a_full_queue_is_a_503_with_retry_after(scripted):
    url, engine = scripted(max_queue=1)
    with _blocked(url, engine, 2):  # one generating, one queued: full
        with pytest.raises(openai.InternalServerError) as e:
            _oai(url).chat.completions.create(model="default", messages=USER)
        assert e.value.status_code == 503 and e.value.body["code"] == "queue_full"
        assert int(e.value.response.headers["retry-after"]) >= 1
    assert _metric(url, "strata_requests_rejected_total") == 1


def test_a_queued_client_that_gives_up_leaves_the_queue(scripted):
    url, engine = scripted(max_queue=1)
    with _blocked(url, engine, 1):
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/v1/chat/completions", json={"messages": USER}, timeout=0.3)
        _wait(lambda: _health(url) == (1, 1, 0))


def test_a_failing_generation_is_a_500_and_the_server_keeps_serving(scripted):
    url, engine = scripted()
    engine.fail = True
    with pytest.raises(openai.InternalServerError) as e:
        _oai(url).chat.completions.create(model="default", messages=USER)
    assert e.value.status_code == 500 and e.value.body["code"] == "generation_failed"
    engine.fail = False
    engine.say("fine")
    assert (
        _oai(url).chat.completions.create(model="default", messages=USER).choices[0].message.content
        == "fine"
    )


def test_metrics_read_cache_and_car_rates_from_the_engine_stats(scripted, server, client):
    url, _ = scripted()
    assert _metric(url, "strata_cache_hit_rate") == 0.25
    assert _metric(url, "strata_car_substitution_rate") == 0.5
    assert _metric(url, "strata_expert_cache_swaps_total") == 7
    client.chat.completions.create(model="default", messages=USER, max_tokens=1)
    assert _metric(server, "strata_cache_hit_rate") == 1.0  # the real engine: all resident


def test_metrics_report_cpu_experts_a_window_and_each_helper_cards_picks():
    from strata.engine.stats import EngineStats
    from strata.serve.metrics import Metrics

    a, b = EngineStats(), EngineStats()
    a.decode_steps, a.cpu_experts, a.cpu_windows, a.helper_hits = 4, 30, 10, [5, 2]
    b.decode_steps, b.cpu_experts, b.cpu_windows, b.helper_hits = 2, 10, 10, [1]
    text = Metrics().render(queued=0, active=0, slots=1, engine_stats=[a, b])
    assert "strata_cpu_experts_per_window 2.0" in text  # (3.0 + 1.0) / 2
    assert 'strata_helper_card_picks_total{card="1"} 6' in text
    assert 'strata_helper_card_picks_total{card="2"} 2' in text
    idle = Metrics().render(queued=0, active=0, slots=1, engine_stats=[EngineStats()])
    assert "strata_cpu_experts_per_window 0.0" in idle and "helper_card" not in idle


hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_SCALAR = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.text(max_size=8)
    | st.floats(allow_nan=False, allow_infinity=False)
)
_JSON = st.recursive(
    _SCALAR,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
    max_leaves=8,
)
_FIELDS = [
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "n",
    "stream",
    "stream_options",
    "tools",
    "tool_choice",
    "reasoning_effort",
    "response_format",
    "prompt",
    "echo",
    "logprobs",
]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.dictionaries(st.sampled_from(_FIELDS), _JSON, max_size=6),
    st.sampled_from(["/v1/chat/completions", "/v1/completions"]),
)
def test_random_request_bodies_never_get_a_5xx(scripted, body, path):
    url, _ = scripted()
    r = httpx.post(url + path, json=body, timeout=30)
    assert r.status_code in (200, 400), r.text
    if r.status_code == 400:
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
