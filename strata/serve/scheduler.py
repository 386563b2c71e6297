"""Generation jobs and the continuous-batching worker that runs them on a `BatchRunner`.

One worker thread owns the runner. A request becomes a `Job`; between steps the worker retires
finished and cancelled jobs, then admits queued jobs while fewer than `runner.max_batch` run. Each
step spends at most `PREFILL_CHUNK` prompt tokens on admitted prompts (oldest first, so a long
prompt runs in chunks), then one decode step feeds every running sequence its last sampled token;
each row of logits is sampled with its job's own `Sampler` and turned into text by its job's
`TextStream`. Jobs beyond the batch wait in a queue bounded by `max_queue`; a full queue refuses
new jobs (`QueueFull`, the server's 503). A job is cancelled between steps.

When the runner's KV cache is full (`KvFull` from a decode step), the newest running sequence is
preempted: released, and queued first to be admitted again with its prompt plus the tokens it
made; its text state stays, so its stream resumes with no text lost or repeated.

Events reach the asyncio side through `loop.call_soon_threadsafe`; `Job.events()` yields
("piece", str) for each text piece, then exactly one of ("done", Generation),
("error", message) or ("cancelled", None).

B = sequences in a decode step, V = vocab.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from strata.engine.batch_api import BatchRunner, KvFull
from strata.engine.sampling import Sampler, SamplingParams
from strata.engine.session import Generation, TextStream

log = logging.getLogger("strata.serve")
_END = frozenset({"done", "error", "cancelled"})
PREFILL_CHUNK = 256  # prompt tokens a step, so that running streams keep flowing


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
        self.started: float | None = None  # monotonic time it was first admitted
        self.first_piece: float | None = None  # monotonic time of the first text piece
        self._queue: asyncio.Queue = asyncio.Queue()
        self._cancel = threading.Event()
        self._ended = False
        self.scheduler: Scheduler | None = None
        # the worker's state of this job
        self.seq: int | None = None  # the runner's name for it while admitted
        self.todo = 0  # prompt tokens still to run
        self.next_token: int | None = None  # sampled, not yet fed to a decode step
        self.sampler: Sampler | None = None
        self.text: TextStream | None = None
        self.preemptions = 0
        self._t_admit = 0.0  # perf_counter at its first admission
        self._t_first: float | None = None  # perf_counter when its first token was sampled

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def cancel(self) -> None:
        """Stop this job at the next step (or drop it from the queue). Safe from any thread."""
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
    def __init__(self, runner: BatchRunner, tokenizer: Any, max_queue: int = 64) -> None:
        if runner.max_batch < 1:
            raise ValueError(f"the runner's max_batch must be >= 1, got {runner.max_batch}")
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.runner, self.tokenizer, self.max_queue = runner, tokenizer, max_queue
        self._pending: deque[Job] = deque()
        self._running: list[Job] = []  # in admission order: the last is the newest
        self._admitting: Job | None = None  # off the queue, not yet running
        self._cond = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._job_seconds = 1.0  # running mean of a job's time in the batch, for Retry-After
        self._seqs = itertools.count()
        self._hold = False  # after a preemption, admit nothing until a job ends
        self.preemptions = 0
        self.on_finish: Callable[[Job, str], None] | None = None

    @property
    def slots(self) -> int:
        return self.runner.max_batch

    @property
    def queued(self) -> int:
        return len(self._pending)

    @property
    def active(self) -> int:
        return len(self._running)

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
        close = getattr(self.runner, "close", None)  # flush traces, stop CPU pools
        if callable(close):
            try:
                close()
            except Exception:
                log.exception("closing the runner failed")

    def retry_after(self) -> int:
        """Seconds until a place in the queue is likely to free up (one job's time per slot)."""
        return max(1, min(60, math.ceil(self._job_seconds / self.slots)))

    def submit(self, job: Job) -> Job:
        """Queue `job`; QueueFull when the batch and the queue are all taken."""
        self.start()
        with self._cond:
            held = len(self._pending) + len(self._running) + (self._admitting is not None)
            if held >= self.slots + self.max_queue:
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
                return  # running: the worker sees the flag between steps
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

    # ---- the worker --------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._running and not self._pending and not self._stop:
                    self._cond.wait()
                if self._stop:
                    for job in self._running:
                        self._release(job)
                        job._emit("cancelled", None)
                    for job in self._pending:
                        job._emit("cancelled", None)
                    self._running.clear()
                    self._pending.clear()
                    return
            try:
                self._step()
            except Exception as e:  # a failing runner ends the jobs it ran, never the worker
                log.exception("generation failed")
                msg = " ".join(str(e).split()) or type(e).__name__
                for job in list(self._running):
                    self._retire(job, "error", msg)

    def _step(self) -> None:
        """Retire cancelled jobs, admit queued ones, run a prefill budget, then a decode step."""
        for job in [j for j in self._running if j.cancelled]:
            self._retire(job, "cancelled")
        self._admit()
        budget = PREFILL_CHUNK
        for job in [j for j in self._running if j.todo > 0]:
            if budget <= 0:
                break
            n = min(budget, job.todo)
            budget -= n
            logits = self.runner.prefill(job.seq, n)  # [V] once the prompt has run
            job.todo = 0 if logits is not None else max(job.todo - n, 1)
            if logits is not None:
                self._take(job, logits)
        self._decode()

    def _admit(self) -> None:
        while len(self._running) < self.slots and not self._hold:
            with self._cond:
                if not self._pending:
                    return
                job = self._admitting = self._pending.popleft()
            try:
                if not self._admit_one(job):
                    return
            finally:
                self._admitting = None

    def _admit_one(self, job: Job) -> bool:
        """Admit `job` into the batch (or answer it) -> False where the KV cache is full."""
        if job.cancelled:  # popped before cancel() could take it from the queue
            self._retire(job, "cancelled")
            return True
        if job.text is None:  # first admission
            tokens = job.prompt
        else:  # after a preemption: its prompt and the tokens fed since
            tokens = job.prompt + job.result.tokens
        seq = next(self._seqs)
        try:
            reused = self.runner.admit(seq, tokens)
        except KvFull:
            if self._running:  # room comes back as running jobs end
                with self._cond:
                    self._pending.appendleft(job)
                return False
            self._retire(job, "error", "the KV cache cannot hold this prompt")
            return True
        except Exception as e:  # e.g. ValueError: longer than the context
            if not isinstance(e, ValueError):
                log.exception("admitting a sequence failed")
            self._retire(job, "error", " ".join(str(e).split()) or type(e).__name__)
            return True
        job.seq, job.todo = seq, max(len(tokens) - reused, 1)  # prefill gives its logits
        if job.text is None:
            job.started, job._t_admit = time.monotonic(), time.perf_counter()
            job.result.prompt_tokens = len(job.prompt)
            job.result.reused_tokens = reused
            max_tokens = min(job.max_tokens, self.runner.n_ctx - len(job.prompt))
            job.sampler = Sampler(job.sampling)
            job.text = TextStream(self.tokenizer, max_tokens, job.stop, job.result)
        self._running.append(job)
        return True

    def _take(self, job: Job, logits) -> None:
        """Sample `job`'s next token from its logits [V] and hand out the text it makes."""
        job.next_token = None  # resumed after a preemption: it was the new prompt's last
        tok = job.sampler(logits)
        if job._t_first is None:
            job._t_first = time.perf_counter()
            job.result.prefill_s = job._t_first - job._t_admit
        piece = job.text.push(tok)
        if job.text.done:
            piece += job.text.close()
        if piece:
            if job.first_piece is None:
                job.first_piece = time.monotonic()
            job._emit("piece", piece)
        if job.text.done:
            self._retire(job, "done")
        else:
            job.next_token = tok

    def _decode(self) -> None:
        while True:
            rows = [j for j in self._running if j.todo == 0 and j.next_token is not None]
            if not rows:
                return
            try:
                logits = self.runner.decode([j.seq for j in rows], [j.next_token for j in rows])
            except KvFull:
                self._preempt()
                continue
            for job, row in zip(rows, logits, strict=True):  # row: [V]
                job.next_token = None
                self._take(job, row)
            return

    def _preempt(self) -> None:
        """Free KV for the others: the newest running job goes back to the queue's front."""
        job = self._running[-1]
        if len(self._running) == 1:  # nothing else holds KV: this sequence alone fills it
            self._retire(job, "done")
            return
        self._running.pop()
        self._release(job)
        job.todo = 0
        job.preemptions += 1
        self.preemptions += 1
        self._hold = True
        with self._cond:
            self._pending.appendleft(job)

    def _release(self, job: Job) -> None:
        try:
            self.runner.release(job.seq)
        except Exception:  # a broken runner must not stop the worker
            log.exception("releasing a sequence failed")
        job.seq = None

    def _retire(self, job: Job, how: str, message: str | None = None) -> None:
        if job in self._running:
            self._running.remove(job)
            self._release(job)
            self._hold = False
        if job._t_first is not None:
            job.result.decode_s = time.perf_counter() - job._t_first
        if how == "done":
            if job.text is not None and not job.text.done:  # the KV cache could hold no more
                piece = job.text.close()
                if piece:
                    job._emit("piece", piece)
            job._emit("done", job.result)
        elif how == "error":
            job._emit("error", message)
        else:
            job._emit("cancelled", None)
        self._finished(job, how)
