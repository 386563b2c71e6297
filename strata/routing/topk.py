"""Router math as llama.cpp does it for qwen3moe / qwen2moe: `route_topk` (NumPy, the rule of
record) and `topk_fast`, its compiled twin for the engine's hot path (the same arrays, bit for bit;
tests hold them equal on random and tied inputs), with the router-pick histogram `count_picks`.
The host routes between the card's graphs on a hybrid decode step, once a layer, so NumPy's
per-call overhead (tens of microseconds) would sit on the critical path.

T = tokens, E = experts, K = experts used per token.
"""

from __future__ import annotations

import numpy as np
from numba import njit

MIN_WEIGHT_SUM = np.float32(6.103515625e-5)  # llama.cpp clamps the top-k weight sum at 2^-14


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(axis=-1, keepdims=True)


def _boundary(probs: np.ndarray, ids: np.ndarray, k: int) -> None:
    """Rows where an expert left out ties the K-th pick: argpartition chooses among equal
    probabilities at the boundary in no stated order, so those rows (rare) are redone by a stable
    sort, which keeps the lower ids."""
    kth = np.take_along_axis(probs, ids[:, -1:], axis=-1)
    for r in np.flatnonzero(np.count_nonzero(probs >= kth, axis=-1) > k):
        ids[r] = np.argsort(-probs[r], kind="stable")[:k]


def route_topk(
    logits: np.ndarray, k: int, renormalize: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Softmax over all E, top-K by probability, optional renormalization of the K weights.

    logits [T, E] -> ids [T, K] int32 (best first), weights [T, K] float32, probs [T, E] float32.
    """
    probs = softmax(logits.astype(np.float32, copy=False))  # [T, E]
    if probs.shape[0] == 1:  # decode: the same selection with plain indexing (hot path)
        p = probs[0]
        part = np.sort(np.argpartition(-p, k - 1)[:k])  # ids ascending: ties stay lower id first
        ids1 = part[np.argsort(-p[part], kind="stable")]
        if np.count_nonzero(p >= p[ids1[-1]]) > k:  # a tie at the K boundary (see _boundary)
            ids1 = np.argsort(-p, kind="stable")[:k]
        ids1 = ids1.astype(np.int32)
        w = p[ids1]
        if renormalize:
            w = w / np.maximum(w.sum(), MIN_WEIGHT_SUM)
        return ids1[None], w.astype(np.float32)[None], probs
    part = np.sort(np.argpartition(-probs, k - 1, axis=-1)[:, :k], axis=-1)  # [T, K] ascending ids
    order = np.argsort(-np.take_along_axis(probs, part, axis=-1), axis=-1, kind="stable")
    ids = np.take_along_axis(part, order, axis=-1)  # [T, K]: equal probabilities lower id first
    _boundary(probs, ids, k)
    ids = ids.astype(np.int32)
    weights = np.take_along_axis(probs, ids, axis=-1)  # [T, K]
    if renormalize:
        weights = weights / np.maximum(weights.sum(axis=-1, keepdims=True), MIN_WEIGHT_SUM)
    return ids, weights.astype(np.float32), probs


@njit(cache=True)
def _select(p, k, ids):
    """ids [K] = the K experts of p [E] by probability, highest first, equal ones lower id
    first (`np.argsort(-p, kind="stable")[:K]`, which route_topk's selection equals)."""
    e = p.shape[0]
    n = 0
    for c in range(e):  # insertion into the sorted best-K list
        v = p[c]
        if n == k and not v > p[ids[k - 1]]:
            continue
        j = n if n < k else k - 1
        while j > 0 and v > p[ids[j - 1]]:
            if j < k:
                ids[j] = ids[j - 1]
            j -= 1
        ids[j] = c
        if n < k:
            n += 1


@njit(cache=True)
def _select_rows(probs, k, ids):
    """`_select` of every row: probs [T, E] -> ids [T, K]."""
    for t in range(probs.shape[0]):
        _select(probs[t], k, ids[t])


def topk_fast(
    logits: np.ndarray, k: int, renormalize: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`route_topk` (the same arrays, bit for bit): the selection runs compiled (a prompt's
    T rows too: NumPy's sorts cost ~3 ms a 512-token layer); the softmax and the
    renormalization stay NumPy's (their float order is NumPy's)."""
    if k > logits.shape[1] or k < 1:
        return route_topk(logits, k, renormalize)
    probs = softmax(logits.astype(np.float32, copy=False))  # [T, E]
    if probs.shape[0] == 1:  # decode
        p = probs[0]
        ids1 = np.empty(k, np.int32)
        _select(p, k, ids1)
        w = p[ids1]
        if renormalize:
            w = w / np.maximum(w.sum(), MIN_WEIGHT_SUM)
        return ids1[None], w.astype(np.float32)[None], probs
    ids = np.empty((probs.shape[0], k), np.int32)
    _select_rows(probs, k, ids)
    weights = np.take_along_axis(probs, ids, axis=-1)  # [T, K]
    if renormalize:
        weights = weights / np.maximum(weights.sum(axis=-1, keepdims=True), MIN_WEIGHT_SUM)
    return ids, weights.astype(np.float32), probs


def topk_softmax_weight(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """gpt-oss's gating (llama.cpp's SOFTMAX_WEIGHT): the K largest logits (highest first, equal
    ones lower id first), then a softmax over those K alone. logits [T, E] -> ids [T, K] int32,
    weights [T, K] float32, probs [T, E] float32 (the softmax over all E, which orders the experts
    as the logits do: what traces and CAR read)."""
    lg = logits.astype(np.float32, copy=False)
    ids = np.empty((lg.shape[0], k), np.int32)
    _select_rows(lg, k, ids)
    sel = np.take_along_axis(lg, ids, axis=-1)  # [T, K]
    return ids, softmax(sel).astype(np.float32), softmax(lg)


def route(
    logits: np.ndarray, k: int, renormalize: bool, gating: str = "softmax"
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The router's picks under the model's gating (ModelArgs.gating): `topk_fast`, or
    `topk_softmax_weight` for "softmax_weight"."""
    if gating == "softmax_weight":
        return topk_softmax_weight(logits, k)
    return topk_fast(logits, k, renormalize)


@njit(cache=True)
def count_picks(hist_row, ids):
    """hist_row[e] += 1 for every pick e in ids [T, K] (np.add.at's counts)."""
    for t in range(ids.shape[0]):
        for k in range(ids.shape[1]):
            hist_row[ids[t, k]] += 1
