"""The host-to-card path of a staged expert, measured once (at the engine's start): the host's
gather of GGUF bytes into pinned memory (strata/gpu/staging.py's threads) and the link's copy
of them to the card (CUDA events on the legacy stream). The PCIe split of decode misses
(strata/engine/pcie_split.py) weighs them against the CPU pool's running clock."""

from __future__ import annotations

import time

import numpy as np

from strata.cpu.tier import EXPERT_MATS

REPEATS = 3  # the median of a few: one upload of every staging slot each


def measure_stage_link(tier) -> tuple[float, float]:
    """(gather, link) seconds per byte of the staged upload of a `CupyTier` with staging slots:
    layer 0's first `stage_n` experts gathered and copied `REPEATS` times, medians."""
    from strata.gpu.staging import StageUploader

    cp, a = tier.cp, tier.args
    if tier._stager is None:
        tier._stager = StageUploader(cp, tier._expert_slot_bytes(), tier.stage_n)
    st = tier._stager
    mats = [tier.model.tensor(t, 0).raw() for t in EXPERT_MATS]  # [E*R, row_bytes]
    grp = np.arange(min(tier.stage_n, a.n_expert))
    tier.await_uploads()
    gathers, links = [], []
    for _ in range(REPEATS):
        null = cp.cuda.Stream.null
        null.synchronize()
        t0 = time.perf_counter()
        j = st.turn
        start = null.record()
        sent = st.upload(tier.stage_stores, mats, a.n_expert, grp)  # gather, then the copies
        t1 = time.perf_counter()
        st.events[j].synchronize()
        copy_s = cp.cuda.get_elapsed_time(start, st.events[j]) * 1e-3 - (t1 - t0)
        gathers.append((t1 - t0) / sent)
        links.append(max(copy_s, 1e-9) / sent)
    return float(np.median(gathers)), float(np.median(links))
