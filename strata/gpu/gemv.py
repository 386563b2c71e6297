"""Quantized GEMV / skinny GEMM (kernels/gemv.cu): device weights, launcher, NumPy reference.

A `DeviceWeight` is a GGUF tensor's bytes uploaded unchanged ([rows, row_bytes] uint8) with the
activation type llama.cpp pairs it with (`vec_dot`); `gemv()` multiplies it by an activation
already prepared in an `ActBuf` (norm_quant.py), as ggml's mmvq does with its q8_1 input.
Decode (T = 1) of float weights (the router) takes gemv1f_*: a block per row, 16-byte loads.
Decode (T = 1) of quantized weights takes gemv1w_*: one warp a row, the row split over two warps
when the rows alone leave the SMs short of warps (attn_k/v, attn_o).
"""

from __future__ import annotations

import numpy as np
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize

from strata.gpu.norm_quant import ActBuf, xd_shift
from strata.gpu.rawmod import Kernels, i32, ptr
from strata.quant import fmt
from strata.quant.activation import roundtrip

QT = GGMLQuantizationType
Q_NAMES = {
    QT.Q8_0: "q8_0",
    QT.Q4_K: "q4_k",
    QT.Q5_K: "q5_k",
    QT.Q6_K: "q6_k",
    QT.IQ4_XS: "iq4_xs",
    QT.IQ3_XXS: "iq3_xxs",
    QT.IQ3_S: "iq3_s",
    QT.IQ2_XXS: "iq2_xxs",
    QT.IQ2_S: "iq2_s",
    QT.IQ1_M: "iq1_m",
    QT.MXFP4: "mxfp4",
}
F_NAMES = {QT.F32: "f32", QT.F16: "f16", QT.BF16: "bf16"}
SUPPORTED = tuple(Q_NAMES) + tuple(F_NAMES)
THREADS = 128
GEMV1F_THREADS = 128  # gemv.cu's GEMV1F_THREADS: gemv1f_* (T = 1, float weights), a block per row
# warps per block of gemv1w_* (read from blockDim there): 4 decodes fastest in the engine (16:
# -3% all resident, though a lone K-quant GEMV at attention shapes gains) ...
GEMV1_WARPS = 4
# ... but IQ1_M and IQ2_S stage their code table in shared memory (gemv.cu GEMV1_SMEM_FMTS),
# which 16 warps share (IQ1_M's GEMVs 0.82-0.87x the time of 4 warps')
GEMV1_WARPS_BY_TYPE = {QT.IQ1_M: 16, QT.IQ2_S: 16}
# gemv1w_*'s PDL trigger (common.cuh's split form): at once for Q8_0 (a cheap decode) and for
# grids of at most this many warps; after the main loop for the rest
PDL_EARLY_WARPS = 2048
GEMV_NT = 8  # gemv.cu's GEMV_NT: tokens a pass of gemv_* (T > 1)
MMA_NT, MMA_WARPS = 32, 4  # experts_mma.cu: rows of x a tile, warps (16 weight rows each) a block
MMA_DENSE_NT = 64  # experts_mma.cu dense_mma: tokens a tile of a prompt's dense GEMM
FULL_WARPS_PER_SM = 64  # resident warps an SM holds (sm_80 .. sm_90); prefill GEMV's token split
WARPS_PER_SM = 16  # gemv1w_*: below this many warps per SM, a row is split over two warps
MAX_WPR = 2  # warps a row at most (more lost on the H200)


def kernel_name(prefix: str, qtype) -> str:
    q = QT(int(qtype))
    name = Q_NAMES.get(q) or F_NAMES.get(q)
    if name is None:
        raise ValueError(f"no device kernel for {q.name} weights")
    return f"{prefix}_{name}"


class DeviceWeight:
    """A [rows, cols] GGUF weight on the device, raw blocks; optional float32 bias [rows]."""

    def __init__(self, cp, raw: np.ndarray, qtype, rows: int, cols: int, bias=None):
        self.qtype = QT(int(qtype))
        if self.qtype not in SUPPORTED:
            raise ValueError(f"no device kernel for {self.qtype.name} weights")
        f = fmt(self.qtype)
        self.rows, self.cols = int(rows), int(cols)
        self.vec_dot = f.vec_dot
        raw = np.ascontiguousarray(raw).view(np.uint8).reshape(self.rows, f.row_bytes(self.cols))
        self.buf = cp.asarray(raw)
        self.bias = None if bias is None else cp.asarray(np.asarray(bias, np.float32))

    @property
    def nbytes(self) -> int:
        return int(self.buf.nbytes) + (0 if self.bias is None else int(self.bias.nbytes))

    @property
    def quantized(self) -> bool:
        return self.qtype in Q_NAMES


def warps_per_row(K: Kernels, w: DeviceWeight) -> int:
    """gemv1w_*'s warps per row: 1, or 2 when the rows alone leave the SMs short of warps."""
    nsub = w.cols // 32
    wpr = 1
    while wpr < MAX_WPR and w.rows * wpr < WARPS_PER_SM * K.sm_count and nsub >= 32 * wpr:
        wpr *= 2
    return wpr


def pdl_early(w: DeviceWeight, wpr: int) -> bool:
    """gemv1w_*'s `early`: let the next kernel in right after the PDL wait (else after the main
    loop). A large grid of a costly decode lost 10-25% when its successor's blocks squatted on
    the SMs while its own still read (Q4_K/Q6_K/IQ3_XXS at 4096 rows); Q8_0 and small grids
    gained from the early start."""
    return w.qtype == QT.Q8_0 or w.rows * wpr <= PDL_EARLY_WARPS


def token_groups(K: Kernels, rows: int, t: int) -> int:
    """Blocks along the tokens (grid y) of a T > 1 GEMV, each taking passes of GEMV_NT tokens:
    with a warp a row, few rows leave most SMs idle (the router's 128 rows ran on 32 blocks:
    100 us a 32-token call on the H200), so the
    passes are spread until the rows times the groups give about a full card of warps."""
    passes = -(-t // GEMV_NT)
    want = -(-(FULL_WARPS_PER_SM * K.sm_count) // max(rows, 1))
    return max(1, min(passes, want))


def gemv(
    K: Kernels,
    w: DeviceWeight,
    act,
    out,
    t: int,
    resid=None,
    ldo: int | None = None,
    groups: int | None = None,
) -> None:
    """out[:t] = act[:t] @ w.T (+ w.bias) (+ resid[:t]); out and resid rows `ldo` floats apart
    (default: rows). `act` is an ActBuf prepared for w.vec_dot; for F32 weights it may also be
    the float activation itself. `groups`: blocks along the tokens of a T > 1 call (default
    `token_groups`; the same bits for any)."""
    if t == 1 and w.quantized:
        wpr = warps_per_row(K, w)
        nw = GEMV1_WARPS_BY_TYPE.get(w.qtype, GEMV1_WARPS)
        rpb = nw // wpr
        args = (w.buf, act.q, act.d, i32(xd_shift(act.mode)), ptr(w.bias), ptr(resid), out)
        K.fn("gemv.cu", kernel_name("gemv1w", w.qtype))(
            (-(-w.rows // rpb),),
            (nw * K.warp,),
            args + (i32(w.rows), i32(w.cols), i32(wpr), i32(pdl_early(w, wpr))),
        )
        return
    if t == 1 and not w.quantized and w.cols % 8 == 0:
        x = act.r if isinstance(act, ActBuf) else act
        K.fn("gemv.cu", kernel_name("gemv1f", w.qtype))(
            (w.rows,), (GEMV1F_THREADS,), (w.buf, x, ptr(w.bias), ptr(resid), out, i32(w.cols))
        )
        return
    wpb = K.warps_per_block(THREADS)
    gy = groups or token_groups(K, w.rows, t)
    grid = ((w.rows + wpb - 1) // wpb, gy)
    block = (wpb * K.warp,)
    if w.quantized:
        args = (w.buf, act.q, act.d, i32(xd_shift(act.mode)), ptr(w.bias), ptr(resid), out)
    else:
        x = act.r if isinstance(act, ActBuf) else act
        args = (w.buf, x, ptr(w.bias), ptr(resid), out)
    K.fn("gemv.cu", kernel_name("gemv", w.qtype))(
        grid, block, args + (i32(w.rows), i32(w.cols), i32(t), i32(ldo or w.rows))
    )


def gemm_mma(K: Kernels, w: DeviceWeight, act: ActBuf, out, t: int, resid=None, ldo=None) -> None:
    """`gemv` of a prompt chunk (quantized w, T > 1) on the int8 tensor cores: experts_mma.cu's
    dense_mma, w as its one slot and tiles of MMA_DENSE_NT consecutive tokens (CUDA sm_80+:
    `K.int8_mma`). Each sub-block's integer sum is exact; float order differs from gemv_*."""
    slot, first, n, order = K.token_tiles(t, MMA_DENSE_NT)
    K.fn("experts_mma.cu", f"dense_mma_{Q_NAMES[QT(int(w.qtype))]}")(
        (-(-w.rows // (16 * MMA_WARPS)), first.size),
        (32 * MMA_WARPS,),
        (
            w.buf, np.int64(0), act.q, act.d, i32(xd_shift(act.mode)), slot, first, n, order,
            out, i32(w.rows), i32(w.cols), ptr(w.bias), ptr(resid), i32(ldo or w.rows),
        ),
    )  # fmt: skip


def gemv_ref(raw: np.ndarray, qtype, x: np.ndarray, bias=None, resid=None) -> np.ndarray:
    """HostTier's `_Linear`: roundtrip(x, vec_dot) @ dequant(W).T (+ bias) (+ resid)."""
    w = dequantize(np.ascontiguousarray(raw), QT(int(qtype))).astype(np.float32)
    y = roundtrip(x, fmt(qtype).vec_dot) @ w.reshape(raw.shape[0], -1).T
    if bias is not None:
        y = y + bias
    return y if resid is None else resid + y
