"""The continuous-batching worker against a scripted runner: one decode step for every running
job, the bounded queue, cancellation between steps, prompts prefilled in chunks between decode
steps, and preemption when the KV cache is full (every stream complete, no text lost or
repeated)."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from strata.engine.batch_api import BatchStats, KvFull
from strata.engine.sampling import SamplingParams
from strata.serve.scheduler import PREFILL_CHUNK, Job, QueueFull, Scheduler

V = 64  # vocab of the scripted runner; token 0 ends the text
EOS = 0


class Tok:
    """Token t reads as "<t>"; token 0 is end-of-text."""

    eos_ids = frozenset({EOS})

    def stream(self):
        class Dec:
            def push(self, t: int) -> str:
                return f"<{t}>"

            def flush(self) -> str:
                return ""

        return Dec()


def next_token(history: list[int]) -> int:
    """The scripted model: the next token follows from the whole sequence so far."""
    return (sum(history) * 7 + len(history) * 3) % (V - 1) + 1


class FakeRunner:
    """A `BatchRunner` whose logits pick `next_token` of each sequence; logs every call; raises
    KvFull at the decode calls named in `full_at` (0-based) before changing anything."""

    def __init__(self, max_batch: int, n_ctx: int = 4096, full_at=(), gate=None):
        self.max_batch, self.n_ctx = max_batch, n_ctx
        self.stats = BatchStats(kv_blocks_total=max_batch)
        self.seqs: dict[int, list] = {}  # seq -> [tokens run, prompt tokens not run]
        self.log: list[tuple] = []
        self.full_at, self.decodes, self.gate = set(full_at), 0, gate
        self.hold_decode: threading.Event | None = None

    def _logits(self, history: list[int]) -> np.ndarray:
        row = np.zeros(V, np.float32)  # [V]
        row[next_token(history)] = 10.0
        return row

    def admit(self, seq, tokens):
        if self.gate is not None:
            assert self.gate.wait(10)
        if len(tokens) > self.n_ctx - 1:
            raise ValueError("prompt too long")
        if len(self.seqs) >= self.max_batch:
            raise KvFull()
        self.seqs[seq] = [[], list(tokens)]
        self.log.append(("admit", seq, len(tokens)))
        return 0

    def prefill(self, seq, budget):
        ran, todo = self.seqs[seq]
        chunk = todo[:budget]
        ran += chunk
        del todo[:budget]
        self.log.append(("prefill", seq, len(chunk)))
        return None if todo else self._logits(ran)

    def decode(self, seqs, tokens):
        for gate in (self.gate, self.hold_decode):
            assert gate is None or gate.wait(10)
        self.decodes += 1
        if self.decodes - 1 in self.full_at:
            self.log.append(("full", tuple(seqs)))
            raise KvFull()
        self.log.append(("decode", tuple(seqs)))
        out = np.stack(
            [self._logits(self.seqs[q][0] + [t]) for q, t in zip(seqs, tokens, strict=True)]
        )
        for q, t in zip(seqs, tokens, strict=True):
            self.seqs[q][0].append(t)
        self.stats.batch_steps += 1
        self.stats.batch_rows += len(seqs)
        return out  # [B, V]

    def release(self, seq):
        self.seqs.pop(seq)
        self.log.append(("release", seq))


def alone(prompt: list[int], n: int) -> list[int]:
    """The tokens `prompt` makes on its own, greedy, up to n (stopping at end-of-text)."""
    seq, out = list(prompt), []
    while len(out) < n and (t := next_token(seq)) != EOS:
        out.append(t)
        seq.append(t)
    return out


def _text(tokens: list[int]) -> str:
    return "".join(f"<{t}>" for t in tokens)


async def _collect(job: Job) -> list:
    return [ev async for ev in job.events()]


def _job(prompt: list[int], n: int, stop=()) -> Job:
    return Job(prompt, n, SamplingParams(), list(stop), asyncio.get_running_loop())


def _run(runner: FakeRunner, jobs: list[tuple[list[int], int]], max_queue: int = 16):
    """Run `jobs`, all queued before the worker admits the first."""
    runner.gate = threading.Event()

    async def main():
        s = Scheduler(runner, Tok(), max_queue=max_queue)
        subs = [s.submit(_job(p, n)) for p, n in jobs]
        runner.gate.set()
        evs = await asyncio.gather(*(_collect(j) for j in subs))
        s.stop()
        return s, subs, evs

    return asyncio.run(main())


def _pieces(events: list) -> str:
    return "".join(p for k, p in events if k == "piece")


PROMPTS = [([3, 5], 9), ([11], 7), ([2, 2, 2], 12), ([40, 1], 5)]


def test_running_jobs_decode_in_one_step_and_each_makes_its_own_tokens():
    runner = FakeRunner(max_batch=4)
    s, jobs, evs = _run(runner, PROMPTS)
    for (p, n), job, ev in zip(PROMPTS, jobs, evs, strict=True):
        assert job.result.tokens == alone(p, n)
        assert _pieces(ev) == _text(alone(p, n)) == job.result.text
        assert ev[-1][0] == "done"
    assert max(len(e[1]) for e in runner.log if e[0] == "decode") == 4
    assert runner.seqs == {}  # every sequence released


def test_more_jobs_than_the_batch_wait_and_take_freed_places():
    runner = FakeRunner(max_batch=2)
    s, jobs, evs = _run(runner, PROMPTS)
    assert all(len(e[1]) <= 2 for e in runner.log if e[0] == "decode")
    for (p, n), job in zip(PROMPTS, jobs, strict=True):
        assert job.result.tokens == alone(p, n)


def test_a_full_scheduler_refuses_with_a_retry_after():
    async def main():
        gate = threading.Event()
        s = Scheduler(FakeRunner(1, gate=gate), Tok(), max_queue=1)
        jobs = [s.submit(_job([k], 2)) for k in (1, 2)]
        with pytest.raises(QueueFull) as e:
            s.submit(_job([3], 2))
        assert e.value.retry_after >= 1
        gate.set()
        await asyncio.gather(*(_collect(j) for j in jobs))
        s.stop()

    asyncio.run(main())


def test_cancelling_a_running_job_releases_it_between_steps():
    runner = FakeRunner(max_batch=2)

    async def main():
        s = Scheduler(runner, Tok(), max_queue=4)
        job = s.submit(_job([1], 10_000))
        other = s.submit(_job([5], 6))
        events = []
        async for kind, _ in job.events():
            events.append(kind)
            if len(events) == 3:
                job.cancel()
        rest = await _collect(other)
        s.stop()
        return events, rest

    events, rest = asyncio.run(main())
    assert events[-1] == "cancelled" and events.count("piece") < 10_000
    assert ("release", 0) in runner.log and runner.seqs == {}
    assert _pieces(rest) == _text(alone([5], 6))  # the other stream is untouched


def test_cancelling_a_queued_job_removes_it_from_the_queue():
    gate = threading.Event()

    async def main():
        s = Scheduler(FakeRunner(1, gate=gate), Tok(), max_queue=4)
        first = s.submit(_job([1], 2))
        await asyncio.sleep(0.05)
        queued = s.submit(_job([2], 1))
        assert s.queued == 1
        queued.cancel()
        assert s.queued == 0
        assert [k async for k, _ in queued.events()] == ["cancelled"]
        gate.set()
        assert (await _collect(first))[-1][0] == "done"
        s.stop()

    asyncio.run(main())


def test_a_long_prompt_is_prefilled_in_chunks_between_decode_steps():
    runner = FakeRunner(max_batch=2)
    gate = runner.hold_decode = threading.Event()
    long = list(np.random.default_rng(0).integers(1, V, 2 * PREFILL_CHUNK + 40))

    async def main():
        s = Scheduler(runner, Tok(), max_queue=4)
        short = s.submit(_job([7], 12))
        await asyncio.sleep(0.05)  # the short job is decoding (held at its first decode)
        big = s.submit(_job(long, 3))
        gate.set()
        evs = await asyncio.gather(_collect(short), _collect(big))
        s.stop()
        return short, big, evs

    short, big, evs = asyncio.run(main())
    big_seq = next(e[1] for e in runner.log if e[0] == "admit" and e[2] == len(long))
    order = [e[0] for e in runner.log if e[0] == "decode" or e[:2] == ("prefill", big_seq)]
    chunks = [e[2] for e in runner.log if e[:2] == ("prefill", big_seq)]
    assert chunks == [PREFILL_CHUNK, PREFILL_CHUNK, 40]
    first = order.index("prefill")
    assert order[first : first + 5] == ["prefill", "decode", "prefill", "decode", "prefill"]
    assert short.result.tokens == alone([7], 12) and big.result.tokens == alone(long, 3)


@pytest.mark.parametrize("full_at", [{3}, {2, 3}, {1, 6, 7, 12}])
def test_a_full_kv_cache_preempts_the_newest_and_every_stream_completes(full_at):
    runner = FakeRunner(max_batch=4, full_at=full_at)
    s, jobs, evs = _run(runner, PROMPTS)
    for (p, n), job, ev in zip(PROMPTS, jobs, evs, strict=True):
        assert ev[-1][0] == "done"
        assert job.result.tokens == alone(p, n)
        assert _pieces(ev) == _text(alone(p, n))  # nothing repeated, nothing lost
    assert s.preemptions == len(full_at)
    victims = [e[1][-1] for e in runner.log if e[0] == "full"]
    assert all(("release", v) in runner.log for v in victims)  # the newest was released
    assert runner.seqs == {}


def test_a_sequence_that_alone_fills_the_kv_cache_ends_with_length():
    runner = FakeRunner(max_batch=1, full_at={2})
    s, jobs, evs = _run(runner, [([3], 10)])
    assert evs[0][-1][0] == "done" and jobs[0].result.finish_reason == "length"
    assert jobs[0].result.tokens == alone([3], 3)
    assert _pieces(evs[0]) == _text(alone([3], 3))


def test_a_prompt_the_runner_refuses_ends_in_an_error_and_the_others_go_on():
    runner = FakeRunner(max_batch=2, n_ctx=8)
    s, jobs, evs = _run(runner, [(list(range(1, 12)), 3), ([4], 3)])
    assert evs[0] == [("error", "prompt too long")]
    assert evs[1][-1][0] == "done" and jobs[1].result.tokens == alone([4], 3)


def test_a_stop_string_across_tokens_is_held_back_and_never_sent():
    runner = FakeRunner(max_batch=2)
    want = alone([3, 5], 9)
    stop = f"{want[3]}><{want[4]}"  # spans the 4th and 5th tokens' text

    async def main():
        s = Scheduler(runner, Tok(), max_queue=4)
        job = s.submit(_job([3, 5], 9, stop=[stop]))
        ev = await _collect(job)
        s.stop()
        return job, ev

    job, ev = asyncio.run(main())
    text = _text(want[:5])
    assert _pieces(ev) == job.result.text == text[: text.index(stop)]
    assert job.result.finish_reason == "stop" and ev[-1][0] == "done"


def test_a_failing_step_ends_the_running_jobs_with_an_error_and_the_worker_goes_on():
    runner = FakeRunner(max_batch=2)
    real = runner.decode
    calls = [0]

    def decode(seqs, tokens):
        calls[0] += 1
        if calls[0] == 2:
            raise RuntimeError("device lost")
        return real(seqs, tokens)

    runner.decode = decode

    async def main():
        s = Scheduler(runner, Tok(), max_queue=4)
        first = await _collect(s.submit(_job([3], 6)))
        later = await _collect(s.submit(_job([4], 3)))
        s.stop()
        return first, later

    first, later = asyncio.run(main())
    assert first[-1] == ("error", "device lost")
    assert later[-1][0] == "done" and _pieces(later) == _text(alone([4], 3))
    assert runner.seqs == {}
