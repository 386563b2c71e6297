"""How far the pool's misses put the logits from an all-resident engine's (the margin of
test_gpu_graph.py::test_adaptive_cache_on_the_routed_step and the other pool-against-card
checks): per trial a fresh random prompt, an engine with a static 6-slot cache (the misses on
the CPU pool, CAR off) and one with every expert resident, 40 greedy steps fed the resident
one's tokens; prints each trial's largest step error (max |a - b| / max |b|) and the greedy
agreement. Runs on the card or the emulator (eager steps: `--graphs 0`).

    python bench/h200/pool_vs_card_margin.py --trials 12 [--graphs 1] [--quant Q4_K]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from strata.config import resolve
from strata.engine.builder import build_engine
from strata.model.loader import load_model
from strata.model.synth import SynthSpec, make_args, write_synthetic
from strata.quant import fmt
from tests.oracle import position_errors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--graphs", type=int, default=1)
    ap.add_argument("--quant", default="Q4_K")
    ap.add_argument("--cache", default="6")
    a = ap.parse_args()
    args = make_args("tiny", None)
    spec = SynthSpec(args, expert_quant=fmt(a.quant).qtype, dense_quant=fmt("Q8_0").qtype,
                     embd_quant=fmt("Q8_0").qtype, seed=24, skew=2.0)  # fmt: skip
    path = write_synthetic(Path(tempfile.mkdtemp()) / "m.gguf", spec, progress=False)[0]
    model = load_model(path)
    base = dict(device="gpu", n_ctx=96, adapt_swaps=0, threads=2, cuda_graphs=bool(a.graphs),
                car_threshold=1.0)  # fmt: skip
    worst = []
    for trial in range(a.trials):
        g = build_engine(model, resolve(dict(base, expert_cache=a.cache), env={}))
        h = build_engine(model, resolve(dict(base, expert_cache="all"), env={}))
        prompt = np.random.default_rng().integers(0, model.args.n_vocab, 6).tolist()
        la, lb = g.forward(prompt), h.forward(prompt)
        errs, same = [position_errors(la[None], lb[None])[0]], 0
        for _ in range(a.steps):
            same += int(np.argmax(la)) == int(np.argmax(lb))
            tok = int(np.argmax(lb))
            la, lb = g.forward([tok]), h.forward([tok])
            errs.append(position_errors(la[None], lb[None])[0])
        errs = np.array(errs)
        worst.append(errs.max())
        p90 = np.quantile(errs, 0.9)
        print(f"trial {trial}: max {errs.max():.5f} median {np.median(errs):.5f} "
              f"p90 {p90:.5f} greedy same {same}/{a.steps}", flush=True)  # fmt: skip
    w = np.array(worst)
    print(f"over {a.trials} trials: worst {w.max():.5f}, median of worsts {np.median(w):.5f}, "
          f"trials above 1e-2: {(w > 1e-2).sum()}")  # fmt: skip


if __name__ == "__main__":
    main()
