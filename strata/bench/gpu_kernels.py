"""`--arm gpu-kernels`: each device kernel's achieved bandwidth against the device-to-device copy
bandwidth measured in the same run, at Qwen3-30B-A3B shapes (D=2048, F=768, 32 q / 4 kv heads of
128, 128 experts, 8 used), plus decode attention at 4K and 32K context and one whole layer.

Method: CUDA events, warm-up first, median of repeats; each timed region replays a CUDA graph
(with programmatic dependent launch where the device has it, as the engine's graph steps do) of
R launches that cycle over distinct weight copies (more bytes than the L2 holds), so the time is
the device's, not Python's launch rate; bytes = weights + activations read once + outputs
written once. The layer is also timed eagerly (Python launches, the router read-back and host
top-k included). Only the default kernels run, through their public entry points.
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
from gguf.constants import GGMLQuantizationType

QT = GGMLQuantizationType
D, F, E, KUSED = 2048, 768, 128, 8
H, G, DH = 32, 4, 128
L2_BYTES = 64 << 20
GEMV_QUANTS = (
    QT.Q8_0, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.IQ4_XS, QT.IQ3_XXS, QT.IQ3_S, QT.IQ2_XXS, QT.IQ2_S,
    QT.IQ1_M, QT.MXFP4,
)  # fmt: skip
VOCAB = 151936
SHAPES = {  # name: (rows, cols)
    "expert_gate": (F, D),
    "expert_down": (D, F),
    "attn_q": (H * DH, D),
    "attn_kv": (G * DH, D),
    "attn_o": (D, H * DH),
    "lm_head": (VOCAB, D),
}
# the output head is timed for these formats only (the others rarely quantize it)
LM_HEAD_QUANTS = (QT.Q8_0, QT.Q4_K, QT.Q6_K, QT.IQ4_XS, QT.IQ3_XXS)


class _Timer:
    """Median device time of `fn` replayed from a CUDA graph (eager launches if capture fails)."""

    def __init__(self, cp):
        self.cp = cp
        self.stream = cp.cuda.Stream(non_blocking=True)

    def graph_us(self, launches, repeats: int = 15, pdl=None) -> tuple[float, str]:
        """launches: list of zero-argument callables; returns (median us per launch, how).
        pdl: a `Kernels` whose launches are captured with programmatic dependent launch."""
        cp, s = self.cp, self.stream
        with s:
            for f in launches[: min(4, len(launches))]:
                f()  # compile + warm
            s.synchronize()
            graph, how = None, "graph+pdl" if pdl is not None else "graph"
            try:
                s.begin_capture()
                with pdl.pdl_scope() if pdl is not None else nullcontext():
                    for f in launches:
                        f()
                graph = s.end_capture()
            except Exception:
                try:
                    s.end_capture()
                except Exception:
                    pass
                how = "eager"
            if graph is not None:
                run = lambda: graph.launch(s)  # noqa: E731
            else:
                run = lambda: [f() for f in launches]  # noqa: E731
            run()
            s.synchronize()
            times = []
            for _ in range(repeats):
                a, b = cp.cuda.Event(), cp.cuda.Event()
                a.record(s)
                run()
                b.record(s)
                b.synchronize()
                times.append(cp.cuda.get_elapsed_time(a, b) * 1e3 / len(launches))
        return float(np.median(times)), how


def _copy_gbps(cp, timer: _Timer) -> dict:
    """Device-to-device copy of 1 GiB, bytes read + written: cudaMemcpyAsync and a copy
    kernel (CuPy's elementwise copy); the larger is the ceiling the kernels are held to."""
    n = 1 << 30
    src = cp.empty(n // 4, np.float32)
    src[...] = 1
    dst = cp.empty(n // 4, np.float32)
    kind = cp.cuda.runtime.memcpyDeviceToDevice

    def memcpy(d=dst.data.ptr, s=src.data.ptr):
        cp.cuda.runtime.memcpyAsync(d, s, n, kind, timer.stream.ptr)

    def kernel(d=dst, s=src):
        cp.copyto(d, s)

    us_m, _ = timer.graph_us([memcpy] * 4)
    us_k, _ = timer.graph_us([kernel] * 4)
    return {"memcpy": 2 * n / (us_m * 1e-6) / 1e9, "kernel": 2 * n / (us_k * 1e-6) / 1e9}


def _weights(cp, qt, rows: int, cols: int, copies: int, rng, gen_rows: int = 8192):
    """`copies` DeviceWeight-like views into one buffer of random blocks (for L2-cold reads);
    at most `gen_rows` distinct random rows, repeated down a taller matrix (lm_head)."""
    from strata.gpu.gemv import DeviceWeight
    from strata.quant import random_quantized

    n = min(rows, gen_rows)
    one = random_quantized(qt, (n, cols), rng, 1 / np.sqrt(cols))
    base = DeviceWeight(cp, one, qt, n, cols)
    big = cp.empty((copies, rows, base.buf.shape[1]), np.uint8)
    for r0 in range(0, rows, n):
        big[:, r0 : r0 + n] = base.buf[None, : rows - r0]
    ws = []
    for c in range(copies):
        w = DeviceWeight.__new__(DeviceWeight)
        w.qtype, w.rows, w.cols, w.vec_dot, w.bias = base.qtype, rows, cols, base.vec_dot, None
        w.buf = big[c]
        ws.append(w)
    return ws, big


def _copies(nbytes: int) -> int:
    return int(min(512, max(4, -(-4 * L2_BYTES // max(nbytes, 1)))))


def _copy_same_size(cp, timer: _Timer, nbytes: int) -> tuple[float, float]:
    """(us, GB/s) of cudaMemcpyAsync moving `nbytes` through memory (nbytes / 2 read, as many
    written), as a graph over L2-cold buffers like the GEMVs': what a copy achieves at the
    size a kernel reads, where launch, ramp and one memory latency weigh as they do on it."""
    half = max(256, nbytes // 2 // 256 * 256)
    n = _copies(nbytes)
    src = cp.ones((n, half), np.uint8)
    dst = cp.empty((n, half), np.uint8)
    kind = cp.cuda.runtime.memcpyDeviceToDevice
    calls = [lambda d=dst[c].data.ptr, s=src[c].data.ptr:
             cp.cuda.runtime.memcpyAsync(d, s, half, kind, timer.stream.ptr)
             for c in range(n)]  # fmt: skip
    us, _ = timer.graph_us(calls)
    del src, dst
    return us, 2 * half / (us * 1e-6) / 1e9


def bench_gemv(cp, K, timer, rng, copy_gbps: float) -> list[dict]:
    from strata.gpu.gemv import gemv
    from strata.gpu.norm_quant import ActBuf, norm_quant
    from strata.quant import fmt

    rows_out = []
    same: dict[int, tuple[float, float]] = {}  # bytes -> the same-size copy's (us, GB/s)
    pdl = K if K.pdl_available else None
    for qt in GEMV_QUANTS:
        for shape, (rows, cols) in SHAPES.items():
            if shape == "lm_head" and qt not in LM_HEAD_QUANTS:
                continue
            nbytes = fmt(qt).row_bytes(cols) * rows
            ncp = _copies(nbytes)
            ws, big = _weights(cp, qt, rows, cols, ncp, rng)
            act = ActBuf(cp, cols, 1, ws[0].vec_dot)
            x = cp.asarray(rng.standard_normal((1, cols)).astype(np.float32))
            norm_quant(K, x, 1, act=act)
            out = cp.empty((1, rows), np.float32)
            cp.cuda.Device().synchronize()  # weights and activation in place before the timer's
            # (non-blocking) stream reads them
            moved = nbytes + cols + 4 * rows
            if moved not in same:
                same[moved] = _copy_same_size(cp, timer, moved)
            same_us, same_gbps = same[moved]
            calls = [lambda w=w, a=act, y=out: gemv(K, w, a, y, 1) for w in ws]
            us, how = timer.graph_us(calls, pdl=pdl)
            gbps = moved / (us * 1e-6) / 1e9
            rows_out.append(
                dict(
                    kernel="gemv",
                    qtype=qt.name,
                    shape=shape,
                    rows=rows,
                    cols=cols,
                    bytes=moved,
                    us=round(us, 2),
                    gbps=round(gbps, 1),
                    pct_copy=round(100 * gbps / copy_gbps, 1),
                    copy_same_size_us=round(same_us, 2),
                    copy_same_size_gbps=round(same_gbps, 1),
                    pct_copy_same_size=round(100 * gbps / same_gbps, 1),
                    timing=how,
                )  # fmt: skip
            )
            del ws, big
    return rows_out


def bench_launch_floor(cp, K, timer) -> list[dict]:
    """The time a launch costs with nothing to do: chains of `silu_mul` with n = 0 (every thread
    returns at once) replayed from a graph, one block and a decode GEMV's grid (attn_q's 4096
    rows: 1280 blocks of 128 threads, or the same threads in 320 blocks of 512), plain and with
    PDL. No kernel in a chain finishes faster than this, whatever its bytes."""
    fn = K.fn("elementwise.cu", "silu_mul")
    z = cp.zeros(1, np.float32)
    rows = []
    for blocks, threads in ((1, 128), (1280, 128), (320, 512)):
        for pdl in (None, K) if K.pdl_available else (None,):
            us, how = timer.graph_us(
                [lambda b=blocks, n=threads: fn((b,), (n,), (z, z, z, np.int32(0)))] * 64,
                pdl=pdl,
            )
            rows.append(dict(kernel="launch_floor", blocks=blocks, threads=threads,
                             us=round(us, 3), timing=how))  # fmt: skip
    return rows


def bench_attention(cp, K, timer, rng, copy_gbps: float) -> list[dict]:
    """Decode attention (`attention_decode`, the position read on the device) at 4K and 32K
    keys, f16 and int8 caches."""
    from strata.gpu.attention import AttnWorkspace, attention_decode

    out_rows = []
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
        ws = AttnWorkspace(cp, K, H, G, ctx, DH, 1)
        o = cp.empty((1, H * DH), np.float32)
        scale = float(np.float32(1 / np.sqrt(DH)))
        pos = cp.asarray(np.array([ctx - 1], np.int32))
        cp.cuda.Device().synchronize()  # uploads done before the timer's (non-blocking) stream

        def call_dec(i, ws=ws, q=q, kc=kc, vc=vc, pos=pos, o=o, scale=scale):
            attention_decode(K, ws, q, kc[i], vc[i], pos, (H, G, DH, DH), scale, o)

        us, how = timer.graph_us([lambda i=i: call_dec(i) for i in range(layers)])
        scores = 2 * 4 * H * ctx  # written by the scores kernel, read by the pv kernel
        gbps = kv_bytes / (us * 1e-6) / 1e9
        out_rows.append(
            dict(
                kernel="attention_decode",
                variant="f16",
                context=ctx,
                bytes_kv=kv_bytes,
                bytes_scores=scores,
                us=round(us, 2),
                gbps_kv=round(gbps, 1),
                gbps_all=round((kv_bytes + scores) / (us * 1e-6) / 1e9, 1),
                pct_copy=round(100 * gbps / copy_gbps, 1),
                timing=how,
            )  # fmt: skip
        )
        del kc, vc
        # the int8 cache (--kv-type int8): quants + a float32 scale per row, half the bytes
        kv8_bytes = 2 * G * ctx * (DH + 4)
        k8 = cp.asarray(rng.integers(-127, 128, (layers, G, ctx, DH), dtype=np.int8))
        v8 = cp.asarray(rng.integers(-127, 128, (layers, G, ctx, DH), dtype=np.int8))
        kd = cp.asarray(rng.uniform(0.005, 0.03, (layers, G, ctx)).astype(np.float32))
        vd = cp.asarray(rng.uniform(0.005, 0.03, (layers, G, ctx)).astype(np.float32))
        cp.cuda.Device().synchronize()

        def call_dec8(i, ws=ws, q=q, k8=k8, v8=v8, kd=kd, vd=vd, pos=pos, o=o, scale=scale):
            attention_decode(K, ws, q, k8[i], v8[i], pos, (H, G, DH, DH), scale, o, kd[i], vd[i])

        us, how = timer.graph_us([lambda i=i: call_dec8(i) for i in range(layers)])
        gbps = kv8_bytes / (us * 1e-6) / 1e9
        out_rows.append(
            dict(
                kernel="attention_decode",
                variant="int8",
                context=ctx,
                bytes_kv=kv8_bytes,
                bytes_scores=2 * 4 * H * ctx,
                us=round(us, 2),
                gbps_kv=round(gbps, 1),
                gbps_all=round((kv8_bytes + 2 * 4 * H * ctx) / (us * 1e-6) / 1e9, 1),
                pct_copy=round(100 * gbps / copy_gbps, 1),
                timing=how,
            )
        )
        del k8, v8, kd, vd, ws
    return out_rows


class _Layer:
    """A Qwen3-30B-A3B-shaped layer on the device with random weights (no model file)."""

    def __init__(self, cp, K, rng, expert_qt, dense_qt, ctx: int):
        from strata.cpu.tier import rope_inv_freq
        from strata.gpu.attention import AttnWorkspace
        from strata.gpu.experts import SlotStore
        from strata.gpu.gemv import DeviceWeight
        from strata.gpu.norm_quant import ActBuf
        from strata.quant import fmt, random_quantized

        self.cp, self.K, self.ctx = cp, K, ctx
        self.pos_dev = cp.asarray(np.array([ctx - 1], np.int32))
        self.eqt = (expert_qt, expert_qt, expert_qt)
        qkv_rows = (H + 2 * G) * DH
        raw_qkv = random_quantized(dense_qt, (qkv_rows, D), rng, 0.02)
        self.qkv = DeviceWeight(cp, raw_qkv, dense_qt, qkv_rows, D)
        raw_o = random_quantized(dense_qt, (D, H * DH), rng, 0.02)
        self.o = DeviceWeight(cp, raw_o, dense_qt, D, H * DH)
        self.router = DeviceWeight(cp, random_quantized(QT.F32, (E, D), rng, 0.02), QT.F32, E, D)
        norm = cp.asarray((1 + 0.1 * rng.standard_normal(D)).astype(np.float32))
        self.attn_norm = self.ffn_norm = norm
        self.qn = self.kn = cp.asarray(np.ones(DH, np.float32))
        self.inv = cp.asarray(rope_inv_freq(DH, 1e6))
        self.kc = cp.asarray(rng.standard_normal((G, ctx, DH)).astype(np.float16)).view(np.uint16)
        self.vc = cp.asarray(rng.standard_normal((G, ctx, DH)).astype(np.float16)).view(np.uint16)
        f = fmt(expert_qt)
        sizes = (f.row_bytes(D) * F, f.row_bytes(D) * F, f.row_bytes(F) * D)
        self.stores = tuple(SlotStore(cp, E, n) for n in sizes)
        for st, (rows, cols) in zip(self.stores, ((F, D), (F, D), (D, F)), strict=True):
            one = random_quantized(expert_qt, (rows, cols), rng, 1 / np.sqrt(cols)).reshape(-1)
            st.buf[...] = cp.asarray(one)[None]
        self.expert_bytes = KUSED * sum(sizes)
        self.act_qkv = ActBuf(cp, D, 1, self.qkv.vec_dot)
        self.act_o = ActBuf(cp, H * DH, 1, self.o.vec_dot)
        self.act_h = ActBuf(cp, D, 1, f.vec_dot)
        self.act_i = ActBuf(cp, F, KUSED, f.vec_dot)
        self.qkv_buf = cp.empty((1, qkv_rows), np.float32)
        self.q = cp.empty((1, H, DH), np.float32)
        self.obuf = cp.empty((1, H * DH), np.float32)
        self.h = cp.empty((1, D), np.float32)
        self.logits = cp.empty((1, E), np.float32)
        self.moe_act = cp.empty((KUSED, F), np.float32)
        self.pair_slot = cp.asarray(rng.permutation(E)[:KUSED].astype(np.int32))
        self.pair_w = cp.asarray(np.full(KUSED, 1 / KUSED, np.float32))
        self.ws = AttnWorkspace(cp, K, H, G, ctx, DH, 1)
        self.x = cp.asarray(rng.standard_normal((1, D)).astype(np.float32))
        self.x2 = cp.empty((1, D), np.float32)
        self.y = cp.empty((1, D), np.float32)
        # the uploads and zero fills above went out on the default stream; the timer launches on
        # a non-blocking one, which does not wait for them (a pair_slot read before its copy
        # lands is a slot number from nowhere)
        cp.cuda.Device().synchronize()

    def attention_part(self):
        """The decode kernels a graph step captures (position read from pos_dev)."""
        from strata.gpu.attention import attention_decode
        from strata.gpu.gemv import gemv
        from strata.gpu.norm_quant import norm_quant
        from strata.gpu.rope_kv import qk_norm_rope_kv

        K, pos = self.K, self.ctx - 1
        scale = float(np.float32(1 / np.sqrt(DH)))
        norm_quant(K, self.x, 1, self.attn_norm, 1e-6, act=self.act_qkv)
        gemv(K, self.qkv, self.act_qkv, self.qkv_buf, 1)
        qk_norm_rope_kv(K, self.qkv_buf, 1, (H, G, DH, DH), self.qn, self.kn, 1e-6, self.inv, pos,
                        self.q, self.kc, self.vc, pos_dev=self.pos_dev)  # fmt: skip
        attention_decode(K, self.ws, self.q, self.kc, self.vc, self.pos_dev, (H, G, DH, DH),
                         scale, self.obuf)  # fmt: skip
        norm_quant(K, self.obuf, 1, act=self.act_o)
        gemv(K, self.o, self.act_o, self.x2, 1, resid=self.x)
        norm_quant(K, self.x2, 1, self.ffn_norm, 1e-6, out_f=self.h, act=self.act_h)
        gemv(K, self.router, self.h, self.logits, 1)

    def moe_part(self):
        from strata.gpu.experts import moe_experts

        moe_experts(self.K, self.eqt, (D, F), self.stores, self.act_h, self.pair_slot,
                    self.pair_w, 1, KUSED, self.moe_act, self.act_i, self.y)  # fmt: skip

    def eager_step(self):
        """A decode layer launched from Python: launches, read-back, host top-k."""
        from strata.routing import route_topk

        self.attention_part()
        logits = self.cp.asnumpy(self.logits)
        ids, w, _ = route_topk(logits, KUSED, True)
        self.pair_slot.set(ids.reshape(-1).astype(np.int32))
        self.pair_w.set(w.reshape(-1))
        self.moe_part()


def bench_layer(cp, K, timer, rng, copy_gbps: float, expert_qt) -> dict:
    lay = _Layer(cp, K, rng, expert_qt, QT.Q8_0, 4096)
    pk = K if K.pdl_available else None
    moe_us, how = timer.graph_us([lay.moe_part] * 8, pdl=pk)
    dev_us, _ = timer.graph_us([lambda: (lay.attention_part(), lay.moe_part())] * 4, pdl=pk)
    for _ in range(5):
        lay.eager_step()
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(30):
        t0 = time.perf_counter()
        lay.eager_step()
        cp.cuda.Device().synchronize()
        times.append((time.perf_counter() - t0) * 1e6)
    eager_us = float(np.median(times))
    moe_gbps = lay.expert_bytes / (moe_us * 1e-6) / 1e9
    return dict(
        kernel="layer", expert_qtype=expert_qt.name,
        dense_qtype="Q8_0", context=4096,
        moe_us=round(moe_us, 2), moe_gbps=round(moe_gbps, 1),
        moe_pct_copy=round(100 * moe_gbps / copy_gbps, 1), device_us=round(dev_us, 2),
        eager_us=round(eager_us, 1),
        tokps_48_layers_device=round(1e6 / (48 * dev_us), 1),
        tokps_48_layers_eager=round(1e6 / (48 * eager_us), 1), timing=how,
    )  # fmt: skip


def run_gpu_kernels_arm(json_path: str | None = None, commit_id: str | None = None) -> dict:
    from strata.bench.common import stamp
    from strata.gpu.device import primary_device
    from strata.gpu.rawmod import Kernels

    info = primary_device()
    if info is None:
        raise ImportError("gpu-kernels needs CuPy and a GPU")
    import cupy as cp

    K = Kernels(cp, info.warp_size, info.sm_count, arch=info.arch)
    timer = _Timer(cp)
    rng = np.random.default_rng(0)
    copies = _copy_gbps(cp, timer)
    copy = max(copies.values())
    doc = {
        "arm": "gpu-kernels",
        "stamp": stamp(commit_id),
        "command": "python -m strata.bench " + " ".join(sys.argv[1:]),
        "device": info.describe(),
        "copy_gbps": round(copy, 1),
        "copy_gbps_by_method": {k: round(v, 1) for k, v in copies.items()},
        "launch_floor": bench_launch_floor(cp, K, timer),
        "gemv": bench_gemv(cp, K, timer, rng, copy),
        "attention": bench_attention(cp, K, timer, rng, copy),
        "layer": [bench_layer(cp, K, timer, rng, copy, q) for q in (QT.IQ3_XXS, QT.Q4_K)],
    }
    print(table(doc))
    if json_path:
        Path(json_path).write_text(json.dumps(doc, indent=1))
    return doc


def table(doc: dict) -> str:
    by = ", ".join(f"{k} {v:.0f}" for k, v in doc["copy_gbps_by_method"].items())
    lines = [f"{doc['device']} | device-to-device copy {doc['copy_gbps']:.0f} GB/s ({by})"]
    for r in doc.get("launch_floor", []):
        lines.append(
            f"launch floor: {r['blocks']:5} blocks x {r['threads']} threads, nothing to do: "
            f"{r['us']:.2f} us per launch ({r['timing']})"
        )
    lines.append(
        f"{'gemv':8} {'shape':12} {'us':>8} {'GB/s':>8} {'% copy':>7}  "
        f"{'same-size copy':>14} {'% of it':>7}  timing"
    )
    for r in doc["gemv"]:
        same = (f"{r['copy_same_size_us']:6.2f} us {r['pct_copy_same_size']:6.1f}%"
                if "copy_same_size_us" in r else " " * 17)  # fmt: skip
        lines.append(
            f"{r['qtype']:8} {r['shape']:12} {r['us']:8.2f} "
            f"{r['gbps']:8.1f} {r['pct_copy']:6.1f}%  {same}  {r.get('timing', '')}"
        )
    for r in doc["attention"]:
        lines.append(
            f"attention {r['variant']:4} decode ctx {r['context']:6}: {r['us']:8.2f} us, "
            f"KV {r['gbps_kv']:.0f} GB/s ({r['pct_copy']:.1f}% of copy), "
            f"KV+scores {r['gbps_all']:.0f} GB/s"
        )
    for r in doc["layer"]:
        lines.append(
            f"layer ({r['expert_qtype']} experts, ctx 4K): "
            f"device {r['device_us']:.1f} us, "
            f"experts {r['moe_us']:.1f} us = {r['moe_gbps']:.0f} GB/s ({r['moe_pct_copy']:.1f}%), "
            f"eager {r['eager_us']:.1f} us -> 48 layers: {r['tokps_48_layers_device']:.0f} tok/s "
            f"device-bound, {r['tokps_48_layers_eager']:.0f} tok/s eager"
        )
    return "\n".join(lines)
