"""Hostile input to the server (issue 48): text that cannot be encoded, unknown models, prompts
too long to tokenize, bodies that never finish. Each is a clean OpenAI-shaped 4xx, and none
stalls the server for anyone else. Servers and the scripted engine are test_serve's."""

from __future__ import annotations

import contextlib
import json
import random
import socket
import threading
import time

import pytest

from strata.cli.common import DEFAULT_MODEL
from strata.model.loader import load_model
from strata.serve import guard
from strata.serve.app import LONG_PROMPT_BYTES, create_app
from strata.serve.http import BODY_IDLE_S

from .test_serve import USER, ScriptedEngine, ScriptedSession, _serve

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
BAD = "a\ud800b"  # a lone surrogate: valid JSON ("\ud800"), not encodable text
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}


@pytest.fixture(scope="module")
def model():
    return load_model(DEFAULT_MODEL)


@pytest.fixture(scope="module")
def servers():
    with contextlib.ExitStack() as stack:
        yield stack


@pytest.fixture(scope="module")
def server(model, servers) -> str:
    return servers.enter_context(_serve(create_app(model)))


def _post(url: str, path: str, body: dict, timeout: float = 60) -> httpx.Response:
    data = json.dumps(body).encode()  # ensure_ascii: the surrogate travels as "\ud800"
    return httpx.post(
        url + path, content=data, headers={"content-type": "application/json"}, timeout=timeout
    )


def _error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def _call(name: str, arguments: str) -> dict:
    fn = {"name": name, "arguments": arguments}
    return {"role": "assistant", "tool_calls": [{"id": "c0", "type": "function", "function": fn}]}


# ---- text that cannot be encoded -----------------------------------------------------------

_SURROGATES = [
    (CHAT, {"messages": [{"role": "user", "content": BAD}]}, "messages[0].content"),
    (
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "text", "text": BAD}]}]},
        "messages[0].content[0].text",
    ),
    (
        CHAT,
        {"messages": USER, "tools": [{**TOOL, "function": {"name": BAD}}]},
        "tools[0].function.name",
    ),
    (
        CHAT,
        {"messages": [*USER, _call(BAD, "{}")]},
        "messages[1].tool_calls[0].function.name",
    ),
    (
        CHAT,
        {"messages": [*USER, _call("f", json.dumps({"city": BAD}, ensure_ascii=False))]},
        "messages[1].tool_calls[0].function.arguments",
    ),
    (  # escaped inside the arguments string: seen only once the arguments are decoded
        CHAT,
        {"messages": [*USER, _call("f", json.dumps({"city": BAD}))]},
        "messages[1].tool_calls[0].function.arguments.city",
    ),
    (
        CHAT,
        {"messages": USER, "tools": [{**TOOL, "function": {"name": "f", "parameters": {BAD: 1}}}]},
        "tools[0].function.parameters",
    ),
    (CHAT, {"messages": USER, "stop": ["ok", BAD]}, "stop[1]"),
    (CHAT, {"messages": USER, "model": BAD}, "model"),
    (COMPLETIONS, {"prompt": BAD}, "prompt"),
    (COMPLETIONS, {"prompt": [BAD]}, "prompt[0]"),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path,body,param", _SURROGATES)
def test_a_lone_surrogate_anywhere_is_a_400_naming_the_field(server, path, body, param, stream):
    err = _error(_post(server, path, {**body, "max_tokens": 1, "stream": stream}), 400)
    assert err["param"] == param and err["code"] == "invalid_encoding"
    assert err["type"] == "invalid_request_error" and "surrogate" in err["message"]


def test_check_encodable_survives_the_deepest_body_json_allows():
    deep: object = BAD
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(guard.APIError) as e:
        guard.check_encodable({"x": deep})
    assert e.value.param.startswith("x[0][0]")
    guard.check_encodable({"x": [[["fine", {"ключ": "значение"}]]]})


# ---- the model field ------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path,body", [(CHAT, {"messages": USER}), (COMPLETIONS, {"prompt": "x"})])
def test_an_unknown_model_is_a_404_model_not_found(server, path, body, stream):
    r = _post(server, path, {**body, "model": "gpt-9-ultra", "max_tokens": 1, "stream": stream})
    err = _error(r, 404)
    assert err["code"] == "model_not_found" and err["param"] == "model"
    assert "gpt-9-ultra" in err["message"] and "`default`" in err["message"]
    assert _error(httpx.get(server + "/v1/models/gpt-9-ultra"), 404)["code"] == "model_not_found"


@pytest.mark.parametrize("name", ["default", "default.gguf", None])
def test_the_served_id_its_file_name_or_no_model_are_accepted(server, name):
    body = {"messages": USER, "max_tokens": 1, "temperature": 0}
    if name is not None:
        body["model"] = name
        assert httpx.get(f"{server}/v1/models/{name}").json()["id"] == "default"
    assert _post(server, CHAT, body).status_code == 200


def test_model_names_drop_a_shard_suffix():
    names = guard.model_names("qwen3-30b-iq3", "/m/Qwen3-30B-IQ3_XXS-00001-of-00003.gguf")
    assert {"qwen3-30b-iq3", "Qwen3-30B-IQ3_XXS", "Qwen3-30B-IQ3_XXS-00001-of-00003"} <= names


# ---- prompt size, before tokenizing ---------------------------------------------------------


def test_no_token_stands_for_more_bytes_than_the_longest(model):
    """The size check's premise, on seeded random text made of the vocabulary's own tokens."""
    tok = model.tokenizer
    longest = guard.longest_token_bytes(tok)
    rng = random.Random(48)
    pieces = [tok.token_bytes(i) for i in range(tok.vocab_size)]
    long = sorted(pieces, key=len)[-50:]
    for _ in range(20):
        pool = long if rng.random() < 0.5 else pieces
        text = b"".join(rng.choice(pool) for _ in range(200)).decode("utf-8", "replace")
        nbytes = len(text.encode())
        assert len(tok.encode(text, add_bos=False)) * longest >= nbytes


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_a_prompt_too_long_by_its_bytes_is_refused_without_tokenizing(
    server, model, path, monkeypatch
):
    tok = model.tokenizer
    encoded: list[int] = []
    real = type(tok).encode

    def spy(self, text, *a, **kw):
        encoded.append(len(text))
        return real(self, text, *a, **kw)

    monkeypatch.setattr(type(tok), "encode", spy)
    limit = (4096 - 1) * guard.longest_token_bytes(tok)
    text = "word " * (limit // 5 + 1)
    body = {"messages": [{"role": "user", "content": text}]} if path == CHAT else {"prompt": text}
    err = _error(_post(server, path, body), 400)
    assert err["code"] == "context_length_exceeded"
    assert err["param"] == ("messages" if path == CHAT else "prompt")
    assert "bytes" in err["message"] and "4096" in err["message"]
    assert all(n < limit for n in encoded)  # the long prompt never reached the tokenizer


def _big_text(tok, nbytes: int, seed: int = 15) -> str:
    """About `nbytes` of seeded random words from the vocabulary (few tokens per byte)."""
    texts = (tok.token_bytes(i).decode("utf-8", "replace") for i in range(tok.vocab_size))
    words = [t for t in texts if t.startswith(" ") and t[1:].isalpha() and len(t) >= 6]
    rng = random.Random(seed)
    out, n = [], 0
    while n < nbytes:
        w = rng.choice(words)
        out.append(w)
        n += len(w)
    return "".join(out)


def test_a_15_mb_prompt_stalls_neither_health_nor_another_stream(model, servers):
    """A context large enough that a 15 MB prompt passes the size check in bytes, so it is
    tokenized (until it cannot fit): /health and another client's stream answer meanwhile."""
    engine = ScriptedEngine(model.tokenizer, n_ctx=2**18)
    app = create_app(model, session_factory=lambda: ScriptedSession(model, engine))
    url = servers.enter_context(_serve(app))
    text = _big_text(model.tokenizer, 15 * 2**20)
    assert len(text.encode()) < (2**18 - 1) * guard.longest_token_bytes(model.tokenizer)
    big: dict = {}

    def send_big():
        big["r"] = _post(url, COMPLETIONS, {"prompt": text, "max_tokens": 1}, timeout=300)

    thread = threading.Thread(target=send_big)
    thread.start()
    worst, polls, streams = 0.0, 0, 0
    engine.say(" one two three four")
    while thread.is_alive() or polls < 3:
        t0 = time.monotonic()
        assert httpx.get(url + "/health", timeout=60).json()["status"] == "ok"
        worst, polls = max(worst, time.monotonic() - t0), polls + 1
        body = {"messages": USER, "stream": True}
        with httpx.stream("POST", url + CHAT, json=body, timeout=60) as r:
            streamed = "".join(r.iter_lines())
        assert "three" in streamed and streamed.endswith("data: [DONE]")
        streams += 1
    thread.join()
    assert worst < 2.0, f"/health took {worst:.2f} s"  # a stall would last the whole tokenizing
    err = _error(big["r"], 400)
    assert err["code"] == "context_length_exceeded" and err["param"] == "prompt"
    assert "at least" in err["message"]  # tokenizing stopped once the prompt could not fit


def test_long_prompts_are_tokenized_one_at_a_time_and_short_ones_do_not_wait(
    model, servers, monkeypatch
):
    engine = ScriptedEngine(model.tokenizer, n_ctx=2**15)  # stops tokenizing early
    app = create_app(model, session_factory=lambda: ScriptedSession(model, engine))
    url = servers.enter_context(_serve(app))
    tok = model.tokenizer
    real, lock = type(tok).encode, threading.Lock()
    running, most = [0], [0]

    def spy(self, text, *a, **kw):
        if len(text) <= LONG_PROMPT_BYTES:
            return real(self, text, *a, **kw)
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            time.sleep(0.5)  # hold the slot long enough for the others to queue
            return real(self, text, *a, **kw)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(type(tok), "encode", spy)
    text = _big_text(tok, LONG_PROMPT_BYTES + 2**17)
    body = {"prompt": text, "max_tokens": 1}
    threads = [threading.Thread(target=_post, args=(url, COMPLETIONS, body, 120)) for _ in range(3)]
    for t in threads:
        t.start()
    while not running[0] and any(t.is_alive() for t in threads):
        time.sleep(0.01)
    engine.say(" short")
    assert _post(url, COMPLETIONS, {"prompt": "hi", "max_tokens": 2}).status_code == 200
    short_done_first = any(t.is_alive() for t in threads)  # 3 x 0.5 s of long ones queued
    for t in threads:
        t.join()
    assert most[0] == 1 and short_done_first


# ---- bodies that never finish ---------------------------------------------------------------


def test_a_body_shorter_than_its_content_length_is_a_408_within_seconds(server):
    host, port = server.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as s:
        t0 = time.monotonic()
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n" + b'{"messages": '
        )
        assert httpx.get(server + "/health", timeout=10).json()["status"] == "ok"
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            reply += chunk
        waited = time.monotonic() - t0
    head, _, payload = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), reply
    assert json.loads(payload)["error"]["code"] == "request_timeout"
    assert BODY_IDLE_S <= waited < BODY_IDLE_S + 20
