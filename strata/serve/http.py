"""HTTP plumbing of the server: body limits and read timeout, auth, disconnects, SSE, errors."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
from collections.abc import AsyncIterator

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from strata.serve.scheduler import Job
from strata.serve.schemas import APIError, error_body

MAX_BODY_BYTES = 16 * 2**20
BODY_IDLE_S = 5.0  # longest pause while a request body arrives


def error_response(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


async def read_body(request: Request, idle_s: float = BODY_IDLE_S) -> bytes:
    """The request body, at most MAX_BODY_BYTES (413); 408 when the client stops sending for
    `idle_s` (a Content-Length larger than the body would otherwise hold the request open)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise APIError(
            f"request body of {declared} bytes is over the {MAX_BODY_BYTES} limit",
            status=413,
            code="request_too_large",
        )
    chunks, n = [], 0
    while True:
        try:
            message = await asyncio.wait_for(request.receive(), idle_s)
        except TimeoutError:
            raise APIError(
                f"the request body stopped arriving: nothing came for {idle_s:g} s after "
                f"{n} bytes{f' of the {declared} declared' if declared else ''}",
                status=408,
                code="request_timeout",
                headers={"Connection": "close"},
            ) from None
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        n += len(chunk)
        if n > MAX_BODY_BYTES:
            raise APIError(
                f"request body is over the {MAX_BODY_BYTES} byte limit",
                status=413,
                code="request_too_large",
            )
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def cancel_on_disconnect(request: Request, job: Job) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel()
            return


def sse_response(gen: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(
        gen,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@contextlib.asynccontextmanager
async def watch_disconnect(request: Request, job: Job):
    watcher = asyncio.create_task(cancel_on_disconnect(request, job))
    try:
        yield
    finally:
        watcher.cancel()


def check_auth(request: Request, key: str) -> None:
    got = request.headers.get("authorization", "")
    scheme, _, token = got.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        raise APIError(
            "Incorrect API key provided. Send it as 'Authorization: Bearer KEY'."
            if got
            else "Missing API key. Send it as 'Authorization: Bearer KEY'.",
            status=401,
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    return JSONResponse(
        error_body(str(exc.detail), code=code), status_code=exc.status_code, headers=exc.headers
    )
