"""The decode attention setup bench/h200's attention scripts share: Qwen3-30B-A3B heads
(H 32, G 4, Dh = Dv = 128), `layers` f16 K/V caches of S_CAP rows each (random, as the engine
holds them: 4 x 2 x 32 MiB, more than the L2 holds), one query, a decode workspace, a graph
timer."""

from types import SimpleNamespace

import cupy as cp
import numpy as np

from strata.bench import gpu_kernels as gk
from strata.gpu.attention import AttnWorkspace
from strata.gpu.device import primary_device
from strata.gpu.rawmod import Kernels

H, G, DH, S_CAP = 32, 4, 128, 32768


def setup(layers: int = 4) -> SimpleNamespace:
    info = primary_device()
    K = Kernels(cp, info.warp_size, info.sm_count, (), info.arch)
    rng = np.random.default_rng(0)
    shape = (layers, G, S_CAP, DH)
    kc = cp.asarray(rng.standard_normal(shape).astype(np.float16)).view(np.uint16)
    vc = cp.asarray(rng.standard_normal(shape).astype(np.float16)).view(np.uint16)
    q = cp.asarray(rng.standard_normal((1, H, DH)).astype(np.float16).astype(np.float32))
    ws = AttnWorkspace(cp, K, H, G, S_CAP, DH, 1)
    return SimpleNamespace(
        K=K, kc=kc, vc=vc, q=q, ws=ws, full=ws.dec_nsplit, layers=layers,
        o=cp.empty((1, H * DH), np.float32), scale=float(np.float32(1 / np.sqrt(DH))),
        timer=gk._Timer(cp), dims=(H, G, DH, DH),
    )  # fmt: skip
