"""Decode-kernel variants on the GPU, llm.c dev/cuda style: each variant timed (CUDA graph
replays, L2-cold copies, median) with its achieved GB/s; the winners live in strata/gpu.

    python bench/decode_kernels_sweep.py [--json PATH]

attention_decode: split count (blocks per SM), the least keys per split, and the compile-time
DEC_U (keys a lane group takes per step) and DEC_TILE (keys per probability tile), with the two
launches also timed one at a time. Decode GEMV: gemv1_* (one warp a row) against gemv1w_* (rows
split over 1/2/4 warps) at the attention shapes. (A variant staging the row bytes through shared
memory with 16-byte loads lost to both at every shape on the H200 and was dropped.)
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from gguf.constants import GGMLQuantizationType

from strata.bench.gpu_kernels import (
    DH,
    L2_BYTES,
    SHAPES,
    G,
    H,
    _copies,
    _copy_gbps,
    _Timer,
    _weights,
)
from strata.gpu.attention import DEC_TEAM_MIN, AttnWorkspace, dec_splits, decode_launches
from strata.gpu.gemv import GEMV1_WARPS, kernel_name
from strata.gpu.norm_quant import ActBuf, norm_quant, xd_shift
from strata.gpu.rawmod import Kernels, i32
from strata.quant import fmt

QT = GGMLQuantizationType


def sweep_attention(cp, K0, timer, rng, copy: float) -> list[dict]:
    rows = []
    scale = float(np.float32(1 / np.sqrt(DH)))
    dims = (H, G, DH, DH)
    for ctx in (4096, 32768):
        kv_bytes = 2 * G * ctx * DH * 2
        layers = max(2, -(-4 * L2_BYTES // kv_bytes))
        kc = cp.asarray(rng.standard_normal((layers, G, ctx, DH)).astype(np.float16)).view(
            np.uint16
        )
        vc = cp.asarray(rng.standard_normal((layers, G, ctx, DH)).astype(np.float16)).view(
            np.uint16
        )
        q = cp.asarray(rng.standard_normal((1, H, DH)).astype(np.float16).astype(np.float32))
        o = cp.empty((1, H * DH), np.float32)
        pos = cp.asarray(np.array([ctx - 1], np.int32))
        cp.cuda.Device().synchronize()  # uploads done before the timer's (non-blocking) stream
        configs = [(ps, mc, ()) for ps in (2, 3, 4, 8) for mc in (32, 64, 128)]
        configs += [(4, 64, (f"-DDEC_U={u}",)) for u in (2, 8)]
        configs += [(4, 64, (f"-DDEC_TILE={t}",)) for t in (32, 128)]
        configs += [(4, 64, ("-DDEC_PV_MINB=4",))]
        for per_sm, mc, extra in configs:
            K = Kernels(cp, K0.warp, K0.sm_count, extra) if extra else K0
            ws = AttnWorkspace(cp, K, H, G, ctx, DH, 1)
            ws.dec_nsplit = dec_splits(K, ctx, G, per_sm)
            ws.dec_pm = cp.empty((H, ws.dec_nsplit), np.float32)
            ws.dec_pl = cp.empty((H, ws.dec_nsplit), np.float32)
            ws.dec_opart = cp.empty((H, ws.dec_nsplit, DH), np.float32)
            nteam = -(-ws.dec_nsplit // DEC_TEAM_MIN)
            ws.dec_tpart = cp.empty((H, nteam, DH), np.float32)
            ws.dec_cnt = cp.zeros((G * (1 + nteam),), np.int32)
            ws.dec_min_chunk = mc
            launches = [decode_launches(K, ws, q, kc[i], vc[i], pos, dims, scale, o)
                        for i in range(layers)]  # fmt: skip
            res = {}
            for part, pick in (("both", (0, 1)), ("scores", (0,)), ("pv", (1,))):
                calls = [lambda ln=ln, pick=pick: [ln[j][0](*ln[j][1:]) for j in pick]
                         for ln in launches]  # fmt: skip
                us, _ = timer.graph_us(calls)
                res[part] = round(us, 2)
            gbps = kv_bytes / (res["both"] * 1e-6) / 1e9
            row = dict(kernel="attention_decode", context=ctx, per_sm=per_sm, min_chunk=mc,
                       nsplit=ws.dec_nsplit, options=" ".join(extra), us=res["both"],
                       us_scores=res["scores"], us_pv=res["pv"], gbps_kv=round(gbps, 1),
                       pct_copy=round(100 * gbps / copy, 1))  # fmt: skip
            rows.append(row)
            print(
                f"attn ctx {ctx:6} per_sm {per_sm} min_chunk {mc:4} {row['options']:14} "
                f"{res['both']:8.2f} us (scores {res['scores']:7.2f}, pv {res['pv']:7.2f}) "
                f"{row['pct_copy']:5.1f}% copy",
                flush=True,
            )
            del ws
        del kc, vc
    return rows


def sweep_gemv(cp, K, timer, rng, copy: float) -> list[dict]:
    rows = []
    for qt in (QT.Q8_0, QT.Q4_K, QT.Q6_K, QT.IQ4_XS, QT.IQ3_XXS):
        for shape in ("attn_q", "attn_kv", "attn_o"):
            r, c = SHAPES[shape]
            nbytes = fmt(qt).row_bytes(c) * r
            ws, big = _weights(cp, qt, r, c, _copies(nbytes), rng)
            act = ActBuf(cp, c, 1, ws[0].vec_dot)
            norm_quant(K, cp.asarray(rng.standard_normal((1, c)).astype(np.float32)), 1, act=act)
            out = cp.empty((1, r), np.float32)
            sh = i32(xd_shift(act.mode))
            variants = [("gemv1", 1)] + [("gemv1w", wpr) for wpr in (1, 2, 4)]
            for name, wpr in variants:
                fn = K.fn("gemv.cu", kernel_name(name, qt))
                if name == "gemv1":
                    wpb = K.warps_per_block(128)
                    grid, block = ((r + wpb - 1) // wpb,), (wpb * K.warp,)
                    tail = (i32(r), i32(c), i32(1), i32(r))
                else:
                    grid, block = (-(-r // (GEMV1_WARPS // wpr)),), (GEMV1_WARPS * K.warp,)
                    tail = (i32(r), i32(c), i32(wpr), i32(0))  # early = 0: trigger after the loop
                mid = (act.q, act.d, sh, np.uint64(0), np.uint64(0), out)
                calls = [lambda w=w, fn=fn, grid=grid, block=block, a=mid + tail: fn(
                    grid, block, (w.buf,) + a) for w in ws]  # fmt: skip
                us, _ = timer.graph_us(calls)
                gbps = (nbytes + c + 4 * r) / (us * 1e-6) / 1e9
                rows.append(dict(kernel=name, wpr=wpr, qtype=qt.name, shape=shape, us=round(us, 2),
                                 pct_copy=round(100 * gbps / copy, 1)))  # fmt: skip
                print(f"gemv {qt.name:8} {shape:8} {name:7} wpr {wpr} {us:7.2f} us "
                      f"{rows[-1]['pct_copy']:5.1f}% copy", flush=True)  # fmt: skip
            del ws, big
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json")
    ns = ap.parse_args()
    import cupy as cp

    from strata.gpu.device import primary_device

    info = primary_device()
    K = Kernels(cp, info.warp_size, info.sm_count)
    timer, rng = _Timer(cp), np.random.default_rng(0)
    copy = max(_copy_gbps(cp, timer).values())
    print(f"{info.describe()} | device-to-device copy {copy:.0f} GB/s", flush=True)
    doc = {"device": info.describe(), "copy_gbps": round(copy, 1)}
    doc["attention"] = sweep_attention(cp, K, timer, rng, copy)
    doc["gemv"] = sweep_gemv(cp, K, timer, rng, copy)
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
