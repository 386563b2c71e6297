"""Router math as llama.cpp does it for qwen3moe / qwen2moe (pure NumPy).

T = tokens, E = experts, K = experts used per token.
"""

from __future__ import annotations

import numpy as np

MIN_WEIGHT_SUM = np.float32(6.103515625e-5)  # llama.cpp clamps the top-k weight sum at 2^-14


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(axis=-1, keepdims=True)


def route_topk(
    logits: np.ndarray, k: int, renormalize: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Softmax over all E, top-K by probability, optional renormalization of the K weights.

    logits [T, E] -> ids [T, K] int32 (best first), weights [T, K] float32, probs [T, E] float32.
    """
    probs = softmax(logits.astype(np.float32, copy=False))  # [T, E]
    # a stable sort of -p: equal probabilities go lower id first, at the K boundary too (an
    # argpartition picks among ties at the boundary in no stated order)
    if probs.shape[0] == 1:  # decode: the same selection with plain indexing (hot path)
        p = probs[0]
        ids1 = np.argsort(-p, kind="stable")[:k].astype(np.int32)
        w = p[ids1]
        if renormalize:
            w = w / np.maximum(w.sum(), MIN_WEIGHT_SUM)
        return ids1[None], w.astype(np.float32)[None], probs
    ids = np.argsort(-probs, axis=-1, kind="stable")[:, :k].astype(np.int32)  # [T, K]
    weights = np.take_along_axis(probs, ids, axis=-1)  # [T, K]
    if renormalize:
        weights = weights / np.maximum(weights.sum(axis=-1, keepdims=True), MIN_WEIGHT_SUM)
    return ids, weights.astype(np.float32), probs
