"""Decode-time (T <= 8) resident-expert and T = 1 GEMV variants on the GPU, llm.c dev/cuda style:
each variant checked against the NumPy reference, then timed (CUDA graph replays over L2-cold
weight copies, median), with its % of the measured device-to-device copy bandwidth.

    python bench/experts_decode_sweep.py [--json PATH]

Builds (compile-time knobs of quant_blocks.cuh): plain, fast (STRATA_FAST_DECODE: sign bytes
computed, IQ3_XXS qs read as words, Q4_K/Q5_K scales branch-free), fast+smem (and
STRATA_SMEM_GRID: small i-quant grids in shared memory; the default).
Experts (Qwen3-30B-A3B layer: D 2048, F 768, K 8; T 1 and 4): the decode kernel pairs
"<gate/up>+<down>" of strata.gpu.experts (legacy, st1, st2, fq x legacy, st), each call = gate/up +
the intermediate's Q8 quantization + down (fq: that quantization done by the gate/up kernel's last
block of each pair, two launches instead of three). GEMV (T = 1) at attn_q/attn_kv/attn_o
(--gemv-shapes: any of gpu_kernels.SHAPES): split (gemv1w_*) against staged (gemv1s_*), each
timed as a graph of back-to-back launches without and with programmatic dependent launch (PDL).
Defaults to flip afterwards: strata/gpu/experts.py DEFAULT_MOE_VARIANT / MOE_VARIANT_BY_TYPE,
strata/gpu/gemv.py DEFAULT_GEMV1, strata/gpu/kernels/quant_blocks.cuh STRATA_FAST_DECODE /
STRATA_SMEM_GRID.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize

from strata.bench.gpu_kernels import L2_BYTES, SHAPES, _copies, _copy_gbps, _Timer, _weights
from strata.gpu.experts import (
    DOWN_VARIANTS,
    GATE_UP_VARIANTS,
    SlotStore,
    default_variant,
    moe_experts,
    parse_variant,
)
from strata.gpu.gemv import gemv, gemv_ref
from strata.gpu.norm_quant import ActBuf, norm_quant
from strata.gpu.rawmod import Kernels
from strata.quant import fmt, random_quantized
from strata.quant.activation import roundtrip

QT = GGMLQuantizationType
D, F, KUSED = 2048, 768, 8
QUANTS = (QT.IQ3_XXS, QT.Q4_K, QT.Q8_0, QT.IQ2_XXS, QT.IQ1_M)
GEMV_SHAPES = ("attn_q", "attn_kv", "attn_o")
# T = 1 GEMV variants (strata.gpu.gemv): split = gemv1w_*, staged = gemv1s_*
GEMV_VARIANTS = ("split", "staged")
BUILDS = {  # the default build is fast+smem (quant_blocks.cuh)
    "plain": ("-DSTRATA_FAST_DECODE=0", "-DSTRATA_SMEM_GRID=0"),
    "fast": ("-DSTRATA_FAST_DECODE=1", "-DSTRATA_SMEM_GRID=0"),
    "fast+smem": (),
}
N_EXP = 4  # distinct random experts, repeated over the slots


def rel(a, b) -> float:
    return float(np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(b).max(), 1e-30))


class ExpertCase:
    """One layer's resident experts: slots holding N_EXP random experts cyclically, enough slots
    that the calls of a graph (each on P = T*K distinct slots) read more than the L2 holds."""

    def __init__(self, cp, qt, t: int, rng):
        f = fmt(qt)
        self.qt, self.t, self.p = qt, t, t * KUSED
        sizes = (f.row_bytes(D) * F, f.row_bytes(D) * F, f.row_bytes(F) * D)
        self.expert_bytes = sum(sizes)
        n_slots = max(2 * self.p, -(-4 * L2_BYTES // self.expert_bytes))
        self.calls = max(2, n_slots // self.p)
        n_slots = self.calls * self.p
        shapes = ((F, D), (F, D), (D, F))
        self.raws = [random_quantized(qt, (N_EXP, r, c), rng, 1 / np.sqrt(c)) for r, c in shapes]
        self.stores = []
        for st_bytes, raw in zip(sizes, self.raws, strict=True):
            st = SlotStore(cp, n_slots, st_bytes)
            one = cp.asarray(np.ascontiguousarray(raw).reshape(N_EXP, -1).view(np.uint8))
            for s0 in range(0, n_slots, N_EXP):
                n = min(N_EXP, n_slots - s0)
                st.buf[s0 : s0 + n] = one[:n]
            self.stores.append(st)
        self.deq = [dequantize(r, qt).reshape(N_EXP, *sh)
                    for r, sh in zip(self.raws, shapes, strict=True)]  # fmt: skip
        # call i uses slots i*P .. i*P + P - 1 (pair p of call i: slot i*P + p)
        self.slots = [np.arange(i * self.p, (i + 1) * self.p, dtype=np.int32)
                      for i in range(self.calls)]  # fmt: skip
        self.pair_slot = [cp.asarray(s) for s in self.slots]
        self.w = rng.uniform(0.1, 1, self.p).astype(np.float32)
        self.pair_w = cp.asarray(self.w)
        self.h = rng.standard_normal((t, D)).astype(np.float32)
        self.vd = f.vec_dot
        self.act = cp.zeros((self.p, F), np.float32)
        self.out = cp.zeros((t, D), np.float32)
        self.cnt = cp.zeros((self.p,), np.int32)  # the fused-quant (fq) counters, stay 0
        self.bytes = self.p * self.expert_bytes + t * D + 4 * t * D

    def run(self, K, variant: str, i: int, hact: ActBuf, aact: ActBuf) -> None:
        moe_experts(K, (self.qt,) * 3, (D, F), self.stores, hact, self.pair_slot[i], self.pair_w,
                    self.t, KUSED, self.act, aact, self.out, variant=variant,
                    cnt=self.cnt)  # fmt: skip

    def check(self, cp, aact: ActBuf) -> tuple[float, float]:
        """(rel error of act, rel error of out) against NumPy from the same Q8 inputs (call 0)."""
        hr = roundtrip(self.h, self.vd)
        act = cp.asnumpy(self.act)
        aq = cp.asnumpy(aact.q)[: self.p].astype(np.float32)
        nb = F // (256 if QT(self.vd) == QT.Q8_K else 32)
        ad = cp.asnumpy(aact.d).ravel()[: self.p * nb].reshape(self.p, nb)
        a_deq = (aq.reshape(self.p, nb, -1) * ad[..., None]).reshape(self.p, F)
        want_act = np.zeros_like(act)
        want = np.zeros((self.t, D), np.float32)
        for p, s in enumerate(self.slots[0]):
            e, t = int(s) % N_EXP, p // KUSED
            g = hr[t] @ self.deq[0][e].T
            u = hr[t] @ self.deq[1][e].T
            want_act[p] = g / (np.float32(1) + np.exp(-g)) * u
            want[t] += self.w[p] * (a_deq[p] @ self.deq[2][e].T)
        return rel(act[: self.p], want_act[: self.p]), rel(cp.asnumpy(self.out), want)


def sweep_experts(cp, builds: dict, timer, rng, copy: float, quants=QUANTS,
                  variants=None) -> list[dict]:  # fmt: skip
    rows = []
    variants = variants or [f"{g}+{d}" for g in GATE_UP_VARIANTS for d in DOWN_VARIANTS]
    for qt in quants:
        for t in (1, 4):
            case = ExpertCase(cp, qt, t, rng)
            ref_out = None
            for bname, K in builds.items():
                hact = ActBuf(cp, D, t, case.vd)
                aact = ActBuf(cp, F, case.p, case.vd)
                norm_quant(K, cp.asarray(case.h), t, act=hact)
                for v in variants:
                    case.act[...] = 0
                    case.out[...] = 0
                    case.run(K, v, 0, hact, aact)
                    cp.cuda.Device().synchronize()
                    e_act, e_out = case.check(cp, aact)
                    out = cp.asnumpy(case.out)
                    if ref_out is None:
                        ref_out = out  # base legacy+legacy: the engine's kernels today
                    exact = bool(np.array_equal(out, ref_out))
                    ok = e_act < 1e-5 and e_out < 1e-5
                    calls = [lambda i=i, v=v, K=K, h=hact, a=aact, c=case: c.run(K, v, i, h, a)
                             for i in range(case.calls)]  # fmt: skip
                    us, how = timer.graph_us(calls)
                    gbps = case.bytes / (us * 1e-6) / 1e9
                    row = dict(kind="experts", qtype=qt.name, T=t, build=bname, variant=v,
                               us=round(us, 2), gbps=round(gbps, 1),
                               pct_copy=round(100 * gbps / copy, 1), ok=ok,
                               exact_vs_base_legacy=exact, err_act=e_act, err_out=e_out,
                               timing=how)  # fmt: skip
                    rows.append(row)
                    note = "" if exact else " (not bit-equal to legacy)"
                    print(f"experts {qt.name:8} T={t} {bname:9} {v:14} {us:8.2f} us "
                          f"{row['pct_copy']:5.1f}% copy  {'ok' if ok else 'WRONG'}{note}",
                          flush=True)  # fmt: skip
            del case
    return rows


def sweep_gemv(cp, builds: dict, timer, rng, copy: float, quants=QUANTS, shapes=GEMV_SHAPES,
               variants=GEMV_VARIANTS) -> list[dict]:  # fmt: skip
    rows = []
    for qt in quants:
        for shape in shapes:
            r, c = SHAPES[shape]
            nbytes = fmt(qt).row_bytes(c) * r
            ws, big = _weights(cp, qt, r, c, _copies(nbytes), rng)
            raw = cp.asnumpy(ws[0].buf)
            x = rng.standard_normal((1, c)).astype(np.float32)
            want = gemv_ref(raw, qt, x)
            out = cp.empty((1, r), np.float32)
            for bname, K in builds.items():
                act = ActBuf(cp, c, 1, ws[0].vec_dot)
                norm_quant(K, cp.asarray(x), 1, act=act)
                split = None
                for v in ("split",) + tuple(u for u in variants if u != "split"):
                    out[...] = 0
                    gemv(K, ws[0], act, out, 1, variant=v)
                    got = cp.asnumpy(out)
                    err = rel(got, want)
                    split = got if split is None else split
                    exact = bool(np.array_equal(got, split))
                    calls = [lambda w=w, K=K, a=act, v=v, o=out: gemv(K, w, a, o, 1, variant=v)
                             for w in ws]  # fmt: skip
                    us, how = timer.graph_us(calls)
                    us_pdl, how_pdl = timer.graph_us(calls, pdl=K)
                    gbps = (nbytes + c + 4 * r) / (us * 1e-6) / 1e9
                    row = dict(kind="gemv1", qtype=qt.name, shape=shape, build=bname, variant=v,
                               us=round(us, 2), gbps=round(gbps, 1),
                               pct_copy=round(100 * gbps / copy, 1), ok=err < 1e-5, err=err,
                               exact_vs_split=exact, timing=how, us_pdl=round(us_pdl, 2),
                               pct_copy_pdl=round(100 * us / us_pdl * gbps / copy, 1),
                               timing_pdl=how_pdl)  # fmt: skip
                    rows.append(row)
                    note = "" if exact else " (not bit-equal to split)"
                    print(f"gemv1   {qt.name:8} {shape:11} {bname:9} {v:7} {us:8.2f} us "
                          f"{row['pct_copy']:5.1f}% copy | pdl {us_pdl:8.2f} us "
                          f"{row['pct_copy_pdl']:5.1f}%  {'ok' if row['ok'] else 'WRONG'}{note}",
                          flush=True)  # fmt: skip
            del ws, big
    return rows


def summary(doc: dict) -> str:
    """The fastest correct variant per case, against the engine's current kernels."""
    lines = ["", "best per case (vs the engine's current kernels: default build, its MoE pair / "
             "split):"]  # fmt: skip
    cases: dict = {}
    for r in doc["experts"] + doc["gemv"]:
        key = (r["kind"], r["qtype"], r.get("T", r.get("shape")))
        cases.setdefault(key, []).append(r)
    for key, rs in cases.items():
        now = default_variant(QT[key[1]]) if key[0] == "experts" else "split"
        cur = next((r for r in rs if r["build"] == "fast+smem" and r["variant"] == now), rs[0])
        good = [r for r in rs if r["ok"]]
        best = min(good, key=lambda r: r["us"]) if good else cur
        lines.append(f"{key[0]:7} {key[1]:8} {str(key[2]):8} now {cur['us']:7.2f} us "
                     f"({cur['pct_copy']:5.1f}%)  best {best['us']:7.2f} us "
                     f"({best['pct_copy']:5.1f}%) {best['build']} {best['variant']}")  # fmt: skip
    totals: dict = {}
    for r in doc["experts"] + doc["gemv"]:
        k = (r["kind"], r["build"], r["variant"])
        totals.setdefault(k, [0.0, True])
        totals[k][0] += r["us"]
        totals[k][1] &= r["ok"]
    lines.append("summed us over the cases, per (build, variant):")
    for (kind, b, v), (us, ok) in sorted(totals.items(), key=lambda kv: (kv[0][0], kv[1][0])):
        lines.append(f"{kind:7} {b:9} {v:14} {us:9.2f} us {'ok' if ok else 'WRONG somewhere'}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json")
    ap.add_argument("--no-gemv", action="store_true")
    ap.add_argument("--no-experts", action="store_true")
    ap.add_argument("--builds", default=",".join(BUILDS), help="comma list of " + ", ".join(BUILDS))
    ap.add_argument("--quants", default=",".join(q.name for q in QUANTS))
    ap.add_argument("--moe-variants", help="comma list of <gate/up>+<down> (default: all)")
    ap.add_argument("--gemv-variants", default=",".join(GEMV_VARIANTS))
    ap.add_argument("--gemv-shapes", default=",".join(GEMV_SHAPES),
                    help="comma list of " + ", ".join(SHAPES))  # fmt: skip
    ns = ap.parse_args()
    try:
        quants = tuple(QT[q] for q in ns.quants.split(","))
        for v in ns.moe_variants.split(",") if ns.moe_variants else ():
            parse_variant(v, quants[0])
    except KeyError as e:
        ap.error(f"unknown quant {e}")
    except ValueError as e:
        ap.error(str(e))
    bad = [b for b in ns.builds.split(",") if b not in BUILDS]
    bad += [s for s in ns.gemv_shapes.split(",") if s not in SHAPES]
    bad += [v for v in ns.gemv_variants.split(",") if v not in GEMV_VARIANTS]
    if bad:
        ap.error(f"unknown build, shape or GEMV variant: {', '.join(bad)}")
    import cupy as cp

    from strata.gpu.device import primary_device

    t0 = time.perf_counter()
    info = primary_device()
    mask = sum(1 << int(q) for q in quants)  # only these formats' kernels get compiled
    builds = {b: Kernels(cp, info.warp_size, info.sm_count, (f"-DSTRATA_FMT_MASK={mask}ull",)
                            + BUILDS[b]) for b in ns.builds.split(",")}  # fmt: skip
    timer, rng = _Timer(cp), np.random.default_rng(0)
    copy = max(_copy_gbps(cp, timer).values())
    print(f"{info.describe()} | device-to-device copy {copy:.0f} GB/s", flush=True)
    doc = {"device": info.describe(), "copy_gbps": round(copy, 1),
           "builds": {b: list(BUILDS[b]) for b in builds}}  # fmt: skip
    mv = ns.moe_variants.split(",") if ns.moe_variants else None
    doc["experts"] = (
        [] if ns.no_experts else sweep_experts(cp, builds, timer, rng, copy, quants, mv)
    )
    doc["gemv"] = [] if ns.no_gemv else sweep_gemv(
        cp, builds, timer, rng, copy, quants, ns.gemv_shapes.split(","),
        ns.gemv_variants.split(","))  # fmt: skip
    print(summary(doc))
    doc["seconds"] = round(time.perf_counter() - t0, 1)
    print(f"sweep took {doc['seconds']} s", flush=True)
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
