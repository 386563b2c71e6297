"""llama.cpp (through llama-cpp-python) on the same GGUF, timed the way our arms are timed.

Prefill: one `eval` of the prompt; decode: `n` single-token evals, greedy. Warm (run 0 dropped),
median of repeats. This is the CPU-only comparison; the GPU one builds llama.cpp with CUDA and
runs llama-bench (scripts/llama_side_by_side.py).
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import numpy as np


def _argmax_last(llm, n_vocab: int) -> int:
    """Greedy pick from the last evaluated token's logits (llama.cpp's own buffer, no copy)."""
    logits = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(n_vocab,))
    return int(np.argmax(logits))


NO_EXTRA = "llama.cpp without its extra weight buffer types (--peer-extra-bufts)"


def run_llama_cpp_arm(
    model_path,
    prompt_tokens: int,
    gen_tokens: int,
    repeats: int,
    threads: int = 0,
    extra_bufts: str = "auto",
) -> dict[str, Any]:
    try:
        import llama_cpp
    except ImportError:
        raise ImportError(
            "the llama-cpp arm needs llama-cpp-python (pip install 'strata[test]')"
        ) from None
    from strata.bench.llama_open import open_llama, peer_extra_bufts

    threads = threads or os.cpu_count() or 1
    extra = peer_extra_bufts(extra_bufts)
    llm = open_llama(
        llama_cpp,
        extra,
        model_path=str(model_path),
        n_ctx=prompt_tokens + gen_tokens + 8,
        n_batch=max(prompt_tokens, 8),
        n_threads=threads,
        n_threads_batch=threads,
        flash_attn=False,
        verbose=False,
    )
    n_vocab = llm.n_vocab()
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, n_vocab, prompt_tokens).tolist()
    prefill, decode = [], []
    for r in range(repeats + 1):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        t1 = time.perf_counter()
        for _ in range(gen_tokens):
            llm.eval([_argmax_last(llm, n_vocab)])
        t2 = time.perf_counter()
        if r:
            prefill.append(prompt_tokens / (t1 - t0))
            decode.append(gen_tokens / (t2 - t1))
    med = statistics.median(decode)
    n_layer = int(llm.metadata.get(f"{llm.metadata['general.architecture']}.block_count", 1))
    return {
        "arm": "llama-cpp",
        "model": str(model_path),
        "prompt_tokens": prompt_tokens,
        "gen_tokens": gen_tokens,
        "repeats": repeats,
        "tier": "llama",
        "prefill_tps": statistics.median(prefill),
        "decode_tps": med,
        "decode_tps_min": min(decode),
        "decode_tps_max": max(decode),
        "window_ms": 1000.0 / med / n_layer,
        "hit_rate": 0.0,
        "car_substitution_rate": 0.0,
        "miss_expert_gbps": 0.0,
        "threads": threads,
        "extra_bufts": extra,
        "notices": [] if extra else [NO_EXTRA],
    }
