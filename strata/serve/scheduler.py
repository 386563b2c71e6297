"""Generation jobs and the worker thread that runs them on the engine.

The engine is single-sequence and blocking, so one worker thread owns it. A request becomes a
`Job`; the worker admits jobs into `slots` generation slots (each slot a `Session` with its own
KV cache) and, when more than one is admitted, advances them in turns, one text piece (about one
token) each. Jobs beyond the slots wait in a queue bounded by `max_queue`; a full queue refuses
new jobs (`QueueFull`, the server's 503). A job is cancelled between tokens: the worker closes its
generator, so the session's KV cache stays consistent for the next request's prefix reuse.

Events reach the asyncio side through `loop.call_soon_threadsafe`; `Job.events()` yields
("piece", str) for each text piece, then exactly one of ("done", Generation),
("error", message) or ("cancelled", None).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, Protocol

from strata.engine.sampling import SamplingParams
from strata.engine.session import Generation

log = logging.getLogger("strata.serve")
_END = frozenset({"done", "error", "cancelled"})


class SessionLike(Protocol):
    engine: Any

    def generate(
        self,
        prompt: Sequence[int],
        max_tokens: int,
        sampling: SamplingParams,
        stop: Sequence[str],
        result: Generation,
    ) -> Iterator[str]: ...


class QueueFull(Exception):
    def __init__(self, retry_after: int):
        super().__init__(f"the request queue is full; retry in {retry_after} s")
        self.retry_after = retry_after


class Job:
    def __init__(
        self,
        prompt: list[int],
        max_tokens: int,
        sampling: SamplingParams,
        stop: Sequence[str],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.prompt, self.max_tokens, self.sampling, self.stop = prompt, max_tokens, sampling, stop
        self.result = Generation()
        self.loop = loop
        self.submitted = time.monotonic()
        self.started: float | None = None  # monotonic time it got a slot
        self.first_piece: float | None = None  # monotonic time of the first text piece
        self._queue: asyncio.Queue = asyncio.Queue()
        self._cancel = threading.Event()
        self._ended = False
        self.scheduler: Scheduler | None = None

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def cancel(self) -> None:
        """Stop this job at the next token (or drop it from the queue). Safe from any thread."""
        if self._ended or self._cancel.is_set():
            return
        self._cancel.set()
        if self.scheduler is not None:
            self.scheduler._discard(self)

    def _emit(self, kind: str, payload: Any) -> None:
        if kind in _END:
            if self._ended:
                return
            self._ended = True
        try:
            self.loop.call_soon_threadsafe(self._queue.put_nowait, (kind, payload))
        except RuntimeError:  # the event loop is gone (server shutting down)
            self._cancel.set()

    async def events(self) -> AsyncIterator[tuple[str, Any]]:
        while True:
            kind, payload = await self._queue.get()
            yield kind, payload
            if kind in _END:
                return


class Scheduler:
    def __init__(self, sessions: Sequence[SessionLike], max_queue: int = 64) -> None:
        if not sessions:
            raise ValueError("the scheduler needs at least one session (slot)")
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.sessions = list(sessions)
        self.max_queue = max_queue
        self._pending: deque[Job] = deque()
        self._active: list[tuple[Job, Iterator[str], SessionLike]] = []
        self._free = list(self.sessions)
        self._cond = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._job_seconds = 1.0  # running mean of a job's time in a slot, for Retry-After
        self.on_finish: Callable[[Job, str], None] | None = None

    @property
    def slots(self) -> int:
        return len(self.sessions)

    @property
    def queued(self) -> int:
        return len(self._pending)

    @property
    def active(self) -> int:
        return len(self._active)

    def start(self) -> None:
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._stop = False
                self._thread = threading.Thread(
                    target=self._run, name="strata-generate", daemon=True
                )
                self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        for session in self.sessions:  # flush traces, stop CPU pools
            close = getattr(session.engine, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:
                    log.exception("closing an engine failed")

    def retry_after(self) -> int:
        """Seconds until a place in the queue is likely to free up (one job's time per slot)."""
        return max(1, min(60, math.ceil(self._job_seconds / self.slots)))

    def submit(self, job: Job) -> Job:
        """Queue `job`; QueueFull when slots and queue are all taken."""
        self.start()
        with self._cond:
            if len(self._pending) + len(self._active) >= self.slots + self.max_queue:
                raise QueueFull(self.retry_after())
            job.scheduler = self
            self._pending.append(job)
            self._cond.notify_all()
        return job

    def _discard(self, job: Job) -> None:
        with self._cond:
            try:
                self._pending.remove(job)
            except ValueError:
                return  # running: the worker sees the flag between tokens
        job._emit("cancelled", None)
        self._finished(job, "cancelled")

    def _finished(self, job: Job, how: str) -> None:
        if how == "done":
            spent = time.monotonic() - (job.started or job.submitted)
            self._job_seconds = 0.8 * self._job_seconds + 0.2 * spent
        if self.on_finish is not None:
            try:
                self.on_finish(job, how)
            except Exception:  # metrics must never stop the worker
                log.exception("on_finish hook failed")

    def _admit(self) -> None:
        while self._free and self._pending:
            job = self._pending.popleft()
            session = self._free.pop()
            gen = session.generate(job.prompt, job.max_tokens, job.sampling, job.stop, job.result)
            job.started = time.monotonic()
            self._active.append((job, gen, session))

    def _run(self) -> None:
        while True:
            with self._cond:
                self._admit()
                while not self._active and not self._stop:
                    self._cond.wait()
                    self._admit()
                if self._stop:
                    for job, gen, _ in self._active:
                        gen.close()
                        job._emit("cancelled", None)
                    for job in self._pending:
                        job._emit("cancelled", None)
                    self._active.clear()
                    self._pending.clear()
                    return
                turn = list(self._active)
            for entry in turn:  # one piece each: turns at token granularity
                self._step(*entry)

    def _step(self, job: Job, gen: Iterator[str], session: SessionLike) -> None:
        how = None
        if job.cancelled:
            gen.close()
            job._emit("cancelled", None)
            how = "cancelled"
        else:
            try:
                piece = next(gen)
            except StopIteration:
                job._emit("done", job.result)
                how = "done"
            except Exception as e:  # a failed generation ends its request, never the worker
                log.exception("generation failed")
                gen.close()
                job._emit("error", " ".join(str(e).split()) or type(e).__name__)
                how = "error"
            else:
                if job.first_piece is None:
                    job.first_piece = time.monotonic()
                job._emit("piece", piece)
        if how is not None:
            with self._cond:
                self._active.remove((job, gen, session))
                self._free.append(session)
            self._finished(job, how)
