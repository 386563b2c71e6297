"""One 512-token prefill of the all-gpu arm's engine (every expert resident) between
cudaProfilerStart/Stop, after two warm ones: for ncu's view of the prompt kernels.

    ncu --profile-from-start off -k regex:moe_gate_up_mma -c 1 --set full -o rep \
        python3 bench/h200/ncu_prefill.py MODEL [T]
"""

from __future__ import annotations

import sys

import cupy as cp
import numpy as np

from strata.config import resolve
from strata.engine.builder import build_engine
from strata.model.loader import load_model

path, t = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 512
model = load_model(path)
flags = dict(
    expert_cache="all", car_threshold=1.0, vram_budget_mib=40000, vram_budget_widen=True,
    adapt_swaps=0, n_ctx=t + 16,
)  # fmt: skip
engine = build_engine(model, resolve(flags, env={}))
prompt = np.random.default_rng(0).integers(0, model.args.n_vocab, t).tolist()
for _ in range(2):  # compile, warm
    engine.reset()
    engine.forward(prompt)
engine.reset()
cp.cuda.runtime.deviceSynchronize()
cp.cuda.runtime.profilerStart()
engine.forward(prompt)
cp.cuda.runtime.deviceSynchronize()
cp.cuda.runtime.profilerStop()
print(f"profiled one {t}-token prefill")
