"""Per-position agreement of the reference forward (llama numerics) with llama.cpp, per quant mix.

    python scripts/oracle_report.py > bench/results/oracle-llama-2core-DATE.md

For each mix of tests/test_llama_oracle.py: a tiny synthetic model, 16 random 4-token sequences,
the share of positions within 1e-5 and 1e-4 of llama.cpp's logits, the median and the largest
error (relative to max |logit|). Needs llama-cpp-python.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import llama_cpp
import numpy as np

from strata.model.loader import load_model
from strata.model.reference import Reference
from strata.model.synth import SynthSpec, make_args, write_synthetic
from strata.quant import fmt
from tests.oracle import position_errors, simd_lanes
from tests.test_llama_oracle import MIXES, llama_logits, open_llama


def main() -> None:
    print("| experts | dense | within 1e-5 | within 1e-4 | median | max |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as d:
        for quant, dense in MIXES:
            spec = SynthSpec(
                make_args("tiny"),
                expert_quant=fmt(quant).qtype,
                dense_quant=fmt(dense).qtype,
                seed=5,
            )
            path = write_synthetic(Path(d) / f"{quant}-{dense}.gguf", spec, progress=False)[0]
            model, llm = load_model(path), open_llama(llama_cpp, path)
            ref = Reference(model, "llama", lanes=simd_lanes(llama_cpp))
            rng = np.random.default_rng(1)
            errs = np.concatenate(
                [
                    position_errors(ref.forward(t), llama_logits(llm, t))
                    for t in (rng.integers(0, model.args.n_vocab, 4).tolist() for _ in range(16))
                ]
            )
            print(
                f"| {quant} | {dense} | {(errs <= 1e-5).mean():.0%} | {(errs <= 1e-4).mean():.0%}"
                f" | {np.median(errs):.1e} | {errs.max():.1e} |"
            )


if __name__ == "__main__":
    main()
