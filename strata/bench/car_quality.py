"""CAR quality meter: what substitution costs, measured where it happens (decode windows).

Teacher-forced over a text, one token per decode step, the same engine configuration with CAR off
(1.0) and on (each threshold): perplexity of both, mean KL(on || off) of the next-token
distributions, top-1 agreement, and the share of decode misses substituted. Batched scoring would
hide the cost, since CAR acts on decode windows only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from strata.build import build_engine
from strata.config import resolve
from strata.model.loader import load_model
from strata.progress import bar


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    z = z - z.max()
    return z - np.log(np.exp(z).sum())


def _score(model, ids: list[int], flags: dict) -> tuple[np.ndarray, np.ndarray, Any]:
    """Log-probs of every next token [N, V] (one decode step each) and the engine stats."""
    engine = build_engine(model, resolve(flags, env={}))
    logits = engine.forward(ids[:1])
    out = []
    with bar(len(ids) - 1, f"car {flags['car_threshold']}", unit="tok") as pb:
        for t in range(1, len(ids)):
            out.append(_log_softmax(logits))
            logits = engine.forward([ids[t]])
            pb.update()
    lp = np.stack(out)  # [N, V]
    nll = -lp[np.arange(len(ids) - 1), ids[1:]]
    return lp, nll, engine.stats


def run_car_quality(
    model_path, text: str, thresholds: list[float], slots: int | None = None, max_tokens: int = 256
) -> dict[str, Any]:
    model = load_model(model_path)
    a = model.args
    ids = model.tokenizer.encode(text)[: max_tokens + 1]
    if len(ids) < 8:
        raise ValueError("the text is too short to measure (fewer than 8 tokens)")
    slots = slots if slots is not None else a.n_layer * a.n_expert // 2
    base = {"expert_cache": str(slots), "adapt_swaps": 0, "n_ctx": len(ids) + 4}
    lp_off, nll_off, _ = _score(model, ids, dict(base, car_threshold=1.0))
    rows = []
    for th in thresholds:
        lp_on, nll_on, st = _score(model, ids, dict(base, car_threshold=th))
        kl = (np.exp(lp_on) * (lp_on - lp_off)).sum(axis=1)  # KL(on || off) per step
        rows.append(
            {
                "threshold": th,
                "ppl_off": float(np.exp(nll_off.mean())),
                "ppl_on": float(np.exp(nll_on.mean())),
                "mean_kl": float(kl.mean()),
                "top1_agreement": float((lp_on.argmax(1) == lp_off.argmax(1)).mean()),
                "substitution_rate": st.substitution_rate,
                "hit_rate": st.hit_rate,
            }
        )
    return {
        "arm": "car-quality",
        "model": str(model_path),
        "tokens": len(ids) - 1,
        "resident_experts": slots,
        "rows": rows,
    }
