"""Decode misses split between the CPU pool and the PCIe link (strata/engine/pcie_split.py) on a
card tier: the same tokens and logits, within the tolerance of the card against the host
(tests/test_gpu_tier.py: a Q8 rounding flip at most), as the pool computing every miss and as
every expert resident. Runs on the GPU machine and on tools/gpu_emu (tests/test_gpu_emulated.py)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("cupy")

from strata.cpu.runner import PoolMissRunner  # noqa: E402
from strata.engine.engine import Engine  # noqa: E402
from strata.gpu.budget import DeviceBudget  # noqa: E402
from strata.gpu.cupy_tier import CupyTier  # noqa: E402
from strata.model.loader import load_model  # noqa: E402
from tests.oracle import FLIP_BOUND, position_errors  # noqa: E402

pytestmark = pytest.mark.gpu


def _budget() -> DeviceBudget:
    return DeviceBudget(total_mib=2048, runtime_reserve_mib=512, slack_mib=256)


def _hybrid(model, device, mask, split: bool):
    tier = CupyTier(model, n_ctx=64, budget=_budget(), expert_slots=int(mask.sum()),
                    device=device, prefill_stage=4)  # fmt: skip
    resident = tier.load_resident(mask)
    eng = Engine(model, tier=tier, resident=resident, miss_runner=PoolMissRunner(model, 1),
                 graphs=False)  # fmt: skip
    sp = eng.moe.split
    assert sp is not None  # on by default where the card has staging slots beside the pool
    if split:  # rates where an expert costs the pool what it costs the link: about half each
        sp.clock.s_per_expert = 1e-3
        sp.gather_s_per_byte = 0.0
        sp.link_s_per_byte = 1e-3 / max(sp.expert_bytes)
    else:
        eng.moe.split = None
    return eng


def test_split_decode_matches_all_pool_and_all_resident(synth_model, device):
    model = load_model(synth_model("tiny", "Q4_K", seed=31, n_expert=16, n_expert_used=4))
    a = model.args
    rng = np.random.default_rng(49)
    mask = rng.random((a.n_layer, a.n_expert)) < 0.3  # [L, E]: a third resident
    prompt = rng.integers(0, a.n_vocab, 8).tolist()
    engines = {
        "split": _hybrid(model, device, mask, True),
        "pool": _hybrid(model, device, mask, False),
        "resident": Engine(model, tier=CupyTier(model, n_ctx=64, budget=_budget(),
                                                device=device), graphs=False),
    }  # fmt: skip
    logits = {k: [e.forward(prompt)] for k, e in engines.items()}
    for _ in range(6):  # decode, every engine fed the all-pool engine's greedy token
        tok = int(np.argmax(logits["pool"][-1]))
        for k, e in engines.items():
            logits[k].append(e.forward([tok]))
    st = engines["split"].stats
    assert st.split_pcie > 0 and st.split_pool > 0 and st.split_windows > 0
    assert engines["pool"].stats.split_windows == 0
    assert st.link_gbps > 0 and st.gather_gbps > 0  # measured at start, printed by --stats
    got = np.array(logits["split"])
    for other in ("pool", "resident"):
        want = np.array(logits[other])
        err = position_errors(got, want)
        assert err.max() <= FLIP_BOUND, (other, err)
        np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))
