"""The batch arm: aggregate and per-stream decode tokens/s at batch sizes B through the server's
runner (`strata.serve.runner.make_runner`: whatever the server decodes its batch with).

Per B, each run admits B sequences with their own random prompts of p tokens (no shared prefix),
prefills them, then times n decode steps of all B at once, feeding random tokens as llama-bench's
tg and llama-batched-bench do. Run 0 warms up; the median of the timed runs is reported.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from strata.config import resolve
from strata.model.loader import load_model
from strata.progress import bar

BATCH_SIZES = (1, 2, 4, 8, 16)


def parse_batch_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"--batch-sizes: a comma list of integers, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise ValueError(f"--batch-sizes: sizes >= 1, got {text!r}")
    return sizes


def run_batch_arm(
    model_path,
    prompt_tokens: int,
    gen_tokens: int,
    repeats: int,
    sizes: tuple[int, ...] = BATCH_SIZES,
    budget_mib: int = 10240,
    extra: dict | None = None,
) -> dict[str, Any]:
    from strata.serve.runner import make_runner

    if gen_tokens < 1 or prompt_tokens < 1:
        raise ValueError("the batch arm needs -p and -n of at least 1")
    model = load_model(model_path)
    flags = dict(vram_budget_mib=budget_mib, n_ctx=prompt_tokens + gen_tokens + 8)
    flags.update(extra or {})
    cfg = resolve(flags, env={})
    runner = make_runner(model, cfg, max(sizes))  # built once; each B uses B of its places
    n_vocab = model.args.n_vocab
    rows = []
    seq = 0
    try:
        for b in sizes:
            prefill, decode = [], []
            with bar(repeats + 1, f"batch B={b}", unit="run") as pb:
                for r in range(repeats + 1):
                    rng = np.random.default_rng(1000 * b + r)
                    prompts = rng.integers(0, n_vocab, (b, prompt_tokens))  # [B, p]
                    feed = rng.integers(0, n_vocab, (gen_tokens, b))  # [n, B]
                    seqs = list(range(seq, seq + b))
                    seq += b
                    t0 = time.perf_counter()
                    for q, p in zip(seqs, prompts, strict=True):
                        runner.admit(q, p.tolist())
                        while runner.prefill(q, prompt_tokens) is None:
                            pass
                    t1 = time.perf_counter()
                    for step in feed:
                        runner.decode(seqs, step.tolist())
                    t2 = time.perf_counter()
                    for q in seqs:
                        runner.release(q)
                    if r:
                        prefill.append(b * prompt_tokens / (t1 - t0))
                        decode.append(b * gen_tokens / (t2 - t1))
                    pb.update()
            med = statistics.median(decode)
            rows.append(
                {
                    "batch": b,
                    "prefill_tps": statistics.median(prefill),
                    "decode_tps": med,  # aggregate over the B streams
                    "decode_tps_min": min(decode),
                    "decode_tps_max": max(decode),
                    "stream_tps": med / b,
                    "step_ms": 1000.0 * b / med,
                }
            )
    finally:
        close = getattr(runner, "close", None)
        if callable(close):
            close()
    st = runner.stats
    return {
        "arm": "batch",
        "model": str(model_path),
        "runner": type(runner).__name__,
        "prompt_tokens": prompt_tokens,
        "gen_tokens": gen_tokens,
        "repeats": repeats,
        "vram_budget_mib": budget_mib,
        "batches": rows,
        "prefix_hit_tokens": st.prefix_hit_tokens,
        "kv_blocks_total": st.kv_blocks_total,
        "notices": cfg.notices,
    }


def batch_table(res: dict) -> str:
    lines = [
        f"batch arm ({res['runner']}, p={res['prompt_tokens']}, n={res['gen_tokens']}, "
        f"median of {res['repeats']})",
        f"{'B':>4} {'prefill t/s':>11} {'decode t/s (min-max)':>24} {'per stream':>10} "
        f"{'step ms':>8} {'vs B=1':>7}",
    ]
    base = res["batches"][0]["decode_tps"] if res["batches"][0]["batch"] == 1 else None
    for r in res["batches"]:
        gain = f"{r['decode_tps'] / base:6.2f}x" if base else f"{'-':>7}"
        lines.append(
            f"{r['batch']:4d} {r['prefill_tps']:11.1f} {r['decode_tps']:8.1f} "
            f"({r['decode_tps_min']:6.1f}-{r['decode_tps_max']:6.1f}) {r['stream_tps']:10.1f} "
            f"{r['step_ms']:8.3f} {gain}"
        )
    lines.append("decode t/s = generated tokens of all B streams a second; per stream = that / B")
    return "\n".join(lines)
