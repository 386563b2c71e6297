"""Synthetic qwen3moe / qwen2moe / gpt-oss GGUF files: random but valid weights of any shape and
quant mix.

Blocks have sane scales (dequantized weights have a chosen std), activations stay finite through
every layer, and the tokenizer metadata is a real byte-level BPE vocabulary llama.cpp accepts.
`skew > 0` makes a few experts popular (a shared direction in the embeddings that the router rows
align with, by a Zipf-like ranking), the shape real routing traces have. `routing_entropy` asks
for a given normalized per-layer usage entropy instead (trained models: 0.905-0.960): the vocabulary
is split into `TOPICS` prompt distributions, each with its own direction in the embeddings and its
own popularity ranking per layer (`popularity_rows`); the routers are then solved on the written
model's own hidden states (strata/engine/synth_routing.py) and written in place
(`rewrite_routers`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf.constants import MODEL_TENSOR as MT
from gguf.constants import GGMLQuantizationType, LlamaFileType

from strata.model import arch as archs
from strata.model import synth_hybrid
from strata.model.arch.common import name
from strata.model.args import ModelArgs, swa_period_layers
from strata.model.synth_shapes import SHAPES
from strata.quant import fmt
from strata.quant.synth_blocks import random_quantized

__all__ = ["SHAPES", "SynthSpec", "make_args", "write_synthetic"]

QT = GGMLQuantizationType
ALPHA = 0.7  # with skew > 0: the share of the embeddings along the popularity direction
TOPICS = 2  # with routing_entropy: prompt distributions (vocabulary ranges) of their own routing


@dataclass
class SynthSpec:
    args: ModelArgs
    expert_quant: QT = QT.Q4_K
    dense_quant: QT = QT.Q8_0  # attention and output projections
    embd_quant: QT = QT.Q8_0
    skew: float = 0.0
    seed: int = 0
    logit_gain: float = 4.0  # output weights' std × sqrt(D): larger = more confident next tokens
    router_gain: float = 2.0
    tied_output: bool = False
    split_max_tensors: int = 0  # > 0 writes a shard set NAME-0000k-of-0000n.gguf
    # normalized per-layer expert usage entropy over random tokens (None: `skew` decides; the
    # routers are solved for it after writing: strata/engine/synth_routing.py)
    routing_entropy: float | None = None


def topic_range(n_vocab: int, topic: int) -> tuple[int, int]:
    """Token ids [lo, hi) of one prompt distribution of a `routing_entropy` model."""
    per = n_vocab // TOPICS
    return topic * per, (n_vocab if topic == TOPICS - 1 else (topic + 1) * per)


def make_args(shape: str, arch: str | None = None, **overrides) -> ModelArgs:
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r} (known: {', '.join(SHAPES)})")
    kw = dict(SHAPES[shape])
    arch = arch or kw.get("arch", "qwen3moe")
    kw.pop("arch", None)
    traits = dict(archs.get(arch).TRAITS)
    if traits.pop("shared_expert"):
        kw.setdefault("shared_ff", 2 * kw["expert_ff"])
    period = traits.pop("swa_pattern", None)
    kw.update({k: v for k, v in overrides.items() if v is not None})
    kw.setdefault("v_head_dim", kw["head_dim"])
    if period is not None:  # the architecture's default pattern (the file then omits the key)
        kw.setdefault("sliding_window", 128)  # gpt-oss's, for a shape of another architecture
        kw.setdefault("swa_layers", swa_period_layers(period, kw["n_layer"]))
    if getattr(archs.get(arch), "V_HEADS_TILED", False):
        kw["v_heads_tiled"] = True
    args = ModelArgs(arch=arch, **traits, **kw)
    if hasattr(archs.get(arch), "check_args"):  # e.g. qwen3next needs a hybrid shape
        archs.get(arch).check_args(args)
    return args


def _check_quant(tname: str, shape: tuple[int, ...], qt: QT) -> QT:
    """The quant to store `tname` in: `qt` when its blocks tile the row, else a clear error."""
    f = fmt(qt)
    if shape[-1] % f.block_elems:
        raise ValueError(
            f"{tname}: row length {shape[-1]} is not a multiple of {qt.name}'s block size "
            f"{f.block_elems}; pick another --quant or shape"
        )
    return qt


def tensor_plan(spec: SynthSpec) -> list[tuple[str, tuple[int, ...], QT, float]]:
    """(name, numpy shape, type, weight std) for every tensor, in file order."""
    a = spec.args
    mod = archs.get(a.arch)
    d = a.n_embd
    plan: list[tuple[str, tuple[int, ...], QT, float]] = []
    hybrid = synth_hybrid.plan if a.linear_attn else (lambda *_: None)
    for tname, shape in mod.global_tensors(a).items():
        if tname == name(MT.OUTPUT) and spec.tied_output:
            continue
        if tname == name(MT.TOKEN_EMBD):
            plan.append((tname, shape, spec.embd_quant, 1.0))
        elif tname == name(MT.OUTPUT):
            plan.append((tname, shape, spec.dense_quant, spec.logit_gain / np.sqrt(d)))
        else:
            plan.append((tname, shape, QT.F32, 0.0))  # norms: ~1, see _norm_weight
    for i in range(a.n_layer + a.n_nextn):
        for tname, shape in mod.layer_tensors(a, i).items():
            special = hybrid(tname, shape, spec.dense_quant)
            if special == synth_hybrid.SKIP:
                continue
            if special is not None:
                plan.append((tname, shape, *special))
                continue
            _, _, base, suffix = tname.split(".")  # blk.N.<base>.<weight|bias>
            if suffix == "bias":
                plan.append((tname, shape, QT.F32, 0.1))
            elif base == "attn_sinks":  # a logit per head, against scores of about +-1
                plan.append((tname, shape, QT.F32, 1.0))
            elif len(shape) == 1 and "shexp" not in base:
                plan.append((tname, shape, QT.F32, 0.0))  # a norm weight
            elif base == "ffn_gate_inp_shexp":
                plan.append((tname, shape, QT.F32, 1.0 / np.sqrt(d)))
            elif base.startswith("ffn_gate_inp"):
                plan.append((tname, shape, QT.F32, spec.router_gain / np.sqrt(d)))
            elif base.endswith("_exps"):
                plan.append((tname, shape, spec.expert_quant, 1.0 / np.sqrt(shape[-1])))
            else:
                plan.append((tname, shape, spec.dense_quant, 1.0 / np.sqrt(shape[-1])))
    return [(n, s, _check_quant(n, s, q), std) for n, s, q, std in plan]


class _Generator:
    """Makes each tensor's bytes; one RNG stream per tensor so the file does not depend on order."""

    def __init__(self, spec: SynthSpec):
        self.spec = spec
        a = spec.args
        rng = np.random.default_rng([spec.seed, 0xFEED])
        u = rng.standard_normal(a.n_embd)
        self.u = u / np.linalg.norm(u)  # the shared "popularity" direction
        # Zipf-like popularity per expert, per layer (rank r -> 1/(r+1), centred)
        self.pop = []
        for _ in range(a.n_layer):
            ranks = rng.permutation(a.n_expert)
            z = 1.0 / (ranks + 1.0)
            self.pop.append((z - z.mean()) / (z.std() + 1e-12))
        if spec.routing_entropy is not None:
            self._topics(np.random.default_rng([spec.seed, 0x7091C]))

    def _topics(self, rng) -> None:
        """Orthonormal topic directions U [TOPICS, D] and popularity scores per layer and topic
        pops [L, TOPICS, E] (a Zipf-like ranking each, centred and scaled to std 1)."""
        a = self.spec.args
        q, _ = np.linalg.qr(rng.standard_normal((a.n_embd, TOPICS)))
        self.topic_u = q.T  # [TOPICS, D]
        z = 1.0 / (np.argsort(rng.random((a.n_layer, TOPICS, a.n_expert)), -1) + 1.0)
        self.pops = (z - z.mean(-1, keepdims=True)) / z.std(-1, keepdims=True)

    def popularity_rows(self, layer: int) -> np.ndarray:
        """[E, D]: what strength 1 adds to layer's router rows; a hidden row of topic t carries
        about ALPHA*sqrt(D)/sqrt(1+ALPHA^2) along its direction at the first layer, so there it
        adds ~pops[layer, t] nats to the logits."""
        a = self.spec.args
        m = ALPHA * np.sqrt(a.n_embd) / np.sqrt(1 + ALPHA**2)
        return (self.pops[layer].T @ self.topic_u) / m  # [E, TOPICS] @ [TOPICS, D]

    def tensor(self, idx: int, tname: str, shape, qt: QT, std: float) -> np.ndarray:
        spec, a = self.spec, self.spec.args
        rng = np.random.default_rng([spec.seed, idx])
        if a.linear_attn and (v := synth_hybrid.values(tname, shape, rng)) is not None:
            return v
        if qt in (QT.F32,):
            if std == 0.0:  # norm weight: around 1
                return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
            w = rng.standard_normal(shape) * std
            if tname.endswith("ffn_gate_inp.weight") and spec.skew > 0:
                layer = int(tname.split(".")[1])
                # align router rows with the popularity direction (the embeddings carry it)
                # normed hidden rows carry ~ALPHA*sqrt(D)/sqrt(1+ALPHA^2) along u: scale so the
                # popularity offset is `skew` nats per unit of popularity score
                m = ALPHA * np.sqrt(a.n_embd) / np.sqrt(1 + ALPHA**2)
                w = w + (spec.skew / m) * self.pop[layer][:, None] * self.u[None, :]
            return w.astype(np.float32)
        if tname == name(MT.TOKEN_EMBD) and spec.routing_entropy is not None:
            w = rng.standard_normal(shape)
            for t in range(TOPICS):
                lo, hi = topic_range(a.n_vocab, t)
                w[lo:hi] += ALPHA * self.topic_u[t][None, :] * np.sqrt(a.n_embd)
            return _encode(w.astype(np.float32), qt)
        if tname == name(MT.TOKEN_EMBD) and spec.skew > 0:
            w = rng.standard_normal(shape) + ALPHA * self.u[None, :] * np.sqrt(a.n_embd)
            return _encode(w.astype(np.float32), qt)
        return random_quantized(qt, tuple(shape), rng, std)


def _encode(w: np.ndarray, qt: QT) -> np.ndarray:
    if qt == QT.F32:
        return w
    if qt == QT.F16:
        return w.astype(np.float16)
    return gguf.quants.quantize(w, qt)


def file_type(qt: QT) -> LlamaFileType:
    """general.file_type in llama.cpp's numbering for a model whose experts are `qt`."""
    special = {
        QT.F32: "ALL_F32",
        QT.Q4_K: "MOSTLY_Q4_K_M",
        QT.Q5_K: "MOSTLY_Q5_K_M",
        QT.MXFP4: "MOSTLY_MXFP4_MOE",
    }
    return LlamaFileType[special.get(qt, f"MOSTLY_{qt.name}")]


def _add_newer_keys(w: gguf.GGUFWriter, a: ModelArgs) -> None:
    """The sliding window and RoPE scaling keys (gpt-oss); nothing for the other architectures.
    The sliding layers are written only where they differ from the architecture's default."""
    if a.sliding_window:
        w.add_sliding_window(a.sliding_window)
        period = archs.get(a.arch).TRAITS.get("swa_pattern")
        if period is None or a.swa_layers != swa_period_layers(period, a.n_layer):
            w.add_array(
                gguf.Keys.Attention.SLIDING_WINDOW_PATTERN.format(arch=a.arch), list(a.swa_layers)
            )
    if a.rope_scaling != "none":
        w.add_rope_scaling_type(gguf.RopeScalingType(a.rope_scaling))
        w.add_rope_scaling_factor(a.rope_factor)
        if a.rope_orig_ctx:
            w.add_rope_scaling_orig_ctx_len(a.rope_orig_ctx)
        if a.rope_attn_factor != 1.0:
            w.add_rope_scaling_attn_factors(a.rope_attn_factor)


def write_synthetic(out: str | os.PathLike, spec: SynthSpec, progress: bool = True) -> list[Path]:
    """Write the model; returns the files written. Written to temporaries, renamed at the end."""
    from strata.model.vocab_synth import add_tokenizer_metadata, synth_vocab
    from strata.progress import bar

    a = spec.args
    out = Path(out)
    if out.suffix != ".gguf":
        raise ValueError(f"{out}: output name must end in .gguf")
    plan = tensor_plan(spec)
    tmp = out.with_name(out.stem + ".partial.gguf")
    w = gguf.GGUFWriter(tmp, a.arch, split_max_tensors=spec.split_max_tensors)
    w.add_name(f"strata-synth-{a.arch}")
    w.add_file_type(int(file_type(spec.expert_quant)))
    w.add_vocab_size(a.n_vocab)
    w.add_context_length(a.n_ctx_train)
    w.add_embedding_length(a.n_embd)
    w.add_block_count(a.n_layer + a.n_nextn)
    w.add_feed_forward_length(a.expert_ff)
    w.add_expert_feed_forward_length(a.expert_ff)
    if a.shared_ff:
        w.add_expert_shared_feed_forward_length(a.shared_ff)
    w.add_head_count(a.n_head)
    w.add_head_count_kv(a.n_head_kv)
    w.add_key_length(a.head_dim)
    w.add_value_length(a.v_head_dim)
    w.add_rope_freq_base(a.rope_theta)
    _add_newer_keys(w, a)
    w.add_layer_norm_rms_eps(a.rms_eps)
    w.add_expert_count(a.n_expert)
    w.add_expert_used_count(a.n_expert_used)
    if a.linear_attn:
        synth_hybrid.add_metadata(w, a)
    w.add_uint32("strata.synth.seed", spec.seed)
    w.add_float32("strata.synth.skew", spec.skew)
    if spec.routing_entropy is not None:
        w.add_float32("strata.synth.routing_entropy", spec.routing_entropy)
    add_tokenizer_metadata(w, synth_vocab(a.n_vocab))
    for tname, shape, qt, _ in plan:
        f = fmt(qt)
        nbytes = f.tensor_bytes(shape)
        w.add_tensor_info(tname, shape, np.dtype(np.float32), nbytes, raw_dtype=qt)
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        total = sum(fmt(q).tensor_bytes(s) for _, s, q, _ in plan)
        with bar(total, f"writing {out.name}", enabled=progress, unit="B") as pb:
            for data in _tensors(spec, plan, total):
                w.write_tensor_data(np.ascontiguousarray(data))
                pb.update(data.nbytes)
        w.close()
    except BaseException:
        w.close()
        for p in _written(tmp, spec):
            p.unlink(missing_ok=True)
        raise
    final = []
    for p in _written(tmp, spec):
        dest = p.with_name(p.name.replace(tmp.stem, out.stem))
        os.replace(p, dest)
        final.append(dest)
    return final


PARALLEL_BYTES = 256 << 20  # models at least this big are generated on several processes
_gen: _Generator | None = None  # a worker process's generator


def _init_worker(spec: SynthSpec) -> None:
    global _gen
    _gen = _Generator(spec)


def _make(job: tuple) -> np.ndarray:
    return _gen.tensor(*job)


def _tensors(spec: SynthSpec, plan: list, total: int):
    """The tensors' bytes in plan order; big models are generated by a process pool (each
    tensor has its own RNG stream, so the bytes are the same either way), at most two tensors
    per worker in flight so memory stays bounded."""
    jobs = [(idx, tname, tuple(shape), qt, std) for idx, (tname, shape, qt, std) in enumerate(plan)]
    workers = min(8, os.cpu_count() or 1)
    if total < PARALLEL_BYTES or workers < 2:
        gen = _Generator(spec)
        for job in jobs:
            yield gen.tensor(*job)
        return
    import multiprocessing as mp
    from collections import deque
    from concurrent.futures import ProcessPoolExecutor

    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
    with ProcessPoolExecutor(
        workers, mp_context=ctx, initializer=_init_worker, initargs=(spec,)
    ) as ex:
        todo, flight = iter(jobs), deque()
        for job in todo:
            flight.append(ex.submit(_make, job))
            if len(flight) >= 2 * workers:
                break
        while flight:
            data = flight.popleft().result()
            job = next(todo, None)
            if job is not None:
                flight.append(ex.submit(_make, job))
            yield data


def topics(spec: SynthSpec) -> np.ndarray:
    """[TOPICS, D]: the orthonormal topic directions of a `routing_entropy` model."""
    return _Generator(spec).topic_u


def popularity_rows(spec: SynthSpec, layer: int) -> np.ndarray:
    """[E, D]: what router strength 1 adds to `layer`'s router rows (`routing_entropy` models)."""
    return _Generator(spec).popularity_rows(layer)


def rewrite_routers(paths: list[Path], routers: dict[str, np.ndarray]) -> None:
    """Write F32 router tensors (name -> [E, D]) into the model's files in place; every other
    byte stays."""
    for p in paths:
        r = gguf.GGUFReader(p, "r+")
        for t in r.tensors:
            if t.name in routers:
                t.data[...] = routers[t.name].astype(np.float32).reshape(t.data.shape)
        r.data.flush()


def _written(tmp: Path, spec: SynthSpec) -> list[Path]:
    if not spec.split_max_tensors:
        return [tmp] if tmp.exists() else []
    return sorted(tmp.parent.glob(f"{tmp.stem}-*-of-*.gguf"))
