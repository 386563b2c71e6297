"""Repeat the graph-vs-eager lockstep of tests/test_gpu_graph.py's adaptive-swap test with fresh
prompts, per arm, and count the trials whose logits are not bit-identical (a flaky failure's
cause: the short decode attention kernel against the split kernels, or the swap uploads).

  python3 bench/h200/lockstep_repeat.py [TRIALS]
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from strata.model.loader import load_model  # noqa: E402
from strata.model.synth import SynthSpec, make_args, write_synthetic  # noqa: E402
from strata.quant import fmt  # noqa: E402
from tests.test_gpu_graph import engine  # noqa: E402  (the tests' engine settings)


def run(eng, prompt, steps, toks=None):
    """Logits of every step [steps + 1, V]; fed `toks` (else its own greedy picks)."""
    out = [eng.forward(prompt)]
    picked = []
    for step in range(steps):
        tok = int(np.argmax(out[-1])) if toks is None else toks[step]
        picked.append(tok)
        out.append(eng.forward([tok]))
    return np.stack(out), picked


def first_diff(a, b):
    bad = np.nonzero(~np.all(a == b, axis=1))[0]
    if not bad.size:
        return None
    i = int(bad[0])
    return i - 1, round(float(np.abs(a[i] - b[i]).max() / np.abs(b[i]).max()), 5)


def main() -> None:
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    os.environ["STRATA_ADAPT_ROUTED"] = "0"
    d = Path(tempfile.mkdtemp())
    args = make_args("tiny", None)
    spec = SynthSpec(args, expert_quant=fmt("Q4_K").qtype, dense_quant=fmt("Q8_0").qtype,
                     embd_quant=fmt("Q8_0").qtype, seed=24, skew=2.0)  # fmt: skip
    model = load_model(write_synthetic(d / "m.gguf", spec, progress=False)[0])
    arms = {
        "swaps40-short": (dict(expert_cache="6", adapt_swaps=40), None, trials),
        "swaps40-splits": (dict(expert_cache="6", adapt_swaps=40), 0, trials),
        "swaps0-short": (dict(expert_cache="6", adapt_swaps=0), None, max(1, trials // 2)),
    }
    rng = np.random.default_rng()
    for name, (flags, short, n) in arms.items():
        bad = {"g-e": [], "g-g2": [], "e-e2": []}
        for i in range(n):
            engs = [engine(model, gr, **flags) for gr in (True, True, False, False)]
            if short is not None:  # every engine: eager decode picks as the graph step does
                for x in engs:
                    x.tier.attn_ws.dec_short = short
            prompt = rng.integers(0, model.args.n_vocab, 6).tolist()
            le, toks = run(engs[2], prompt, 40)
            lg, _ = run(engs[0], prompt, 40, toks)
            lg2, _ = run(engs[1], prompt, 40, toks)
            le2, _ = run(engs[3], prompt, 40, toks)
            for key, (a, b) in {"g-e": (lg, le), "g-g2": (lg, lg2), "e-e2": (le, le2)}.items():
                d = first_diff(a, b)
                if d is not None:
                    bad[key].append((i, *d))
            for x in engs:
                x.close()
        print(f"{name}: {n} trials; differing (trial, step, err): {bad}", flush=True)


if __name__ == "__main__":
    main()
