"""Offline CAR replay: what a threshold would do on a recorded STRCS1 trace.

`strata car-estimate TRACE --threshold 0.25,0.35,0.5,0.7 (--resident MASK.npy | --cache-profile
PROFILE --slots N) [--mode slack|ratio] [--slack JOBS]` applies the same rule
(strata.routing.car.car_plan, with each record's slack field unless --slack is given) to every
decode record and prints, per threshold, the share of misses substituted, substitutions per
token, the mean accepted ratio and the histogram of the substituted experts' router rank. Before
replaying it checks the rule against the golden cases shipped beside it (car_golden.json), the
one file the unit tests hold the NumPy rule, its Numba twin and the card's route_car to.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from strata.routing.car import CarKnobs, car_plan
from strata.routing.trace import read_trace, record_slack

GOLDEN = Path(__file__).with_name("car_golden.json")


@dataclass
class Estimate:
    threshold: float
    decode_tokens: int
    misses: int
    substitutions: int
    ratio_sum: float
    rank_hist: np.ndarray  # [E] substitutions by the substitute's rank in the score row

    @property
    def share(self) -> float:
        return self.substitutions / self.misses if self.misses else 0.0

    @property
    def per_token(self) -> float:
        return self.substitutions / self.decode_tokens if self.decode_tokens else 0.0

    @property
    def mean_ratio(self) -> float:
        return self.ratio_sum / self.substitutions if self.substitutions else 0.0


def golden_cases(path: Path = GOLDEN) -> list[dict]:
    """The golden cases as arrays: name, ids [T, K], probs [T, E] f32, resident [E], knobs,
    slack (jobs of room; 0 where a case has none) and the expected ids."""
    out = []
    for c in json.loads(path.read_text()):
        out.append(
            {
                "name": c["name"],
                "ids": np.array(c["ids"], np.int32),
                "probs": np.array(c["probs"], np.float32),
                "resident": np.array(c["resident"], bool),
                "knobs": CarKnobs(**c["knobs"]),
                "slack": float(c.get("slack", 0.0)),
                "expect": c["expect"],
            }
        )
    return out


def check_golden(path: Path = GOLDEN) -> int:
    """Run every golden case through car_plan; raises on the first mismatch. Returns the count."""
    cases = golden_cases(path)
    for c in cases:
        got = car_plan(c["ids"], c["probs"], c["resident"], c["knobs"], c["slack"])
        if got.ids.tolist() != c["expect"]:
            raise AssertionError(
                f"golden case {c['name']!r}: got {got.ids.tolist()}, expected {c['expect']}"
            )
    return len(cases)


def replay(
    trace_path, resident: np.ndarray, knobs: CarKnobs, slack: float | None = None
) -> Estimate:
    """Apply CAR with `knobs` to the decode records of a trace. resident [L, E] bool; slack:
    jobs of room for every record (None: each record's own field, 0 in an older trace)."""
    h, rec = read_trace(trace_path)
    if resident.shape != (h.n_layer, h.n_expert):
        raise ValueError(
            f"resident mask is {resident.shape}, the trace has "
            f"{h.n_layer} layers x {h.n_expert} experts"
        )
    dec = rec[(rec["flags"] & 1) == 1]
    slacks = record_slack(dec) if slack is None else np.full(len(dec), slack, np.float32)
    steps = np.unique(dec["step"])
    warm = set(steps[: knobs.warmup].tolist())
    est = Estimate(
        knobs.threshold,
        max(0, len(steps) - knobs.warmup),
        0,
        0,
        0.0,
        np.zeros(h.n_expert, np.int64),
    )
    for r, sl in zip(dec, slacks, strict=True):
        if int(r["step"]) in warm:
            continue
        probs = r["scores"][None, :]
        plan = car_plan(r["ids"][None, :], probs, resident[r["layer"]], knobs, float(sl))
        est.misses += plan.misses
        n = int(plan.substituted.sum())
        est.substitutions += n
        est.ratio_sum += float(plan.ratios.sum())
        if n:
            rank = np.argsort(np.argsort(-r["scores"], kind="stable"), kind="stable")
            np.add.at(est.rank_hist, rank[plan.ids[0][plan.substituted[0]]], 1)
    return est


def format_table(ests: list[Estimate]) -> str:
    lines = [
        f"{'threshold':>9} {'misses':>8} {'subst':>7} {'share':>7} {'per tok':>8} "
        f"{'mean ratio':>10}  ranks of substitutes (1-based: count)"
    ]
    for e in ests:
        ranks = ", ".join(f"{i + 1}:{n}" for i, n in enumerate(e.rank_hist) if n)
        lines.append(
            f"{e.threshold:9.2f} {e.misses:8d} {e.substitutions:7d} {e.share:7.1%} "
            f"{e.per_token:8.2f} {e.mean_ratio:10.3f}  {ranks}"
        )
    return "\n".join(lines)
