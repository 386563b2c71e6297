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

from strata.config import resolve  # noqa: E402
from strata.engine.builder import build_engine  # noqa: E402
from strata.model.loader import load_model  # noqa: E402
from strata.model.synth import SynthSpec, make_args, write_synthetic  # noqa: E402
from strata.quant import fmt  # noqa: E402


def engine(model, graphs: bool, **flags):
    base = dict(device="gpu", n_ctx=96, adapt_swaps=0, threads=2, cuda_graphs=graphs)
    base.update(flags)
    return build_engine(model, resolve(base, env={}))


def first_diff(g, e, prompt, steps):
    la, lb = g.forward(prompt), e.forward(prompt)
    if not np.array_equal(la, lb):
        return -1, float(np.abs(la - lb).max() / np.abs(lb).max())
    for step in range(steps):
        tok = int(np.argmax(lb))
        la, lb = g.forward([tok]), e.forward([tok])
        if not np.array_equal(la, lb):
            return step, float(np.abs(la - lb).max() / np.abs(lb).max())
    return None, 0.0


def main() -> None:
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    os.environ["STRATA_ADAPT_ROUTED"] = "0"
    d = Path(tempfile.mkdtemp())
    args = make_args("tiny", None)
    spec = SynthSpec(args, expert_quant=fmt("Q4_K").qtype, dense_quant=fmt("Q8_0").qtype,
                     embd_quant=fmt("Q8_0").qtype, seed=24, skew=2.0)  # fmt: skip
    model = load_model(write_synthetic(d / "m.gguf", spec, progress=False)[0])
    arms = {
        "swaps40-short": (dict(expert_cache="6", adapt_swaps=40), None),
        "swaps40-splits": (dict(expert_cache="6", adapt_swaps=40), 0),
        "swaps0-short": (dict(expert_cache="6", adapt_swaps=0), None),
        "all-eager-short": (dict(expert_cache="all"), None),
    }
    rng = np.random.default_rng()
    for name, (flags, short) in arms.items():
        bad = []
        for i in range(trials):
            g, e = engine(model, True, **flags), engine(model, False, **flags)
            if "all" in name:
                g.device_routing = False
            if short is not None:
                g.tier.attn_ws.dec_short = short
            prompt = rng.integers(0, model.args.n_vocab, 6).tolist()
            step, err = first_diff(g, e, prompt, 40)
            if step is not None:
                bad.append((i, step, round(err, 5)))
            g.close()
            e.close()
        print(f"{name}: {len(bad)} of {trials} trials differ {bad}", flush=True)


if __name__ == "__main__":
    main()
