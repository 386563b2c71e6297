"""Continuous batching on the embedded model through `EngineRunner` (one engine a place): each job
of a batch makes exactly the tokens it makes alone (greedy and seeded sampled, a long prompt
prefilled in chunks among them); `TextStream` is the text side of both; /metrics shows the batch."""

from __future__ import annotations

import asyncio

import pytest

from strata.cli.common import DEFAULT_MODEL
from strata.engine.batch_api import BatchStats, KvFull
from strata.engine.runner import EngineRunner
from strata.engine.sampling import SamplingParams
from strata.engine.session import Generation, Session, TextStream
from strata.model.loader import load_model
from strata.serve.metrics import Metrics
from strata.serve.scheduler import PREFILL_CHUNK, Job, Scheduler

N_CTX = 512


@pytest.fixture(scope="module")
def model():
    return load_model(DEFAULT_MODEL)


_ALONE: dict = {}


def _alone(model, prompt, n, sampling) -> Generation:
    """What `prompt` makes on its own: one session, its history forgotten (nothing reused)."""
    s = _ALONE.setdefault(id(model), Session(model, n_ctx=N_CTX))
    s.history = []
    res = Generation()
    list(s.generate(prompt, n, sampling, result=res))
    return res


async def _events(job: Job) -> list:
    return [e async for e in job.events()]


def _cases(model):
    tok = model.tokenizer
    long = tok.encode(" ".join(f"item {i} is {i * 7 % 13}." for i in range(40)))
    assert PREFILL_CHUNK < len(long) < N_CTX - 16
    greedy = SamplingParams()
    return [
        (tok.encode("The sea is"), 14, greedy),
        (tok.encode("Once upon a time"), 10, SamplingParams(temperature=0.8, seed=7)),
        (long, 8, greedy),
        (tok.encode("1, 2, 3,"), 16, SamplingParams(temperature=1.0, top_k=0, seed=3)),
        (tok.encode("The sea is"), 12, SamplingParams(temperature=0.7, seed=11)),
    ]


def test_a_batch_makes_the_tokens_each_job_makes_alone(model):
    cases = _cases(model)
    runner = EngineRunner([Session(model, n_ctx=N_CTX) for _ in range(3)])

    async def main():
        s = Scheduler(runner, model.tokenizer, max_queue=8)
        loop = asyncio.get_running_loop()
        jobs = [s.submit(Job(p, n, sp, [], loop)) for p, n, sp in cases]
        evs = await asyncio.gather(*(_events(j) for j in jobs))
        s.stop()
        return jobs, evs

    jobs, evs = asyncio.run(main())
    for (p, n, sp), job, ev in zip(cases, jobs, evs, strict=True):
        want = _alone(model, p, n, sp)
        assert ev[-1][0] == "done"
        assert job.result.tokens == want.tokens
        assert "".join(x for k, x in ev if k == "piece") == want.text == job.result.text
        assert job.result.finish_reason == want.finish_reason
    st = runner.stats
    assert st.batch_steps > 0 and st.batch_rows / st.batch_steps > 1.5  # decoded together
    assert st.kv_blocks_used == 0 and st.prefix_hit_tokens > 0  # the repeated prompt reused KV


def test_a_job_cancelled_mid_stream_frees_its_place_and_the_others_go_on(model):
    tok = model.tokenizer
    runner = EngineRunner([Session(model, n_ctx=N_CTX) for _ in range(2)])
    greedy = SamplingParams()

    async def main():
        s = Scheduler(runner, tok, max_queue=4)
        loop = asyncio.get_running_loop()
        doomed = s.submit(Job(tok.encode("Count: one two"), 200, greedy, [], loop))
        other = s.submit(Job(tok.encode("The sea is"), 12, greedy, [], loop))
        later = s.submit(Job(tok.encode("Once upon"), 6, greedy, [], loop))
        kinds = []
        async for kind, _ in doomed.events():
            kinds.append(kind)
            if len(kinds) == 3:
                doomed.cancel()
        rest = await asyncio.gather(_events(other), _events(later))
        s.stop()
        return kinds, doomed, (other, later), rest

    kinds, doomed, jobs, rest = asyncio.run(main())
    assert kinds[-1] == "cancelled" and len(doomed.result.tokens) < 200
    for job, ev in zip(jobs, rest, strict=True):
        want = _alone(model, job.prompt, job.max_tokens, greedy)
        assert ev[-1][0] == "done" and job.result.tokens == want.tokens
    assert runner.stats.kv_blocks_used == 0


def test_the_runner_refuses_a_sequence_when_every_place_is_taken(model):
    runner = EngineRunner([Session(model, n_ctx=64)])
    tok = model.tokenizer
    first = tok.encode("a b c")
    assert runner.admit(0, first) == 0
    assert runner.prefill(0, 2) is None and runner.prefill(0, 64) is not None  # [V] at the end
    with pytest.raises(KvFull):
        runner.admit(1, tok.encode("d e"))
    with pytest.raises(ValueError):
        runner.admit(2, list(range(1, 80)))  # longer than the context
    runner.release(0)
    assert runner.stats.kv_blocks_used == 0
    assert runner.admit(1, first + first[-1:]) == len(first)  # the released place's rows, reused
    assert runner.prefill(1, 64) is not None


def test_text_stream_holds_back_a_stop_string_and_cuts_the_text_at_it(model):
    tok = model.tokenizer
    ids = tok.encode("alpha beta gamma delta", add_bos=False)
    res = Generation()
    ts = TextStream(tok, 100, ["gamma"], res)
    pieces = []
    for t in ids:
        pieces.append(ts.push(t))
        if ts.done:
            break
    pieces.append(ts.close())
    assert ts.done and res.finish_reason == "stop"
    assert "".join(pieces) == res.text == "alpha beta "
    res2 = Generation()
    ts2 = TextStream(tok, 2, [], res2)
    out = [ts2.push(t) for t in ids[:2]] + [ts2.close()]
    assert ts2.done and res2.finish_reason == "length" and len(res2.tokens) == 2
    assert "".join(out) == res2.text == tok.decode(ids[:2])


def test_metrics_report_batch_size_kv_blocks_prefix_hits_and_preemptions():
    st = BatchStats(
        kv_blocks_total=64, kv_blocks_used=10, prefix_hit_tokens=300, batch_steps=4, batch_rows=10
    )
    text = Metrics().render(queued=1, active=3, slots=8, engine_stats=[], batch=st, preemptions=2)
    want = {
        "strata_batch_size": 3,
        "strata_batch_size_mean": 2.5,
        "strata_kv_blocks_used": 10,
        "strata_kv_blocks_total": 64,
        "strata_prefix_hit_tokens_total": 300,
        "strata_preemptions_total": 2,
    }
    got = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    for k, v in want.items():
        assert got[k] == v, k
