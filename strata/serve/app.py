"""The OpenAI-compatible HTTP server: `create_app(model) -> Starlette`.

Endpoints: `POST /v1/chat/completions` and `POST /v1/completions` (JSON or SSE streaming),
`GET /v1/models` (and `/v1/models/{id}`), `GET /health`, `GET /metrics` (Prometheus text).
With an API key, every endpoint but `/health` needs `Authorization: Bearer KEY`.

A request is parsed and validated (`schemas`; `guard`: encodable text, a served `model`),
rendered through the chat template (`prompt`), checked against the context by its size in bytes,
tokenized (parsing, rendering and tokenizing run in worker threads, so that a 16 MB body stalls
no other request), checked by its tokens, then queued as a `Job` for the generation worker
(`scheduler`). Its text pieces go through `output.ChatOutput` (reasoning and tool-call split; the
harmony parser for gpt-oss, chosen once per model from its template and architecture) on the
event loop. A client that goes away cancels its job between tokens: for streams Starlette
notices the disconnect and closes our generator; for plain responses a watcher task waits on the
ASGI `http.disconnect` message. Every failure, whatever the input, is an OpenAI-shaped error.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from strata.config import EngineConfig
from strata.engine.runner import EngineRunner
from strata.engine.sampling import SamplingParams
from strata.engine.session import Session
from strata.model.loader import Model, load_model
from strata.serve import guard, schemas
from strata.serve.harmony import GENERATION_PROMPT, uses_harmony
from strata.serve.http import (
    check_auth,
    error_response,
    http_error,
    read_body,
    sse_response,
    watch_disconnect,
)
from strata.serve.metrics import CONTENT_TYPE, Metrics
from strata.serve.output import SSE_DONE, ChatOutput, sse
from strata.serve.prompt import render_prompt
from strata.serve.reasoning import check_effort, prompt_opens_think
from strata.serve.responses import Envelope, new_id, usage
from strata.serve.runner import make_runner
from strata.serve.scheduler import Job, QueueFull, Scheduler
from strata.serve.schemas import APIError, error_body
from strata.serve.toolcalls import DEFAULT_MAX_CALL_BYTES

log = logging.getLogger("strata.serve")
CLIENT_CLOSED = 499  # nginx's code for "client closed the request": metrics only
LONG_PROMPT_BYTES = 2**20  # prompts over this are tokenized one at a time


@dataclass
class ServerState:
    model: Model
    model_id: str
    scheduler: Scheduler
    metrics: Metrics
    n_ctx: int
    api_key: str | None
    reasoning_effort: str | None
    max_call_bytes: int
    started: int
    names: frozenset[str]  # what a request's `model` may say (guard.model_names)
    longest_token: int  # bytes of the longest token, for the size check before tokenizing
    harmony: bool  # the model speaks harmony (gpt-oss): its prompts and its output parser
    # one long prompt tokenized at a time: its memory is ~200x its size, and a core stays free
    long_prompts: asyncio.Semaphore = dataclasses.field(default_factory=lambda: asyncio.Semaphore())

    @property
    def tokenizer(self):
        return self.model.tokenizer

    def special(self, tid: int | None) -> str:
        return "" if tid is None else self.tokenizer.token_text(tid)

    def parse(self, raw: bytes) -> dict:
        """The JSON body, every string in it encodable (for a worker thread: up to 16 MB)."""
        body = schemas.parse_json(raw)
        guard.check_encodable(body)
        return body

    def check_model(self, requested: str | None) -> None:
        guard.check_model(requested, self.names, self.model_id)

    async def encode(self, text: str, prompt_param: str) -> list[int]:
        """Token ids of prompt text, off the event loop (in a worker thread). A prompt is refused
        by its size in bytes before tokenizing, and tokenizing stops once it cannot fit."""
        nbytes = guard.utf8_len(text, prompt_param)
        guard.prompt_bytes_fit(nbytes, self.n_ctx, self.longest_token, prompt_param)
        limit = self.n_ctx - 1
        if nbytes <= LONG_PROMPT_BYTES:
            ids = await run_in_threadpool(self.tokenizer.encode, text, None, True, limit)
        else:
            async with self.long_prompts:
                ids = await run_in_threadpool(self.tokenizer.encode, text, None, True, limit)
        if len(ids) > limit:
            raise APIError(
                f"This model's maximum context length is {self.n_ctx} tokens. However, your "
                f"prompt is at least {len(ids)} tokens, which leaves no room for a completion.",
                param=prompt_param,
                code="context_length_exceeded",
            )
        return ids

    def fit(self, n_prompt: int, max_tokens: int | None, prompt_param: str) -> int:
        """max_tokens for a prompt of n_prompt tokens; 400 with the numbers when it cannot fit."""
        n_ctx = self.n_ctx
        if max_tokens is None:
            if n_prompt >= n_ctx:
                raise APIError(
                    f"This model's maximum context length is {n_ctx} tokens. However, your "
                    f"prompt is {n_prompt} tokens, which leaves no room for a completion.",
                    param=prompt_param,
                    code="context_length_exceeded",
                )
            return n_ctx - n_prompt
        if n_prompt + max_tokens > n_ctx:
            raise APIError(
                f"This model's maximum context length is {n_ctx} tokens. However, you requested "
                f"{n_prompt + max_tokens} tokens ({n_prompt} in the prompt, {max_tokens} for the "
                f"completion). Please reduce the prompt or max_tokens.",
                param="max_tokens",
                code="context_length_exceeded",
            )
        return max_tokens

    def submit(
        self,
        ids: list[int],
        max_tokens: int,
        sampling: SamplingParams,
        stop: Sequence[str],
        arrived: float,
    ) -> Job:
        job = Job(ids, max_tokens, sampling, stop, asyncio.get_running_loop())
        job.submitted = arrived
        try:
            return self.scheduler.submit(job)
        except QueueFull as e:
            self.metrics.reject()
            raise APIError(
                str(e),
                status=503,
                type="server_error",
                code="queue_full",
                headers={"Retry-After": str(e.retry_after)},
            ) from None


def _finish_hook(metrics: Metrics) -> Callable[[Job, str], None]:
    def on_finish(job: Job, how: str) -> None:
        if job.first_piece is not None:
            metrics.ttft(job.first_piece - job.submitted)
        r = job.result
        metrics.generation(r.prompt_tokens, len(r.tokens), r.decode_s, r.decode_tps)
        if how == "cancelled":
            metrics.cancel()

    return on_finish


# ---- endpoints ---------------------------------------------------------------------------------


async def chat_completions(request: Request, st: ServerState) -> Response:
    arrived = time.monotonic()
    raw = await read_body(request)
    req = await run_in_threadpool(lambda: schemas.parse_chat(st.parse(raw)))
    st.check_model(req.model)
    guard.check_encodable(req.messages, "messages")  # tool-call arguments decoded from JSON
    effort = req.reasoning_effort or st.reasoning_effort
    tools = req.tools if req.tool_choice != "none" else None
    tok = st.tokenizer
    try:
        text = await run_in_threadpool(
            render_prompt,
            req.messages,
            st.model.chat_template,
            tools=tools,
            effort=effort,
            bos_token=st.special(tok.bos_id),
            eos_token=st.special(tok.eos_id),
            harmony=st.harmony,
        )
    except ValueError as e:
        raise APIError(str(e), param="messages", code="invalid_messages") from None
    ids = await st.encode(text, "messages")
    max_tokens = st.fit(len(ids), req.max_tokens, "messages")
    job = st.submit(ids, max_tokens, req.sampling, req.stop, arrived)
    out = ChatOutput(
        in_reasoning=prompt_opens_think(text),
        tools=tools is not None,
        max_call_bytes=st.max_call_bytes,
        harmony=st.harmony,
        in_header=text.endswith(GENERATION_PROMPT),
    )
    env = Envelope(new_id("chatcmpl"), st.model_id)
    if req.stream:
        return sse_response(_chat_stream(job, out, env, req.include_usage))
    res = await _run_to_end(request, job, out.feed)
    if res is None:
        return JSONResponse(error_body("client closed the request"), status_code=CLIENT_CLOSED)
    out.finish()
    u = usage(res.prompt_tokens, len(res.tokens), res.reused_tokens)
    return JSONResponse(env.chat(out.message(), out.finish_reason(res.finish_reason), u))


async def _chat_stream(
    job: Job, out: ChatOutput, env: Envelope, include_usage: bool
) -> AsyncIterator[str]:
    try:
        yield sse(
            env.chat_chunk({"role": "assistant", "content": ""}, with_usage_field=include_usage)
        )
        async for kind, payload in job.events():
            if kind == "piece":
                deltas = out.feed(payload)
            elif kind == "done":
                deltas = out.finish()
            elif kind == "error":
                yield sse(
                    error_body(
                        f"generation failed: {payload}", "server_error", code="generation_failed"
                    )
                )
                break
            else:  # cancelled (server shutting down)
                return
            for d in deltas:
                yield sse(env.chat_chunk(d, with_usage_field=include_usage))
            if kind == "done":
                u = usage(payload.prompt_tokens, len(payload.tokens), payload.reused_tokens)
                fr = out.finish_reason(payload.finish_reason)
                # usage on the last choice chunk unless the client asked for OpenAI's usage chunk
                yield sse(
                    env.chat_chunk(
                        {}, fr, None if include_usage else u, with_usage_field=include_usage
                    )
                )
                if include_usage:
                    yield sse(env.chat_chunk(None, usage_=u))
        yield SSE_DONE
    finally:
        job.cancel()  # no-op when finished; stops generation when the client went away


async def completions(request: Request, st: ServerState) -> Response:
    arrived = time.monotonic()
    raw = await read_body(request)
    req = await run_in_threadpool(lambda: schemas.parse_completion(st.parse(raw)))
    st.check_model(req.model)
    tok = st.tokenizer
    ids = await st.encode(req.prompt, "prompt") if isinstance(req.prompt, str) else req.prompt
    if not ids:
        raise APIError("prompt: the prompt has no tokens", param="prompt", code="invalid_value")
    max_tokens = st.fit(len(ids), req.max_tokens, "prompt")  # first: a long list is refused
    if isinstance(req.prompt, str):
        prompt_text = req.prompt
    else:
        bad = [t for t in ids if not 0 <= t < tok.vocab_size]
        if bad:
            raise APIError(
                f"prompt: token id {bad[0]} is outside the vocabulary of {tok.vocab_size} tokens",
                param="prompt",
                code="invalid_value",
            )
        prompt_text = tok.decode(ids) if req.echo else ""
    job = st.submit(ids, max_tokens, req.sampling, req.stop, arrived)
    env = Envelope(new_id("cmpl"), st.model_id)
    echo = prompt_text if req.echo else ""
    if req.stream:
        return sse_response(_completion_stream(job, env, req.include_usage, echo))
    pieces = [echo]
    res = await _run_to_end(request, job, pieces.append)
    if res is None:
        return JSONResponse(error_body("client closed the request"), status_code=CLIENT_CLOSED)
    u = usage(res.prompt_tokens, len(res.tokens), res.reused_tokens)
    return JSONResponse(env.completion("".join(pieces), res.finish_reason, u))


async def _run_to_end(request: Request, job: Job, on_piece: Callable[[str], object]):
    """Feed the job's pieces to `on_piece`; its `Generation`, or None if the client went away."""
    try:
        async with watch_disconnect(request, job):
            async for kind, payload in job.events():
                if kind == "piece":
                    on_piece(payload)
                elif kind == "done":
                    return payload
                elif kind == "error":
                    raise APIError(
                        f"generation failed: {payload}",
                        status=500,
                        type="server_error",
                        code="generation_failed",
                    )
    finally:
        job.cancel()  # no-op when finished
    return None


async def _completion_stream(
    job: Job, env: Envelope, include_usage: bool, echo: str
) -> AsyncIterator[str]:
    kw = {"chunk": True, "with_usage_field": include_usage}
    try:
        if echo:
            yield sse(env.completion(echo, None, **kw))
        async for kind, payload in job.events():
            if kind == "piece":
                yield sse(env.completion(payload, None, **kw))
            elif kind == "done":
                u = usage(payload.prompt_tokens, len(payload.tokens), payload.reused_tokens)
                yield sse(
                    env.completion("", payload.finish_reason, None if include_usage else u, **kw)
                )
                if include_usage:
                    yield sse(env.completion(None, None, u, **kw))
            elif kind == "error":
                yield sse(
                    error_body(
                        f"generation failed: {payload}", "server_error", code="generation_failed"
                    )
                )
            else:
                return
        yield SSE_DONE
    finally:
        job.cancel()


async def list_models(request: Request, st: ServerState) -> Response:
    return JSONResponse({"object": "list", "data": [_model_card(st)]})


async def get_model(request: Request, st: ServerState) -> Response:
    mid = request.path_params["model_id"]
    if mid not in st.names:
        raise guard.unknown_model(mid, st.model_id)
    return JSONResponse(_model_card(st))


def _model_card(st: ServerState) -> dict:
    return {
        "id": st.model_id,
        "object": "model",
        "created": st.started,
        "owned_by": "strata",
        "context_length": st.n_ctx,
        "architecture": st.model.args.arch,
    }


async def health(request: Request, st: ServerState) -> Response:
    s = st.scheduler
    return JSONResponse(
        {
            "status": "ok",
            "model": st.model_id,
            "slots": s.slots,
            "active": s.active,
            "queued": s.queued,
        }
    )


async def metrics(request: Request, st: ServerState) -> Response:
    s = st.scheduler
    text = st.metrics.render(
        queued=s.queued,
        active=s.active,
        slots=s.slots,
        engine_stats=[getattr(e, "stats", None) for e in getattr(s.runner, "engines", [])],
        batch=s.runner.stats,
        preemptions=s.preemptions,
    )
    return Response(text, media_type=CONTENT_TYPE)


# ---- plumbing ----------------------------------------------------------------------------------


Handler = Callable[[Request, ServerState], Awaitable[Response]]


def _endpoint(st: ServerState, name: str, fn: Handler, auth: bool = True):
    async def handle(request: Request) -> Response:
        try:
            if auth and st.api_key:
                check_auth(request, st.api_key)
            resp = await fn(request, st)
        except APIError as e:
            resp = error_response(e)
        except ClientDisconnect:
            resp = Response(status_code=CLIENT_CLOSED)
        except Exception:  # never crash on input we did not foresee; say so and log it
            log.exception("unhandled error in %s", name)
            resp = error_response(
                APIError(
                    "internal server error", status=500, type="server_error", code="internal_error"
                )
            )
        st.metrics.request(name, resp.status_code)
        return resp

    return handle


def create_app(
    model: str | os.PathLike | Model,
    *,
    api_key: str | None = None,
    reasoning_effort: str | None = None,
    max_queue: int = 64,
    slots: int = 1,
    n_ctx: int | None = None,
    config: EngineConfig | None = None,
    model_id: str | None = None,
    session_factory: Callable[[], Session] | None = None,
    max_call_bytes: int = DEFAULT_MAX_CALL_BYTES,
) -> Starlette:
    """The server app for `model` (a GGUF path or a loaded `Model`).

    At most `slots` generations run at once, as one batch (continuous batching); more wait in a
    queue of `max_queue`. The batch runs on `make_runner` (built from `config`: expert cache, CAR,
    traces; without one, plain engines); `n_ctx` (default min(train context, 4096)) overrides
    `config.n_ctx`. `session_factory` instead gives one engine per slot as a `Session` (tests).
    """
    check_effort(reasoning_effort)
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    if not isinstance(model, Model):
        model = load_model(model)
    if session_factory is None:
        runner = make_runner(model, config, slots, n_ctx)
    else:
        runner = EngineRunner([session_factory() for _ in range(slots)])
    scheduler = Scheduler(runner, model.tokenizer, max_queue=max_queue)
    model_id = model_id or Path(model.path).stem
    st = ServerState(
        model=model,
        model_id=model_id,
        scheduler=scheduler,
        metrics=Metrics(),
        n_ctx=runner.n_ctx,
        api_key=api_key or None,
        reasoning_effort=reasoning_effort,
        max_call_bytes=max_call_bytes,
        started=int(time.time()),
        names=guard.model_names(model_id, model.path),
        longest_token=guard.longest_token_bytes(model.tokenizer),
        harmony=uses_harmony(model.chat_template, model.args.arch),
    )
    scheduler.on_finish = _finish_hook(st.metrics)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        scheduler.start()
        try:
            yield
        finally:
            await run_in_threadpool(scheduler.stop)

    routes = [
        Route("/v1/chat/completions", _endpoint(st, "chat", chat_completions), methods=["POST"]),
        Route("/v1/completions", _endpoint(st, "completions", completions), methods=["POST"]),
        Route("/v1/models", _endpoint(st, "models", list_models), methods=["GET"]),
        Route("/v1/models/{model_id:path}", _endpoint(st, "models", get_model), methods=["GET"]),
        Route("/health", _endpoint(st, "health", health, auth=False), methods=["GET"]),
        Route("/metrics", _endpoint(st, "metrics", metrics), methods=["GET"]),
    ]
    app = Starlette(
        routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error}
    )
    app.state.strata = st
    return app
