"""attention_decode's split shape swept on the card: min_chunk (the keys a split takes at least,
a launch argument) and nsplit (the split count, fixed by the workspace) at several positions of
one cache of capacity S_CAP, as the engine holds it (the bench arm's cache is as long as its
context). Qwen3-30B-A3B heads (H 32, G 4, Dh 128), f16 K/V, graphs over L2-cold layers, median
of 15. Usage: python3 bench/h200/attn_dec_sweep.py [CONTEXTS] [MIN_CHUNKS] [NSPLITS]
(defaults 512,2048,4096,8192,16384,32768 / 64,128,256,512,1024 / 0,66: 0 = the workspace's)."""

import sys

import cupy as cp
import numpy as np

from strata.bench import gpu_kernels as gk
from strata.gpu.attention import AttnWorkspace, attention_decode
from strata.gpu.device import primary_device
from strata.gpu.rawmod import Kernels

H, G, DH, S_CAP = 32, 4, 128, 32768


def _ints(i: int, default: str) -> list[int]:
    return [int(v) for v in (sys.argv[i] if len(sys.argv) > i else default).split(",")]


ctxs = _ints(1, "512,2048,4096,8192,16384,32768")
mcs = _ints(2, "64,128,256,512,1024")
nss = _ints(3, "0,66")
info = primary_device()
K = Kernels(cp, info.warp_size, info.sm_count, (), info.arch)
rng = np.random.default_rng(0)
layers = 4  # 4 x 2 x 32 MiB of cache: more than the L2 holds
kc = cp.asarray(rng.standard_normal((layers, G, S_CAP, DH)).astype(np.float16)).view(np.uint16)
vc = cp.asarray(rng.standard_normal((layers, G, S_CAP, DH)).astype(np.float16)).view(np.uint16)
q = cp.asarray(rng.standard_normal((1, H, DH)).astype(np.float16).astype(np.float32))
ws = AttnWorkspace(cp, K, H, G, S_CAP, DH, 1)
full = ws.dec_nsplit
o = cp.empty((1, H * DH), np.float32)
scale = float(np.float32(1 / np.sqrt(DH)))
t = gk._Timer(cp)
print(f"S_cap {S_CAP}, workspace nsplit {full}; us per attention_decode (graph)")
print(f"{'ctx':>6} {'nsplit':>6}" + "".join(f" {'mc ' + str(m):>8}" for m in mcs))
for ctx in ctxs:
    pos = cp.asarray(np.array([ctx - 1], np.int32))
    cp.cuda.Device().synchronize()
    for ns in nss:
        ws.dec_nsplit = ns or full
        row = []
        for mc in mcs:
            ws.dec_min_chunk = mc

            def call(i, pos=pos):
                attention_decode(K, ws, q, kc[i], vc[i], pos, (H, G, DH, DH), scale, o)

            us, _ = t.graph_us([lambda i=i: call(i) for i in range(layers)])
            row.append(us)
        print(f"{ctx:6d} {ws.dec_nsplit:6d}" + "".join(f" {u:8.2f}" for u in row), flush=True)
