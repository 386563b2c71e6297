"""attention_decode's split shape swept on the card: min_chunk (the keys a split takes at least,
a launch argument) and nsplit (the split count, fixed by the workspace) at several positions of
one cache of capacity S_CAP, as the engine holds it (the bench arm's cache is as long as its
context). Qwen3-30B-A3B heads (H 32, G 4, Dh 128), f16 K/V, graphs over L2-cold layers, median
of 15. Usage: python3 bench/h200/attn_dec_sweep.py [CONTEXTS] [MIN_CHUNKS] [NSPLITS]
(defaults 512,2048,4096,8192,16384,32768 / 64,128,256,512,1024 / 0,66: 0 = the workspace's)."""

import sys

import cupy as cp
import numpy as np
from attn_cache import S_CAP, setup

from strata.gpu.attention import attention_decode


def _ints(i: int, default: str) -> list[int]:
    return [int(v) for v in (sys.argv[i] if len(sys.argv) > i else default).split(",")]


ctxs = _ints(1, "512,2048,4096,8192,16384,32768")
mcs = _ints(2, "64,128,256,512,1024")
nss = _ints(3, "0,66")
c = setup(4)
K, ws, full, t, layers = c.K, c.ws, c.full, c.timer, c.layers
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
                attention_decode(K, ws, c.q, c.kc[i], c.vc[i], pos, c.dims, c.scale, c.o)

            us, _ = t.graph_us([lambda i=i: call(i) for i in range(layers)])
            row.append(us)
        print(f"{ctx:6d} {ws.dec_nsplit:6d}" + "".join(f" {u:8.2f}" for u in row), flush=True)
