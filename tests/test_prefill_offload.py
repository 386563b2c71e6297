"""Prefill offload: a prompt's missed experts run on the tier's staging slots instead of the CPU
pool (the engine's routing of the work; the GPU tier's uploads are in tests/test_gpu_tier.py)."""

from __future__ import annotations

import numpy as np
import pytest

from strata.build import PREFILL_STAGE_AUTO, prefill_stage_slots
from strata.config import ConfigError, resolve
from strata.cpu.runner import PoolMissRunner
from strata.cpu.tier import HostTier
from strata.engine.engine import Engine
from strata.engine.moe import PREFILL_OFFLOAD_MIN_T
from strata.model.loader import load_model
from tests.oracle import FLIP_BOUND, position_errors


class _Counting:
    """A miss runner that counts the picks it is given, then runs the real pool."""

    def __init__(self, inner):
        self.inner, self.picks, self.calls = inner, 0, 0

    def experts(self, layer, h, ids, weights):
        self.picks += int((ids >= 0).sum())
        self.calls += 1
        return self.inner.experts(layer, h, ids, weights)


def _engine(model, stage: int, resident):
    tier = HostTier(model, n_ctx=256, prefill_stage=stage)
    runner = _Counting(PoolMissRunner(model, 2))
    return Engine(model, tier, miss_runner=runner, resident=resident.copy(), graphs=False), runner


def test_prompt_misses_run_on_the_staging_tier_and_decode_misses_in_the_pool(synth_model):
    model = load_model(synth_model("tiny", "Q4_K", seed=7))
    a = model.args
    rng = np.random.default_rng()
    resident = rng.random((a.n_layer, a.n_expert)) < 0.5  # [L, E]
    prompt = rng.integers(0, a.n_vocab, PREFILL_OFFLOAD_MIN_T + 9).tolist()
    on, pool_on = _engine(model, 4, resident)
    off, pool_off = _engine(model, 0, resident)
    lo, lf = on.forward(prompt), off.forward(prompt)
    assert pool_on.calls == 0 and on.stats.offloaded > 0
    assert on.stats.offloaded == pool_off.picks  # the same misses, computed elsewhere
    # the host tier and the pool round the same activations, summing in another order: equal to
    # float noise, unless a value sat on a Q8 rounding boundary and flipped (tests/oracle.py; a
    # clean-clone CI run met one: 0.9% of the largest logit)
    err = position_errors(lo[None], lf[None])[0]
    assert err <= FLIP_BOUND, f"off by {err:.3g} of the largest logit, more than a Q8 flip"
    assert pool_on.picks == 0
    tok, before, m0 = int(np.argmax(lf)), on.stats.offloaded, on.stats.misses
    for _ in range(4):  # decode steps: their misses go to the pool
        tok = int(np.argmax(on.forward([tok])))
    assert on.stats.offloaded == before
    assert pool_on.picks == on.stats.misses - m0 > 0


def test_a_prompt_launches_its_resident_experts_before_the_staged_ones(synth_model, monkeypatch):
    """The card computes a prompt's resident picks while the host gathers the misses' bytes:
    `experts` is called before `experts_staged` at every layer with both."""
    model = load_model(synth_model("tiny", "Q4_K", seed=7))
    a = model.args
    rng = np.random.default_rng()
    resident = rng.random((a.n_layer, a.n_expert)) < 0.5  # [L, E]
    prompt = rng.integers(0, a.n_vocab, PREFILL_OFFLOAD_MIN_T + 5).tolist()
    eng, _ = _engine(model, 4, resident)
    calls: list[str] = []
    depth = [0]  # the host tier's experts_staged calls its experts: count the outer call
    for name in ("experts", "experts_staged"):
        fn = getattr(eng.tier, name)

        def spy(*args, fn=fn, name=name, calls=calls, depth=depth):
            if not depth[0]:
                calls.append(name)
            depth[0] += 1
            try:
                return fn(*args)
            finally:
                depth[0] -= 1

        monkeypatch.setattr(eng.tier, name, spy)
    eng.forward(prompt)
    assert eng.stats.offloaded > 0
    assert calls == ["experts", "experts_staged"] * a.n_layer


def test_short_prompts_stay_in_the_pool(synth_model):
    model = load_model(synth_model("tiny", "Q4_K", seed=7))
    a = model.args
    resident = np.zeros((a.n_layer, a.n_expert), bool)
    eng, pool = _engine(model, 4, resident)
    eng.forward(list(range(1, PREFILL_OFFLOAD_MIN_T - 1)))
    assert eng.stats.offloaded == 0 and pool.calls == a.n_layer


@pytest.mark.parametrize(
    ("value", "pool", "want"),
    [("auto", True, PREFILL_STAGE_AUTO), ("off", True, 0), ("3", True, 3), ("auto", False, 0),
     ("999", True, 16)],
)  # fmt: skip
def test_stage_slots_from_the_config(value, pool, want):
    cfg = resolve({"prefill_offload": value}, env={})
    assert prefill_stage_slots(cfg, 16, pool) == min(want, 16)


def test_env_and_bad_values():
    assert resolve({}, env={"STRATA_PREFILL_OFFLOAD": "off"}).prefill_offload == "off"
    assert (
        resolve({"prefill_offload": "8"}, env={"STRATA_PREFILL_OFFLOAD": "off"}).prefill_offload
        == "8"
    )
    for bad in ("-1", "many", "1.5"):
        with pytest.raises(ConfigError, match="--prefill-offload"):
            resolve({"prefill_offload": bad}, env={})


@pytest.mark.parametrize("pad", [0, 24])  # an expert filling its slot, or smaller than it
def test_copy_jobs_put_each_expert_in_its_staging_slot(pad, monkeypatch):
    from strata.gpu import staging

    monkeypatch.setattr(staging, "CHUNK", 40)  # several jobs per span
    rng = np.random.default_rng()
    n_expert, rows, row_bytes = 12, 3, 16
    src = rng.integers(0, 256, (n_expert * rows, row_bytes), dtype=np.uint8)
    per = rows * row_bytes
    slot = per + pad
    grp = np.sort(rng.choice(n_expert, 7, replace=False))
    dst = np.zeros(8 * slot, np.uint8)
    for d, s in staging.copy_jobs(dst, slot, src, n_expert, grp):
        assert d.size <= 40
        np.copyto(d, s)
    flat = src.reshape(-1)
    for j, e in enumerate(grp):
        np.testing.assert_array_equal(dst[j * slot : j * slot + per], flat[e * per : (e + 1) * per])
    assert not dst[len(grp) * slot :].any()
    assert staging.consecutive_runs(np.array([1, 2, 3, 7, 9, 10])) == [(0, 3), (3, 4), (4, 6)]
