"""Train the embedded default model: a small qwen3moe on the Python standard library's source.

Steps, each reproducible from its inputs (training: from the seed, up to GPU atomics):

  corpus  (any machine)        the stdlib's *.py files in sorted order, a held-out split by path
                               hash, a byte-level BPE trained on the train split, both splits
                               tokenized to uint16 arrays                    -> build/tiny_moe/
  train   (GPU machine, torch) the model, AdamW, bf16 autocast; writes the weights as GGUF-named
                               packs (Q8_0 blocks for matrices, f32 for norms and the router)
  export  (any machine)        packs + tokenizer -> Q8_0 GGUF; an importance matrix from train
                               text; llama.cpp's quantizer (llama-cpp-python) -> Q4_K_M and the
                               shipped IQ3_XXS mix (--ship copies it to strata/data/default.gguf)
  eval    (any machine)        perplexity of a GGUF on held-out windows, Strata and llama.cpp

    python scripts/train_tiny_moe.py corpus
    python scripts/train_tiny_moe.py train --out build/tiny_moe/packs       # needs torch (+CUDA)
    python scripts/train_tiny_moe.py export --packs build/tiny_moe/packs --ship
    python scripts/train_tiny_moe.py eval build/tiny_moe/tiny-moe-IQ3_XXS-mix.gguf

strata/data/MODEL_CARD.md has the shipped model's numbers.

Shape letters as in strata/model/args.py (T, D, V, L, H, G, Dh, E, K, F).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BUILD = Path(__file__).resolve().parent.parent / "build" / "tiny_moe"
DATA = Path(__file__).resolve().parent.parent / "strata" / "data"
EXCLUDED_TOP = ("site-packages", "encodings")  # installed packages; codec tables (not code)
VAL_PER_MILLE = 20  # ~2% of files, chosen by a hash of their path


@dataclass
class Config:
    """Hyper-parameters of model and training; `Config()` is the shipped model."""

    seed: int = 1234
    n_vocab: int = 8192  # V, incl. the 5 special tokens
    n_embd: int = 256  # D
    n_layer: int = 6  # L
    n_head: int = 8  # H
    n_head_kv: int = 2  # G
    head_dim: int = 64  # Dh
    n_expert: int = 32  # E
    n_expert_used: int = 4  # K
    expert_ff: int = 256  # F
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6
    n_ctx_train: int = 1024  # training window
    n_ctx_meta: int = 4096  # context_length written to the GGUF (the engine's default n_ctx)
    aux_coef: float = 0.01  # switch-style load-balancing loss, over the whole batch
    dropout: float = 0.1  # on the attention and MoE outputs (training only)
    space_split: float = 0.03  # share of " word" tokens trained as " " + "word"
    batch: int = 32  # windows per step
    steps: int = 3000  # ~13 epochs of the train split (held-out loss decides the end)
    warmup: int = 100
    lr: float = 2e-3
    min_lr_frac: float = 0.1
    weight_decay: float = 0.1
    eval_every: int = 100
    max_seconds: float = 360.0  # a guard: steps are cut (schedule recomputed) to fit this

    def model_dict(self) -> dict:
        """The architecture's hyper-parameters (ModelArgs field names)."""
        return {k: getattr(self, k) for k in MODEL_KEYS}


MODEL_KEYS = (
    "n_vocab n_embd n_layer n_head n_head_kv head_dim n_expert n_expert_used expert_ff "
    "rope_theta rms_eps n_ctx_train"
).split()


# ---- corpus --------------------------------------------------------------------------------


def stdlib_files(stdlib: Path) -> list[tuple[str, str]]:
    """(relative path, text) of every UTF-8 *.py under `stdlib`, sorted by path."""
    out = []
    for p in sorted(stdlib.rglob("*.py"), key=lambda p: p.relative_to(stdlib).as_posix()):
        rel = p.relative_to(stdlib).as_posix()
        if rel.split("/")[0] in EXCLUDED_TOP or not p.is_file():
            continue
        try:
            text = p.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            continue  # a few test files are deliberately in other encodings
        if "\x00" in text or not text.strip():
            continue
        out.append((rel, text))
    return out


def is_val(rel: str) -> bool:
    h = int.from_bytes(hashlib.sha1(rel.encode()).digest()[:4], "little")
    return h % 1000 < VAL_PER_MILLE


def train_tokenizer(texts: list[str], n_vocab: int):
    """Byte-level BPE (Qwen2 split) learned on `texts`; the special tokens take the last ids."""
    from gguf import TokenType
    from tokenizers import pre_tokenizers as pt
    from tokenizers import trainers

    from strata.model.vocab_synth import SPECIAL_TOKENS, SynthVocab, _trainer_tokenizer

    n_learned = n_vocab - len(SPECIAL_TOKENS)
    tok = _trainer_tokenizer()  # Qwen2 split regex + byte-level, as the synthetic vocabulary
    trainer = trainers.BpeTrainer(
        vocab_size=n_learned,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pt.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(texts, trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    vocab: dict[str, int] = model["vocab"]
    tokens = sorted(vocab, key=vocab.__getitem__)
    if [vocab[t] for t in tokens] != list(range(n_learned)):
        raise RuntimeError(f"BPE trainer gave {len(tokens)} tokens, wanted {n_learned}")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    types = [int(TokenType.NORMAL)] * len(tokens)
    special = {}
    for text, ttype in SPECIAL_TOKENS:
        special[text] = len(tokens)
        tokens.append(text)
        types.append(int(ttype))
    eot = special["<|endoftext|>"]
    return SynthVocab(tokens, types, merges, bos_id=eot, eos_id=eot, pad_id=eot, special=special)


def strata_tokenizer(vocab):
    from strata.model.tokenizer import Tokenizer

    return Tokenizer(
        vocab.tokens, vocab.token_types, vocab.merges, pre="qwen2", bos_id=vocab.bos_id,
        eos_id=vocab.eos_id, pad_id=vocab.pad_id,
    )  # fmt: skip


def load_vocab(build: Path):
    from strata.model.vocab_synth import SynthVocab

    return SynthVocab(**json.loads((build / "tokenizer.json").read_text()))


def cmd_corpus(ns) -> None:
    cfg = Config()
    stdlib = Path(ns.stdlib or sysconfig.get_paths()["stdlib"])
    build = Path(ns.build)
    build.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    files = stdlib_files(stdlib)
    train = [(r, t) for r, t in files if not is_val(r)]
    val = [(r, t) for r, t in files if is_val(r)]
    print(f"{len(files)} files from {stdlib} ({sum(len(t) for _, t in files) / 1e6:.1f} M chars)")
    print(f"train {len(train)} files, val {len(val)} files")
    vocab = train_tokenizer([t for _, t in train], cfg.n_vocab)
    (build / "tokenizer.json").write_text(json.dumps(dataclasses.asdict(vocab)))
    tok = strata_tokenizer(vocab)
    eot = vocab.special["<|endoftext|>"]
    stats = {}
    for split, docs in (("train", train), ("val", val)):
        ids = tok.encode_batch([t for _, t in docs], parse_special=False)
        flat = np.concatenate([np.array([*d, eot], np.uint16) for d in ids])
        np.save(build / f"{split}.npy", flat)
        chars = sum(len(t) for _, t in docs)
        stats[split] = {"files": len(docs), "chars": chars, "tokens": int(flat.size)}
        print(f"{split}: {flat.size:,} tokens, {chars / flat.size:.2f} chars/token")
    sample_rel, sample = heldout_sample(val)
    (build / "heldout.txt").write_text(sample)
    meta = {
        "python": sys.version.split()[0],
        "stdlib": str(stdlib),
        "excluded_top": list(EXCLUDED_TOP),
        "val_per_mille": VAL_PER_MILLE,
        "val_files": [r for r, _ in val],
        "heldout_sample": sample_rel,
        "sha256": {s: _sha(build / f"{s}.npy") for s in ("train", "val")},
        **stats,
    }
    (build / "corpus.json").write_text(json.dumps(meta, indent=1))
    print(f"corpus written to {build} in {time.time() - t0:.0f} s")


def heldout_sample(val: list[tuple[str, str]], chars: int = 2400) -> tuple[str, str]:
    """The first ~`chars` characters (whole lines) of the first non-test held-out module."""
    rel, text = next(
        (r, t) for r, t in val if "test" not in r and len(t) > 2 * chars and r.count("/") <= 1
    )
    cut = text.rfind("\n", 0, chars) + 1
    return rel, text[:cut]


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


# ---- train (torch) -------------------------------------------------------------------------


def cmd_train(ns) -> None:
    import tiny_moe_torch  # scripts/ is on sys.path when this file runs as a script

    overrides = {k: v for k, v in vars(ns).items() if k in Config.__annotations__ and v is not None}
    cfg = Config(**overrides)
    tiny_moe_torch.train(cfg, Path(ns.build), Path(ns.out), ns.device, ns.pack_dtype)


# ---- export --------------------------------------------------------------------------------


def read_packs(packs: Path) -> tuple[dict[str, tuple[int, tuple[int, ...], np.ndarray]], dict]:
    """{gguf tensor name: (ggml type, numpy shape, data)} and the training log from `packs`."""
    tensors = {}
    for f in sorted(packs.glob("weights-*.npz")):
        with np.load(f) as z:
            for key in z.files:
                if key.endswith(".type") or key.endswith(".shape"):
                    continue
                tensors[key] = (int(z[key + ".type"]), tuple(z[key + ".shape"]), z[key])
    log = json.loads((packs / "train_log.json").read_text())
    return tensors, log


def write_gguf(out: Path, cfg: dict, vocab, tensors: dict, log: dict) -> Path:
    """A qwen3moe GGUF of the packed tensors as they are (no re-quantization)."""
    import gguf
    from gguf.constants import GGMLQuantizationType as QT
    from gguf.constants import Keys

    from strata.model import qwen3moe
    from strata.model.args import ModelArgs
    from strata.model.synth import file_type
    from strata.model.vocab_synth import add_tokenizer_metadata

    args = ModelArgs(arch="qwen3moe", v_head_dim=cfg["head_dim"], **cfg)
    order = list(qwen3moe.global_tensors(args))
    for i in range(args.n_layer):
        order += list(qwen3moe.layer_tensors(args, i))
    qtypes = {QT(t) for t, _, _ in tensors.values()} - {QT.F32} or {QT.F32}
    w = gguf.GGUFWriter(out, "qwen3moe")
    w.add_name("strata-tiny-moe")
    w.add_description(
        "A small qwen3moe trained by Strata on the Python standard library's source "
        "(scripts/train_tiny_moe.py; see strata/data/MODEL_CARD.md)"
    )
    w.add_license("MIT (weights); training text: Python standard library, PSF License")
    w.add_file_type(int(file_type(qtypes.pop() if len(qtypes) == 1 else QT.Q8_0)))
    w.add_vocab_size(args.n_vocab)
    w.add_context_length(log["config"]["n_ctx_meta"])
    w.add_embedding_length(args.n_embd)
    w.add_block_count(args.n_layer)
    w.add_feed_forward_length(args.expert_ff)
    w.add_expert_feed_forward_length(args.expert_ff)
    w.add_head_count(args.n_head)
    w.add_head_count_kv(args.n_head_kv)
    w.add_key_length(args.head_dim)
    w.add_value_length(args.head_dim)
    w.add_rope_freq_base(args.rope_theta)
    w.add_layer_norm_rms_eps(args.rms_eps)
    w.add_expert_count(args.n_expert)
    w.add_expert_used_count(args.n_expert_used)
    w.add_expert_weights_norm(True)
    w.add_uint32("strata.train.seed", log["config"]["seed"])
    w.add_uint32("strata.train.ctx", args.n_ctx_train)
    w.add_float32("strata.train.val_loss", log["best_val_loss"])
    add_tokenizer_metadata(w, vocab)
    # Every training document follows an <|endoftext|>: prompts start the same way (BOS), as
    # GPT-2 did. Without it a prompt's first token has no "start" to attend to and "def "
    # continues badly. (add_tokenizer_metadata writes False: replaced, not duplicated.)
    del w.kv_data[0][Keys.Tokenizer.ADD_BOS]
    w.add_add_bos_token(True)
    for tname in order:
        if tname not in tensors:
            raise KeyError(f"packs lack {tname}")
        qt, shape, data = tensors[tname]
        if QT(qt) != QT.F32 and data.shape[:-1] != tuple(shape[:-1]):
            raise ValueError(f"{tname}: packed blocks {data.shape} do not fit shape {shape}")
        w.add_tensor(tname, data, raw_dtype=QT(qt))  # quantized: shape from the byte rows
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


# The shipped mix: experts 3-bit, the small dense part kept precise (as real MoE quants do).
# Every byte comes from llama.cpp's quantizer: its IQ3_XXS ftype with tensor-type overrides (what
# llama-quantize --tensor-type does) and an importance matrix from calibration text (imatrix()).
SHIP_FTYPE = "IQ3_XXS"
SHIP_OVERRIDES = {r"attn_(q|k|v|output)\.weight": "Q6_K"}
SHIP_EMBD, SHIP_OUTPUT = "Q4_K", "Q6_K"


def imatrix(q8: Path, build: Path, n_windows: int = 16, n_ctx: int = 512) -> dict:
    """llama.cpp-style importance matrix of every quantizable matrix: the mean square of each
    input column over calibration tokens (evenly spaced windows of the *train* split), per
    expert for expert tensors ([E * in] values). Computed with Strata's float64 reference."""
    from gguf.constants import MODEL_TENSOR as MT

    from strata.model.arch.common import name
    from strata.model.loader import load_model
    from strata.model.reference import Reference

    class Recorder(Reference):
        def __init__(self, model):
            super().__init__(model, "exact")
            self.sums, self.counts = {}, {}

        def _add(self, tname: str, x: np.ndarray, rows: int = 1, row: int = 0) -> None:
            if tname not in self.sums:
                self.sums[tname] = np.zeros((rows, x.shape[-1]))
                self.counts[tname] = np.zeros(rows)
            self.sums[tname][row] += (x * x).sum(0)
            self.counts[tname][row] += x.shape[0]

        def matmul(self, x, t, layer=None):
            tname = t if isinstance(t, str) else name(t, layer)
            if "ffn_gate_inp" not in tname:  # the router stays f32
                self._add(tname, x)
            return super().matmul(x, t, layer)

        def moe(self, i, x, record=None):  # grouped by expert: same sums, far fewer calls
            h = self.rms_norm(x, self.w(MT.FFN_NORM, i))  # [T, D]
            ids, wts = self.route(i, h)  # [T, K]
            out = np.zeros_like(x)
            for e in np.unique(ids):
                rows, ks = np.nonzero(ids == e)
                out[rows] += wts[rows, ks, None] * self.expert(i, int(e), h[rows])
            return x + out

        def expert(self, i, e, h):
            n_e = self.args.n_expert
            gate = h @ self.w(MT.FFN_GATE_EXP, i)[e].T  # [n, F]
            up = h @ self.w(MT.FFN_UP_EXP, i)[e].T
            act = gate / (1.0 + np.exp(-gate)) * up
            for t in (MT.FFN_GATE_EXP, MT.FFN_UP_EXP):
                self._add(name(t, i), h, n_e, e)
            self._add(name(MT.FFN_DOWN_EXP, i), act, n_e, e)
            return act @ self.w(MT.FFN_DOWN_EXP, i)[e].T

    rec = Recorder(load_model(q8))
    train = np.load(build / "train.npy", mmap_mode="r")
    for s in np.linspace(0, train.size - n_ctx - 1, n_windows).astype(np.int64):
        rec.forward(np.asarray(train[s : s + n_ctx], np.int64))
    out = {}
    for tname, sums in rec.sums.items():
        cnt = rec.counts[tname]
        mean = sums.sum(0) / cnt.sum()  # experts never picked fall back to the layer's mean
        per = np.where(cnt[:, None] > 0, sums / np.maximum(cnt, 1)[:, None], mean[None, :])
        out[tname] = per.astype(np.float32).ravel()
    return out


def llama_quantize(
    src: Path,
    dst: Path,
    ftype: str,
    threads: int,
    imat: dict | None = None,
    overrides: dict | None = None,
    embd: str | None = None,
    output: str | None = None,
) -> Path:
    """llama.cpp's quantizer (llama-cpp-python) on `src`; `ftype` a LLAMA_FTYPE_MOSTLY_* name,
    `overrides` {regex: GGML type name}, `imat` {tensor name: float32 values}."""
    import ctypes

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread = threads
    params.allow_requantize = True  # src holds Q8_0 blocks: dequantized, then quantized
    if embd:
        params.token_embedding_type = getattr(llama_cpp, f"GGML_TYPE_{embd}")
    if output:
        params.output_tensor_type = getattr(llama_cpp, f"GGML_TYPE_{output}")
    keep = []  # what the C arrays point into lives until the call returns
    if imat:
        arr = (llama_cpp.llama_model_imatrix_data * (len(imat) + 1))()  # NULL-terminated
        for i, (tname, vals) in enumerate(sorted(imat.items())):
            v = np.ascontiguousarray(vals, np.float32)
            keep += [tname.encode(), v]
            arr[i].name = keep[-2]
            arr[i].data = v.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            arr[i].size = v.size
        params.imatrix = arr
        keep.append(arr)
    if overrides:
        ov = (llama_cpp.llama_model_tensor_override * (len(overrides) + 1))()
        for i, (pattern, qt) in enumerate(overrides.items()):
            keep.append(pattern.encode())
            ov[i].pattern = keep[-1]
            ov[i].type = getattr(llama_cpp, f"GGML_TYPE_{qt}")
        params.tt_overrides = ov
        keep.append(ov)
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({ftype}) failed with {rc}")
    return dst


def cmd_export(ns) -> None:
    from gguf.constants import GGMLQuantizationType as QT

    from strata.model.loader import load_model

    build = Path(ns.build)
    tensors, log = read_packs(Path(ns.packs))
    vocab = load_vocab(build)
    cfg = {k: log["config"][k] for k in Config().model_dict()}
    kind = "F32" if all(QT(t) == QT.F32 for t, _, _ in tensors.values()) else "Q8_0"
    q8 = write_gguf(build / f"tiny-moe-{kind}.gguf", cfg, vocab, tensors, log)
    outs = [q8]
    t0 = time.time()
    imat = imatrix(q8, build)
    print(f"importance matrix of {len(imat)} tensors [{time.time() - t0:.0f} s]")
    for ftype in ns.quants:  # llama.cpp's own recipes
        dst = build / f"tiny-moe-{ftype}.gguf"
        outs.append(llama_quantize(q8, dst, ftype, ns.threads, imat))
    mix = build / f"tiny-moe-{SHIP_FTYPE}-mix.gguf"
    outs.append(
        llama_quantize(
            q8, mix, SHIP_FTYPE, ns.threads, imat, SHIP_OVERRIDES, SHIP_EMBD, SHIP_OUTPUT
        )
    )
    for p in outs:
        m = load_model(p)  # Strata must read every tensor type llama.cpp chose
        types = sorted({QT(m.tensor(n).qtype).name for n in m.gguf.tensors})
        print(f"{p.name}: {p.stat().st_size / 2**20:.2f} MiB, types {', '.join(types)}")
    if ns.ship:
        (DATA / "default.gguf").write_bytes(mix.read_bytes())
        (DATA / "heldout.txt").write_bytes((build / "heldout.txt").read_bytes())
        print(f"shipped {mix.name} as {DATA / 'default.gguf'}")


# ---- eval ----------------------------------------------------------------------------------


def nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per-position negative log-likelihood of `targets` [T] under `logits` [T, V]."""
    z = logits.astype(np.float64)
    m = z.max(-1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(z - m).sum(-1))
    return lse - z[np.arange(len(targets)), targets]


def eval_windows(build: Path, n_windows: int, n_ctx: int) -> list[np.ndarray]:
    """`n_windows` evenly spaced windows of `n_ctx` tokens from the held-out split."""
    val = np.load(build / "val.npy").astype(np.int64)
    starts = np.linspace(0, val.size - n_ctx - 1, n_windows).astype(np.int64)
    return [val[s : s + n_ctx] for s in starts]


def cmd_eval(ns) -> None:
    import llama_cpp

    from strata.engine.engine import Engine
    from strata.model.loader import load_model

    model = load_model(ns.gguf)
    windows = eval_windows(Path(ns.build), ns.windows, ns.ctx)
    llm = llama_cpp.Llama(
        model_path=str(ns.gguf), n_ctx=ns.ctx, n_batch=ns.ctx, logits_all=True,
        n_threads=ns.threads, flash_attn=False, verbose=False,
    )  # fmt: skip
    ours, theirs = [], []
    t0 = time.time()
    for w in windows:
        engine = Engine(model, n_ctx=ns.ctx)
        ours.append(nll(engine.forward(w.tolist(), all_logits=True)[:-1], w[1:]))
        llm.reset()
        llm.eval(w.tolist())
        theirs.append(nll(np.array(llm.scores[: w.size - 1]), w[1:]))
    a, b = np.concatenate(ours).mean(), np.concatenate(theirs).mean()
    n = sum(x.size for x in ours)
    print(
        f"{Path(ns.gguf).name}: {n} held-out tokens, ppl strata {np.exp(a):.4f} "
        f"llama.cpp {np.exp(b):.4f} (diff {100 * (np.exp(a - b) - 1):+.3f}%) "
        f"[{time.time() - t0:.0f} s]"
    )


# ---- command line --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--build", default=str(BUILD), help="work folder (default build/tiny_moe)")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("corpus", help="stdlib corpus, BPE tokenizer, token arrays")
    c.add_argument("--stdlib", help="stdlib folder (default: this Python's)")
    t = sub.add_parser("train", help="train on the GPU (torch); writes packs + train_log.json")
    t.add_argument("--out", required=True, help="folder for weights-*.npz and train_log.json")
    t.add_argument("--device", default=None, help="torch device (default cuda if available)")
    t.add_argument("--pack-dtype", choices=["q8_0", "f32"], default="q8_0")
    for f in dataclasses.fields(Config):
        t.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=None)
    e = sub.add_parser("export", help="packs -> Q8_0 GGUF -> llama.cpp-quantized variants")
    e.add_argument("--packs", required=True)
    e.add_argument("--quants", nargs="*", default=["Q4_K_M"], help="llama.cpp recipes to add")
    e.add_argument("--ship", action="store_true", help="copy the mix to strata/data/default.gguf")
    e.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    v = sub.add_parser("eval", help="held-out perplexity: Strata and llama.cpp on one GGUF")
    v.add_argument("gguf")
    v.add_argument("--windows", type=int, default=8)
    v.add_argument("--ctx", type=int, default=512)
    v.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ns = p.parse_args(argv)
    {"corpus": cmd_corpus, "train": cmd_train, "export": cmd_export, "eval": cmd_eval}[ns.cmd](ns)


if __name__ == "__main__":
    main()
