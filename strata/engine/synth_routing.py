"""A synthetic model's routing brought to a given usage entropy: the per-layer strength of the
router's popularity rows solved on the model's own hidden states, then written into its files.

The model is first written with random routers (`SynthSpec.routing_entropy` set). One prompt of
random tokens runs layer by layer on the CPU-only tier; at each layer the router logits are
linear in the strength (W0 h + c * P h, P the popularity rows), so c is found by bisection on
those rows before the layer's experts run with the logits it gives: later layers see the hidden
states of the routing they will have. The routers are then rewritten in place.

T = calibration tokens, D = hidden, E = experts, K = experts per token, L = layers.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from strata.model.synth import (
    SynthSpec,
    popularity_rows,
    rewrite_routers,
    topics,
    write_synthetic,
)
from strata.routing.profile import usage_entropy

CALIBRATION_TOKENS = 512  # a few thousand picks a layer: the entropy to about +-0.005
MAX_STRENGTH = 64.0  # nats per unit of popularity: every token on its topic's top experts


def topk_usage(logits: np.ndarray, k: int) -> np.ndarray:
    """Pick counts [E] of the top-k of every row of logits [T, E]."""
    ids = np.argpartition(-logits, k - 1, axis=1)[:, :k]  # [T, K]
    return np.bincount(ids.ravel(), minlength=logits.shape[1])


def solve_strength(base: np.ndarray, pop: np.ndarray, k: int, target: float) -> float:
    """The strength c >= 0 whose logits base + c * pop ([T, E] each) give top-k usage of
    normalized entropy `target` (bisection; usage entropy falls as c grows)."""

    def h(c: float) -> float:
        return usage_entropy(topk_usage(base + c * pop, k))

    if h(0.0) <= target:
        return 0.0
    lo, hi = 0.0, 1.0
    while h(hi) > target and hi < MAX_STRENGTH:
        lo, hi = hi, 2 * hi
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if h(mid) > target else (lo, mid)
    return 0.5 * (lo + hi)


def calibrate_routing(paths: list[Path], spec: SynthSpec, tokens: int = CALIBRATION_TOKENS,
                      threads: int = 0) -> list[float]:  # fmt: skip
    """Solve every layer's router for `spec.routing_entropy` on the written model `paths` and
    write them -> each layer's usage entropy on the calibration prompt."""
    from gguf.constants import MODEL_TENSOR as MT

    from strata.build import build_engine
    from strata.config import resolve
    from strata.model.arch.common import name
    from strata.model.loader import load_model

    model = load_model(paths[0])
    a = model.args
    flags = dict(device="host", expert_cache="0", n_ctx=tokens, adapt_swaps=0, threads=threads)
    eng = build_engine(model, resolve(dict(flags, car_threshold=1.0), env={}))
    ids = np.random.default_rng([spec.seed, 0xCA1]).integers(0, a.n_vocab, tokens)  # [T]
    tier, moe = eng.tier, eng.moe
    x = tier.embed(ids)  # [T, D]
    routers, entropies = {}, []
    for i in range(a.n_layer):
        x = tier.attention(i, x, 0)
        h, _ = tier.router(i, x)  # [T, D]
        hh = np.asarray(h, np.float64)
        tname = name(MT.FFN_GATE_INP, i)
        w0 = model.tensor(tname).raw().view(np.float32).reshape(a.n_expert, a.n_embd)
        w0 = w0.astype(np.float64)
        # the random rows lose their share along the topics and the mean hidden row (else
        # they make popular experts of their own), then gain the popularity rows
        q, _ = np.linalg.qr(np.concatenate([topics(spec), hh.mean(0, keepdims=True)]).T)
        w0 = w0 - (w0 @ q) @ q.T  # [E, D]
        pop_rows = popularity_rows(spec, i)  # [E, D]
        c = solve_strength(hh @ w0.T, hh @ pop_rows.T, a.n_expert_used, spec.routing_entropy)
        w = (w0 + c * pop_rows).astype(np.float32)
        routers[tname] = w
        logits = (np.asarray(h, np.float32) @ w.T).astype(np.float32)  # [T, E]
        entropies.append(usage_entropy(topk_usage(logits, a.n_expert_used)))
        y = moe(i, h, logits, False, 0)
        if a.shared_ff:
            y = y + tier.shared_expert(i, h)
        x = x + y
    eng.close()
    rewrite_routers(paths, routers)
    return entropies


def write_routed(out, spec: SynthSpec, progress: bool = True,
                 threads: int = 0) -> tuple[list[Path], list[float]]:  # fmt: skip
    """`write_synthetic`, then (with `spec.routing_entropy`) the routers calibrated to it ->
    (files, each layer's usage entropy on the calibration prompt; [] without a target)."""
    out = Path(out)
    if spec.routing_entropy is None:
        return write_synthetic(out, spec, progress=progress), []
    tmp = out.with_name(out.stem + "-uncalibrated.gguf")  # the name is out's once calibrated
    paths = write_synthetic(tmp, spec, progress=progress)
    entropies = calibrate_routing(paths, spec, threads=threads)
    final = [p.with_name(p.name.replace(tmp.stem, out.stem)) for p in paths]
    for p, q in zip(paths, final, strict=True):
        os.replace(p, q)
    return final, entropies
