"""Engine arms: whole-model prefill + decode under one configuration, warm, repeated.

car-off  - partial expert cache (what the VRAM budget leaves), CAR at 1.0
car-on   - the same cache, CAR at its default threshold (0.35)
all-cpu  - no resident experts: every expert in the miss path
all-gpu  - every expert resident
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from strata.config import resolve
from strata.engine.builder import build_engine
from strata.model.loader import load_model
from strata.progress import bar

ARMS = {
    "car-off": {"expert_cache": "auto", "car_threshold": 1.0},
    "car-on": {"expert_cache": "auto", "car_threshold": 0.35},
    "all-cpu": {"expert_cache": "0", "car_threshold": 1.0},
    "all-gpu": {"expert_cache": "all", "car_threshold": 1.0},
}


def run_engine_arm(
    arm: str,
    model_path,
    prompt_tokens: int,
    gen_tokens: int,
    repeats: int,
    budget_mib: int = 10240,
    extra: dict | None = None,
) -> dict[str, Any]:
    model = load_model(model_path)
    a = model.args
    flags = dict(
        ARMS[arm], vram_budget_mib=budget_mib, adapt_swaps=0, n_ctx=prompt_tokens + gen_tokens + 8
    )
    flags.update(extra or {})
    cfg = resolve(flags, env={})
    engine = build_engine(model, cfg)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, a.n_vocab, prompt_tokens).tolist()
    prefill, decode, hits, subst = [], [], [], []
    expert_bytes = model.expert_bytes_per_token()
    with bar(repeats + 1, f"{arm}", unit="run") as pb:
        for r in range(repeats + 1):  # run 0 warms up (compilation, slot fills)
            engine.reset()
            s0 = _snapshot(engine)
            t0 = time.perf_counter()
            logits = engine.forward(prompt)
            t1 = time.perf_counter()
            for _ in range(gen_tokens):
                logits = engine.forward([int(np.argmax(logits))])
            t2 = time.perf_counter()
            if r:
                prefill.append(prompt_tokens / (t1 - t0))
                decode.append(gen_tokens / (t2 - t1))
                d = _delta(engine, s0)
                hits.append(d["hit_rate"])
                subst.append(d["substitution_rate"])
            pb.update()
    med = statistics.median(decode)
    miss_bytes = (1 - statistics.median(hits)) * expert_bytes
    return {
        "arm": arm,
        "model": str(model_path),
        "prompt_tokens": prompt_tokens,
        "gen_tokens": gen_tokens,
        "repeats": repeats,
        "tier": engine.tier.name,
        "prefill_tps": statistics.median(prefill),
        "decode_tps": med,
        "decode_tps_min": min(decode),
        "decode_tps_max": max(decode),
        "window_ms": 1000.0 / med / a.n_layer,
        "hit_rate": statistics.median(hits),
        "car_substitution_rate": statistics.median(subst),
        "expert_bytes_per_token": expert_bytes,
        "miss_expert_gbps": miss_bytes * med / 1e9,
        "resident_experts": int(engine.resident.sum()),
        "notices": cfg.notices,
    }


def _snapshot(engine) -> tuple[int, int, int, int]:
    st = engine.stats
    return st.hits, st.misses, st.substitutions, st.decode_misses_before_car


def _delta(engine, s0) -> dict[str, float]:
    h, m, s, dm = (b - a for a, b in zip(s0, _snapshot(engine), strict=True))
    return {"hit_rate": h / (h + m) if h + m else 0.0, "substitution_rate": s / dm if dm else 0.0}
