"""CAR quality meter: what substitution costs, measured where it happens (decode windows).

Teacher-forced over held-out windows of text, one token per decode step, the same engine with
CAR off (threshold 1.0) and with each rule beside it, in lockstep: perplexity, mean KL(rule ||
off) of the next-token distributions, top-1 agreement, the share of decode misses substituted
and the share of the picks' router weight substituted; at each residency asked for (a share of
all experts, placed as the engine places them without a profile). Then a generation check:
greedy continuations of held-out prompts, the share identical to CAR off's. Batched scoring
would hide the cost, since CAR acts on decode windows only.

The slack rule needs the card's window and the pool's time per missed expert. A CPU-only run
has no card, so the meter states them (`window`: card us, pool us per job) and the engines take
them as fixed figures (`SlackMeter.assume`); the default is the GPU machine's measured window
on the 10240 MiB IQ3_XXS runs in bench/results (~67 us of card time, ~30 us a missed expert).

The default text (car_quality_heldout.json) is the embedded model's held-out split: see its
"source" field. T = steps, V = vocab.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from strata.build import build_engine
from strata.config import resolve
from strata.model.loader import load_model
from strata.progress import bar

HELDOUT = Path(__file__).with_name("car_quality_heldout.json")
RESIDENCY = (0.33, 0.5, 0.8)
WINDOW_US = (67.0, 30.0)  # card window, pool per missed expert (us)


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    z = z - z.max()
    return z - np.log(np.exp(z).sum())


def arms(thresholds: list[float]) -> dict[str, dict]:
    """CAR off, the seeds' rule at each threshold, the new default (slack mode, its knobs)."""
    out: dict[str, dict] = {"off": {"car_threshold": 1.0}}
    for th in thresholds:
        out[f"ratio {th:g}"] = {"car_mode": "ratio", "car_threshold": th}
    out["slack"] = {"car_mode": "slack"}
    return out


def _engines(model, flags: dict[str, dict], base: dict, window: tuple[float, float]) -> dict:
    out = {}
    for name, f in flags.items():
        e = build_engine(model, resolve(dict(base, **f), env={}))
        e.stats.slack.assume(*window)
        out[name] = e
    return out


def _score(engines: dict, windows: list[list[int]]) -> dict[str, dict[str, float]]:
    """Teacher-forced windows, every engine in lockstep -> per engine its figures."""
    names = list(engines)
    nll = {n: [] for n in names}
    kl = {n: [] for n in names}
    agree = {n: [] for n in names}
    with bar(sum(len(w) - 1 for w in windows), "car-quality", unit="tok") as pb:
        for ids in windows:
            for e in engines.values():
                e.reset()
            lps = {n: _log_softmax(e.forward(ids[:1])) for n, e in engines.items()}
            for t in range(1, len(ids)):
                off = lps["off"]
                for n in names:
                    lp = lps[n]
                    nll[n].append(-lp[ids[t]])
                    kl[n].append(float((np.exp(lp) * (lp - off)).sum()))  # KL(rule || off)
                    agree[n].append(int(lp.argmax() == off.argmax()))
                if t + 1 < len(ids):
                    lps = {n: _log_softmax(e.forward([ids[t]])) for n, e in engines.items()}
                pb.update()
    out = {}
    for n, e in engines.items():
        st = e.stats
        out[n] = {
            "ppl": float(np.exp(np.mean(nll[n]))),
            "mean_kl": float(np.mean(kl[n])),
            "top1_agreement": float(np.mean(agree[n])),
            "substitution_rate": st.substitution_rate,
            "substituted_mass": st.substituted_mass,
            "hit_rate": st.hit_rate,
        }
    return out


def _generate(engines: dict, prompts: list[list[int]], n: int) -> dict[str, float]:
    """Greedy continuations of n tokens -> per engine the share identical to CAR off's."""
    same = {k: 0 for k in engines}
    for p in prompts:
        outs = {}
        for k, e in engines.items():
            e.reset()
            logits, toks = e.forward(p), []
            for _ in range(n):
                toks.append(int(np.argmax(logits)))
                logits = e.forward([toks[-1]])
            outs[k] = toks
        for k in engines:
            same[k] += outs[k] == outs["off"]
    return {k: v / len(prompts) for k, v in same.items()}


def run_car_quality(
    model_path,
    thresholds: list[float],
    residency: tuple[float, ...] = RESIDENCY,
    window: tuple[float, float] = WINDOW_US,
    text: str | None = None,
    window_tokens: int = 768,
    max_tokens: int | None = None,
    gen_tokens: int = 32,
    n_prompts: int = 20,
) -> dict[str, Any]:
    """`text`: one text to score instead of the held-out windows (no generation check then
    unless prompts can be cut from it). max_tokens: stop scoring after this many tokens."""
    model = load_model(model_path)
    a, tok = model.args, model.tokenizer
    if text is None:
        doc = json.loads(HELDOUT.read_text())
        texts = [w["text"] for w in doc["windows"]]
        prompts = [tok.encode(p["text"]) for p in doc["prompts"]][:n_prompts]
        source = doc["source"]
    else:
        texts, prompts, source = [text], [], "given text"
    windows, left = [], max_tokens if max_tokens is not None else 1 << 62
    for t in texts:
        ids = tok.encode(t)[: min(window_tokens, left + 1)]
        if len(ids) >= 2:
            windows.append(ids)
            left -= len(ids) - 1
        if left <= 0:
            break
    if not windows:
        raise ValueError("the text is too short to measure (fewer than 2 tokens)")
    n_ctx = max(len(w) for w in windows + prompts) + gen_tokens + 4
    total = a.n_layer * a.n_expert
    res = {
        "arm": "car-quality",
        "model": str(model_path),
        "text": source,
        "tokens": sum(len(w) - 1 for w in windows),
        "windows": len(windows),
        "window_us": window[0],
        "job_us": window[1],
        "slack_jobs": window[0] / window[1],
        "prompts": len(prompts),
        "gen_tokens": gen_tokens,
        "residencies": [],
    }
    for share in residency:
        slots = max(1, min(total - 1, round(share * total)))
        # one pool thread: the meter measures answers, not speed, and a team of threads spins
        # where the host is shared
        base = {"expert_cache": str(slots), "adapt_swaps": 0, "n_ctx": n_ctx, "threads": 1}
        engines = _engines(model, arms(thresholds), base, window)
        rows = _score(engines, windows)
        if prompts:
            for k, v in _generate(engines, prompts, gen_tokens).items():
                rows[k]["generation_identical"] = v
        for e in engines.values():
            e.close()
        res["residencies"].append({"share": share, "resident_experts": slots, "rows": rows})
    return res


def quality_table(res: dict) -> str:
    lines = [
        f"car-quality: {res['tokens']} tokens teacher-forced in {res['windows']} windows; "
        f"slack from a stated window of {res['window_us']:g} us card time and "
        f"{res['job_us']:g} us a missed expert ({res['slack_jobs']:.2f} jobs)",
        f"{'resident':>9} {'rule':>10} {'ppl':>9} {'vs off':>7} {'KL':>8} {'top-1':>6} "
        f"{'subst %':>7} {'mass %':>6} {'hit %':>6} {'gen same':>8}",
    ]
    for r in res["residencies"]:
        off = r["rows"]["off"]["ppl"]
        for name, x in r["rows"].items():
            gen = x.get("generation_identical")
            lines.append(
                f"{100 * r['share']:8.0f}% {name:>10} {x['ppl']:9.3f} "
                f"{100 * (x['ppl'] / off - 1):+6.2f}% {x['mean_kl']:8.5f} "
                f"{100 * x['top1_agreement']:5.1f}% {100 * x['substitution_rate']:7.1f} "
                f"{100 * x['substituted_mass']:6.2f} {100 * x['hit_rate']:6.1f} "
                + (f"{100 * gen:7.0f}%" if gen is not None else f"{'-':>8}")
            )
    return "\n".join(lines)
