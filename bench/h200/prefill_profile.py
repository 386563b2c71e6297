"""Where a 512-token prefill's device time goes, all experts resident (the all-gpu arm's
configuration): CUPTI kernel records through torch.profiler (it sees CuPy's kernels in the same
process), summed by kernel name, against the prefill's wall time.

    python3 bench/h200/prefill_profile.py MODEL [T] [--ncu]

--ncu: after the warm prefills, one more between cudaProfilerStart/Stop and nothing else (for
`ncu --profile-from-start off -k regex:moe_gate_up_mma -c 1 ...`; call LA).
"""

from __future__ import annotations

import sys
import time

import numpy as np
from torch.profiler import ProfilerActivity, profile

from strata.config import resolve
from strata.engine.builder import build_engine
from strata.model.loader import load_model

ncu = "--ncu" in sys.argv[1:]
args = [a for a in sys.argv[1:] if a != "--ncu"]
path, t = args[0], int(args[1]) if len(args) > 1 else 512
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
import cupy as cp  # noqa: E402

if ncu:
    engine.reset()
    cp.cuda.runtime.deviceSynchronize()
    cp.cuda.runtime.profilerStart()
    engine.forward(prompt)
    cp.cuda.runtime.deviceSynchronize()
    cp.cuda.runtime.profilerStop()
    print(f"profiled one {t}-token prefill")
    sys.exit(0)

cp.cuda.Device().synchronize()
engine.reset()
t0 = time.perf_counter()
engine.forward(prompt)
cp.cuda.Device().synchronize()
wall = time.perf_counter() - t0
engine.reset()
with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
    engine.forward(prompt)
    cp.cuda.Device().synchronize()
rows = []
for ev in prof.key_averages():
    dev = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
    if dev > 0 and ev.count > 0:
        rows.append((dev, ev.count, ev.key))
rows.sort(reverse=True)
busy = sum(r[0] for r in rows if not r[2].startswith("cuda") and "Memcpy" not in r[2]) / 1e3
print(f"prefill T={t}: wall {wall * 1e3:.1f} ms ({t / wall:.0f} tok/s), profiled kernels")
print(f"{'device ms':>10} {'count':>6}  name")
for dev, n, k in rows[:30]:
    print(f"{dev / 1e3:>10.2f} {n:>6}  {k[:110]}")
print(f"sum of rows above (kernels and copies): {sum(r[0] for r in rows) / 1e3:.1f} ms")

# the host's side: Python time by function over one more prefill (cProfile adds its overhead)
import cProfile  # noqa: E402
import pstats  # noqa: E402

engine.reset()
cpr = cProfile.Profile()
t0 = time.perf_counter()
cpr.enable()
engine.forward(prompt)
cp.cuda.Device().synchronize()
cpr.disable()
print(f"\nhost profile (cProfile; wall under it {1e3 * (time.perf_counter() - t0):.1f} ms):")
pstats.Stats(cpr).sort_stats("tottime").print_stats(28)
