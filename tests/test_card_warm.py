"""A prompt's warm admissions on the card: the experts it admits to the cache were just uploaded
to its staging slots, so they are copied from there on the card (`ExpertSlots._admit_staged`)
instead of again from the host. Where is computed changes, never what: the slots hold the GGUF
bytes, and the logits are those of an unwarmed and of a static cache. Runs on the GPU machine
and on tools/gpu_emu (tests/test_gpu_emulated.py)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("cupy")

from strata.cpu.tier import EXPERT_MATS  # noqa: E402
from strata.engine.engine import Engine  # noqa: E402
from strata.engine.moe import PREFILL_OFFLOAD_MIN_T  # noqa: E402
from strata.gpu.budget import DeviceBudget  # noqa: E402
from strata.gpu.cupy_tier import CupyTier  # noqa: E402
from strata.gpu.expert_slots import ExpertSlots  # noqa: E402
from strata.model.loader import load_model  # noqa: E402
from strata.routing.profile import AdaptiveCache  # noqa: E402

pytestmark = pytest.mark.gpu

N_EXPERT, HELD, STAGE = 16, 5, 3  # experts a layer, resident a layer, staging slots


@pytest.fixture(scope="module")
def model(synth_model):
    return load_model(synth_model("tiny", "Q4_K", seed=21, skew=1.5, n_expert=N_EXPERT,
                                  n_expert_used=4))  # fmt: skip


def _engine(model, device, warm: bool | None):
    """warm None: a static cache; else the adaptive cache with or without prompt warming. The
    tier serves every miss (placement alone cannot change a bit)."""
    a = model.args
    budget = DeviceBudget(total_mib=2048, runtime_reserve_mib=512, slack_mib=256)
    # slots for the resident set and the decode's on-demand uploads (never evicting a resident)
    tier = CupyTier(model, n_ctx=128, budget=budget, expert_slots=a.n_layer * N_EXPERT,
                    device=device, prefill_stage=STAGE)  # fmt: skip
    mask = np.zeros((a.n_layer, a.n_expert), bool)
    mask[:, -HELD:] = True  # the coldest of the skewed experts
    resident = tier.load_resident(mask)
    adaptive = None
    if warm is not None:
        adaptive = AdaptiveCache(resident, max_swaps=4, warm_from_prompts=warm)
    return Engine(model, tier=tier, resident=resident, adaptive=adaptive, graphs=False)


def _slot_bytes_are_the_gguf_bytes(model, tier) -> int:
    """Every cached expert's slot holds its GGUF bytes; returns how many were checked."""
    n = 0
    for layer, e in zip(*np.nonzero(tier.slot_of >= 0), strict=True):
        s = int(tier.slot_of[layer, e])
        for store, t in zip(tier.stores, EXPERT_MATS, strict=True):
            raw = model.tensor(t, int(layer)).raw()  # [E*R, row_bytes]
            per = raw.shape[0] // model.args.n_expert
            want = np.ascontiguousarray(raw[e * per : (e + 1) * per]).reshape(-1)
            got = tier.cp.asnumpy(store.buf[s])[: want.size]
            np.testing.assert_array_equal(got, want, err_msg=f"layer {layer} expert {e}")
        n += 1
    return n


def _run(eng, prompt, stream):
    out = [eng.forward(prompt)]
    out += [eng.forward([t]) for t in stream]
    return np.array(out)


def test_warm_admits_copy_from_staging_on_the_card_with_the_same_bits(model, device, monkeypatch):
    a = model.args
    rng = np.random.default_rng(47)
    prompt = rng.integers(0, a.n_vocab, PREFILL_OFFLOAD_MIN_T + 16).tolist()
    stream = rng.integers(0, a.n_vocab, 6).tolist()
    d2d = _engine(model, device, True)
    logits = {"d2d": _run(d2d, prompt, stream)}
    assert d2d.stats.warm_swaps > 0 and d2d.tier.stage_admits == d2d.stats.warm_swaps
    assert _slot_bytes_are_the_gguf_bytes(model, d2d.tier) > 0
    for arm, warm in (("unwarmed", False), ("static", None)):
        logits[arm] = _run(_engine(model, device, warm), prompt, stream)
    # the same admissions uploaded from the host (the path before the copy on the card)
    monkeypatch.setattr(ExpertSlots, "_admit_staged", lambda *args: None)
    h2d = _engine(model, device, True)
    logits["h2d"] = _run(h2d, prompt, stream)
    assert h2d.tier.stage_admits == 0 and h2d.stats.warm_swaps == d2d.stats.warm_swaps
    np.testing.assert_array_equal(h2d.tier.slot_of, d2d.tier.slot_of)
    for arm in ("h2d", "unwarmed", "static"):
        np.testing.assert_array_equal(logits["d2d"], logits[arm], err_msg=arm)
