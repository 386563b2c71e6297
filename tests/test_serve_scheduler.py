"""The generation worker: turns between slots, the bounded queue, cancellation between tokens."""

from __future__ import annotations

import asyncio
import threading

import pytest

from strata.engine.sampling import SamplingParams
from strata.serve.scheduler import Job, QueueFull, Scheduler


class FakeSession:
    """Yields "<k><i>" for prompt [k]; records every step in a shared log."""

    engine = None

    def __init__(self, log: list, first_step: threading.Event | None = None):
        self.log, self.first_step = log, first_step
        self.closed = False

    def generate(self, prompt, max_tokens, sampling, stop, result):
        try:
            for i in range(max_tokens):
                if self.first_step is not None and not self.log:
                    self.first_step.wait(10)
                self.log.append((prompt[0], i))
                result.tokens.append(i)
                yield f"{prompt[0]}{i}"
            result.finish_reason = "length"
        except GeneratorExit:
            self.closed = True
            raise


async def _collect(job: Job) -> list:
    return [ev async for ev in job.events()]


def _job(k: int, n: int) -> Job:
    return Job([k], n, SamplingParams(), [], asyncio.get_running_loop())


def test_two_slots_take_turns_one_token_each():
    log: list = []
    go = threading.Event()

    async def main():
        s = Scheduler([FakeSession(log, go), FakeSession(log, go)], max_queue=0)
        a = s.submit(_job(1, 3))
        await asyncio.sleep(0.05)  # job 1 is in its first step, waiting for `go`
        b = s.submit(_job(2, 3))
        go.set()
        ea, eb = await asyncio.gather(_collect(a), _collect(b))
        s.stop()
        return ea, eb

    ea, eb = asyncio.run(main())
    assert log == [(1, 0), (1, 1), (2, 0), (1, 2), (2, 1), (2, 2)]
    assert [p for k, p in ea if k == "piece"] == ["10", "11", "12"]
    assert eb[-1][0] == "done" and eb[-1][1].finish_reason == "length"


def test_a_full_scheduler_refuses_with_a_retry_after():
    async def main():
        gate = threading.Event()
        s = Scheduler([FakeSession([], gate)], max_queue=1)
        jobs = [s.submit(_job(k, 2)) for k in (1, 2)]
        with pytest.raises(QueueFull) as e:
            s.submit(_job(3, 2))
        assert e.value.retry_after >= 1
        gate.set()
        await asyncio.gather(*(_collect(j) for j in jobs))
        s.stop()

    asyncio.run(main())


def test_cancelling_a_running_job_closes_its_generator_between_tokens():
    session = FakeSession([])

    async def main():
        s = Scheduler([session], max_queue=4)
        job = s.submit(_job(1, 10_000))
        events = []
        async for kind, _ in job.events():
            events.append(kind)
            if len(events) == 3:
                job.cancel()
        s.stop()
        return events

    events = asyncio.run(main())
    assert events[-1] == "cancelled" and session.closed
    assert events.count("piece") < 10_000  # stopped early, not run to max_tokens


def test_cancelling_a_queued_job_removes_it_from_the_queue():
    gate = threading.Event()

    async def main():
        s = Scheduler([FakeSession([], gate)], max_queue=4)
        first = s.submit(_job(1, 1))
        await asyncio.sleep(0.05)
        queued = s.submit(_job(2, 1))
        assert s.queued == 1
        queued.cancel()
        assert s.queued == 0
        assert [k async for k, _ in queued.events()] == ["cancelled"]
        gate.set()
        assert (await _collect(first))[-1][0] == "done"
        s.stop()

    asyncio.run(main())
