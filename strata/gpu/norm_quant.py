"""RMSNorm + activation rounding (kernels/norm_quant.cu): launcher and NumPy reference.

An `ActBuf` holds one activation in every form a matmul may want, preallocated for up to
`tmax` rows of `n`: the Q8 quants and scales, or the f16/bf16-rounded floats.
"""

from __future__ import annotations

import numpy as np
from gguf.constants import GGMLQuantizationType

from strata.gpu.rawmod import Kernels, f32, i32, ptr
from strata.quant.activation import quantize_q8_0, quantize_q8_K, roundtrip

QT = GGMLQuantizationType
MODES = {QT.F32: 0, QT.F16: 1, QT.Q8_0: 8, QT.Q8_K: 15, QT.BF16: 30}
BLOCK = {QT.Q8_0: 32, QT.Q8_K: 256}  # elements per activation scale
THREADS = 256
THREADS_FEW = 1024  # up to FEW rows (decode): one row's loads and sums spread over more warps
FEW = 16
VEC, CHUNKS = 8, 4  # norm_quant.cu NQ_V, NQ_CMAX: its register path, 8 elements a thread x 4


def mode_of(vec_dot) -> QT:
    vd = QT(int(vec_dot))
    if vd not in MODES:
        raise ValueError(f"no device activation format for vec_dot {vd.name}")
    return vd


def xd_shift(vec_dot) -> int:
    """log2(elements per activation scale / 32): Q8_0 0, Q8_K 3."""
    return {QT.Q8_0: 0, QT.Q8_K: 3}[QT(int(vec_dot))]


class ActBuf:
    """Device buffers for an activation [tmax, n] quantized/rounded for one vec_dot type."""

    def __init__(self, cp, n: int, tmax: int, vec_dot):
        self.n, self.tmax, self.mode = n, tmax, mode_of(vec_dot)
        if self.mode in BLOCK:
            if n % BLOCK[self.mode]:
                raise ValueError(f"activation length {n} is not whole {self.mode.name} blocks")
            self.q = cp.empty((tmax, n), np.int8)
            self.d = cp.empty((tmax, n // 32), np.float32)  # room for Q8_0's finer scales
            self.r = None
        else:
            self.q = self.d = None
            self.r = cp.empty((tmax, n), np.float32)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.q, self.d, self.r) if a is not None)

    @staticmethod
    def bytes_for(n: int, tmax: int, vec_dot) -> int:
        m = mode_of(vec_dot)
        return tmax * (n + 4 * (n // 32)) if m in BLOCK else tmax * n * 4


def threads_for(n: int, t: int, warp: int) -> int:
    """The block of one row: n/8 threads rounded up to whole warps for the kernel's register
    path (fixed per n, so CUDA graphs stay valid); the generic path's otherwise."""
    if n % VEC == 0 and n <= VEC * CHUNKS * THREADS_FEW:
        return min(THREADS_FEW, -(-n // VEC // warp) * warp)
    return THREADS_FEW if t <= FEW else THREADS


def norm_quant(
    K: Kernels,
    x,
    t: int,
    w=None,
    eps: float = 0.0,
    out_f=None,
    act: ActBuf | None = None,
) -> None:
    """Rows 0..t-1 of x [*, n]: y = RMSNorm(x) * w (w None: y = x) into out_f and/or act."""
    n = int(x.shape[-1])
    mode = MODES[act.mode] if act is not None else 0
    K.fn("norm_quant.cu", "norm_quant")(
        (t,),
        (threads_for(n, t, K.warp),),
        (
            x,
            ptr(w),
            f32(eps),
            i32(n),
            ptr(out_f),
            ptr(act.r if act is not None else None),
            ptr(act.q if act is not None else None),
            ptr(act.d if act is not None else None),
            i32(mode),
        ),
    )


# ---- NumPy reference (HostTier's formulas) ----
def rms_norm_ref(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    if w is None:
        return x.astype(np.float32)
    ms = np.mean(np.square(x, dtype=np.float64), axis=-1, keepdims=True)
    return (x * (1.0 / np.sqrt(ms + np.float32(eps))).astype(np.float32)) * w


def quant_ref(y: np.ndarray, vec_dot) -> dict:
    """What ActBuf holds after norm_quant for activation y [T, n]."""
    m = mode_of(vec_dot)
    if m == QT.Q8_K:
        d, q = quantize_q8_K(y)
        return {"q": q, "d": d}
    if m == QT.Q8_0:
        d, q = quantize_q8_0(y)
        return {"q": q, "d": d.astype(np.float32)}
    return {"r": roundtrip(y, m)}
