"""Where attention_decode's time goes: CUPTI kernel records (torch.profiler) of its launches, one
row per kernel name, at several positions of one cache of capacity S_CAP (as the engine holds
it), Qwen3-30B-A3B heads (H 32, G 4, Dh 128), f16 K/V, eager launches over 4 L2-cold layers; then
the same calls as one graph (+ PDL) for the whole call's time. Usage:
python3 bench/h200/attn_dec_profile.py [CONTEXTS] [GRIDS]   (defaults 512,4096,32768 / 0:
the workspace's split count; a list such as 0,8 adds grids, "s" the one-launch short kernel,
attn_dec_short, at contexts it takes)."""

import sys

import cupy as cp
import numpy as np
from torch.profiler import ProfilerActivity, profile

from strata.bench import gpu_kernels as gk
from strata.gpu.attention import DEC_SHORT_GRID, DEC_SHORT_MAX, AttnWorkspace, attention_decode
from strata.gpu.device import primary_device
from strata.gpu.rawmod import Kernels

H, G, DH, S_CAP, LAYERS, REPS = 32, 4, 128, 32768, 4, 10


def _ints(i: int, default: str) -> list[int]:
    return [int(v) for v in (sys.argv[i] if len(sys.argv) > i else default).split(",")]


ctxs = _ints(1, "512,4096,32768")
nss = (sys.argv[2] if len(sys.argv) > 2 else "0").split(",")
info = primary_device()
K = Kernels(cp, info.warp_size, info.sm_count, (), info.arch)
rng = np.random.default_rng(0)
kc = cp.asarray(rng.standard_normal((LAYERS, G, S_CAP, DH)).astype(np.float16)).view(np.uint16)
vc = cp.asarray(rng.standard_normal((LAYERS, G, S_CAP, DH)).astype(np.float16)).view(np.uint16)
q = cp.asarray(rng.standard_normal((1, H, DH)).astype(np.float16).astype(np.float32))
ws = AttnWorkspace(cp, K, H, G, S_CAP, DH, 1)
full = ws.dec_nsplit
o = cp.empty((1, H * DH), np.float32)
scale = float(np.float32(1 / np.sqrt(DH)))
t = gk._Timer(cp)
print(f"S_cap {S_CAP}, workspace nsplit {full}, min_chunk {ws.dec_min_chunk}")
for ctx in ctxs:
    pos = cp.asarray(np.array([ctx - 1], np.int32))
    for ns in nss:
        if ns == "s" and ctx > DEC_SHORT_MAX:
            continue
        ws.dec_nsplit = DEC_SHORT_GRID if ns == "s" else int(ns) or full

        def call(i, pos=pos):
            attention_decode(K, ws, q, kc[i], vc[i], pos, (H, G, DH, DH), scale, o)

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
            f"ctx {ctx:6d} grid {ns if ns == 's' else ws.dec_nsplit:>4}: {how} {us:.2f} us per "
            "call; eager "
            f"kernels: {parts}",
            flush=True,
        )
