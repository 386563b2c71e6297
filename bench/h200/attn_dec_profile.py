"""Where attention_decode's time goes: CUPTI kernel records (torch.profiler) of its launches, one
row per kernel name, at several positions of one cache of capacity S_CAP (as the engine holds
it), Qwen3-30B-A3B heads (H 32, G 4, Dh 128), f16 K/V, eager launches over 4 L2-cold layers; then
the same calls as one graph (+ PDL) for the whole call's time. Usage:
python3 bench/h200/attn_dec_profile.py [CONTEXTS] [GRIDS]   (defaults 512,4096,32768 / 0:
the workspace's split count; a list such as 0,8 adds grids, "s" the one-launch short kernel,
attn_dec_short, at contexts it takes, "c" / "cN" the cluster kernel attn_dec_cl with the
default / N blocks a cluster)."""

import sys

import cupy as cp
import numpy as np
from attn_cache import S_CAP, setup
from torch.profiler import ProfilerActivity, profile

from strata.gpu.attention import DEC_CL_GRID, DEC_SHORT_GRID, DEC_SHORT_MAX, attention_decode

LAYERS, REPS = 4, 10


def _ints(i: int, default: str) -> list[int]:
    return [int(v) for v in (sys.argv[i] if len(sys.argv) > i else default).split(",")]


ctxs = _ints(1, "512,4096,32768")
nss = (sys.argv[2] if len(sys.argv) > 2 else "0").split(",")
c = setup(LAYERS)
K, ws, full, t = c.K, c.ws, c.full, c.timer
print(f"S_cap {S_CAP}, workspace nsplit {full}, min_chunk {ws.dec_min_chunk}, cluster {ws.dec_cl}")
cl_default = ws.dec_cl
for ctx in ctxs:
    pos = cp.asarray(np.array([ctx - 1], np.int32))
    for ns in nss:
        if (ns == "s" and ctx > DEC_SHORT_MAX) or (ns.startswith("c") and not cl_default):
            continue
        if ns.startswith("c"):
            ws.dec_nsplit, ws.dec_cl = DEC_CL_GRID, int(ns[1:] or cl_default)
        else:
            ws.dec_nsplit = DEC_SHORT_GRID if ns == "s" else int(ns) or full

        def call(i, pos=pos):
            attention_decode(K, ws, c.q, c.kc[i], c.vc[i], pos, c.dims, c.scale, c.o)

        for i in range(LAYERS):
            call(i)
        cp.cuda.Device().synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(REPS):
                for i in range(LAYERS):
                    call(i)
            cp.cuda.Device().synchronize()
        rows = [
            (ev.key, ev.count, (getattr(ev, "device_time_total", 0) or ev.cuda_time_total))
            for ev in prof.key_averages()
            if ev.key.startswith("attn_")
        ]
        us, how = t.graph_us([lambda i=i: call(i) for i in range(LAYERS)], pdl=K)
        parts = ", ".join(f"{k} {tot / n:.2f} us" for k, n, tot in sorted(rows))
        print(
            f"ctx {ctx:6d} grid {ns if ns[0] in 'sc' else ws.dec_nsplit:>4}: {how} {us:.2f} us per "
            "call; eager "
            f"kernels: {parts}",
            flush=True,
        )
