"""Test utility: copy a GGUF into a new file with surgical changes, to make bad models on purpose.

Metadata fields keep their GGUF value types (read with `GGUFReader`, written back with
`GGUFWriter.add_key_value`); tensors are copied as raw bytes with their ggml type, so a copy with
no changes is a model with the same metadata and tensors as the source.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, Keys

QT = GGMLQuantizationType

# keys the writer produces itself (or that describe the source's own file layout)
_SKIP_PREFIXES = ("GGUF.", "split.")
_SKIP_KEYS = (Keys.General.ARCHITECTURE,)

_INFERRED_TYPES: tuple[tuple[type, GGUFValueType], ...] = (
    (bool, GGUFValueType.BOOL),  # before int: bool is an int
    (int, GGUFValueType.UINT32),
    (float, GGUFValueType.FLOAT32),
    (str, GGUFValueType.STRING),
)


def _infer_type(value: Any) -> tuple[GGUFValueType, GGUFValueType | None]:
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError("cannot infer the GGUF type of an empty array")
        return GGUFValueType.ARRAY, _infer_type(value[0])[0]
    for py, vt in _INFERRED_TYPES:
        if isinstance(value, py):
            return vt, None
    raise TypeError(f"no GGUF value type for {type(value).__name__}")


def _field_types(field) -> tuple[GGUFValueType, GGUFValueType | None]:
    main = field.types[0]
    sub = field.types[-1] if main == GGUFValueType.ARRAY else None
    return main, sub


def _raw_tensor(t, new_shape: tuple[int, ...] | None) -> tuple[np.ndarray, QT]:
    """The tensor as the writer wants it: typed for F32/F16, bytes [rows, row_bytes] otherwise."""
    qtype = QT(int(t.tensor_type))
    data = t.data
    if new_shape is None:
        return data, qtype
    elems, nbytes = GGML_QUANT_SIZES[qtype]
    if qtype in (QT.F32, QT.F16):
        return data.reshape(new_shape), qtype
    row_bytes = new_shape[-1] // elems * nbytes
    return data.reshape(-1).view(np.uint8).reshape(*new_shape[:-1], row_bytes), qtype


def rewrite_gguf(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    drop: Iterable[str] = (),
    arch: str | None = None,
    meta: Mapping[str, Any] | None = None,
    reshape: Mapping[str, tuple[int, ...]] | None = None,
    extra_tensors: Mapping[str, tuple[np.ndarray, QT]] | None = None,
) -> Path:
    """Copy the GGUF `src` to `dst`, changing only what is asked.

    drop: tensor names to leave out. arch: a new `general.architecture` (other keys keep their
    names, so `qwen3moe.*` keys stay as they are). meta: key -> new value (the source's value type
    is kept for an existing key and inferred for a new one; `None` deletes the key). reshape:
    tensor name -> new numpy shape with the same number of bytes. extra_tensors: name ->
    (array, ggml type); a quantized array is its raw bytes (e.g. from `gguf.quants.quantize`).
    """
    reader = GGUFReader(src, "r")
    meta = dict(meta or {})
    reshape = dict(reshape or {})
    drop = set(drop)
    arch_field = reader.fields.get(Keys.General.ARCHITECTURE)
    arch = arch or (arch_field.contents() if arch_field is not None else None)
    if arch is None:  # shards after the first carry no metadata but split.*
        raise ValueError(f"{src} names no architecture; pass arch=")
    missing = drop - {t.name for t in reader.tensors}
    if missing:
        raise KeyError(f"drop names tensors not in {src}: {sorted(missing)}")
    writer = GGUFWriter(dst, arch)

    for key, field in reader.fields.items():
        if key.startswith(_SKIP_PREFIXES) or key in _SKIP_KEYS:
            continue
        vtype, sub = _field_types(field)
        if key in meta:
            value = meta.pop(key)
            if value is None:
                continue
        else:
            value = field.contents()
        writer.add_key_value(key, value, vtype, sub_type=sub)
    for key, value in meta.items():
        if value is not None:
            vtype, sub = _infer_type(value)
            writer.add_key_value(key, value, vtype, sub_type=sub)

    for t in reader.tensors:
        if t.name in drop:
            continue
        data, qtype = _raw_tensor(t, reshape.pop(t.name, None))
        writer.add_tensor(t.name, np.ascontiguousarray(data), raw_dtype=qtype)
    if reshape:
        raise KeyError(f"reshape names tensors not in {src}: {sorted(reshape)}")
    for tname, (data, qtype) in (extra_tensors or {}).items():
        writer.add_tensor(tname, np.ascontiguousarray(data), raw_dtype=QT(qtype))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    del reader
    return Path(dst)


# ---- a catalogue of broken models, shared by the loader and CLI tests ----


@dataclass(frozen=True)
class BadModel:
    """A model file that must be refused: the error class and words its one-line message names."""

    path: Path
    error: type[Exception]
    names: tuple[str, ...]  # substrings the message must contain (the file and/or the tensor)


def shard_name(stem: str, k: int, n: int) -> str:
    return f"{stem}-{k:05d}-of-{n:05d}.gguf"


def assemble_set(dst_dir: Path, stem: str, shards: Sequence[Path | None]) -> Path:
    """Copy `shards` into `dst_dir` named as one set (`None` leaves a gap); returns shard 1."""
    dst_dir.mkdir(parents=True, exist_ok=True)
    n = len(shards)
    for k, src in enumerate(shards, 1):
        if src is not None:
            shutil.copyfile(src, dst_dir / shard_name(stem, k, n))
    return dst_dir / shard_name(stem, 1, n)


def _cut(src: Path, dst: Path, nbytes: int) -> Path:
    with open(src, "rb") as f:
        dst.write_bytes(f.read(nbytes))
    return dst


BAD_MODEL_CASES = (
    "not_gguf",
    "truncated_in_header",
    "truncated_half",
    "truncated_in_last_tensor",
    "unsupported_arch",
    "missing_tensor",
    "expert_count_contradicts_shapes",
    "tensor_shape_contradicts_metadata",
    "unsupported_tensor_type",
)  # the keys of bad_models()


def bad_models(good: Path, out_dir: Path) -> dict[str, BadModel]:
    """Single-file models broken in each way a user can meet, made from the valid model `good`."""
    from strata.model.errors import (
        MissingTensor,
        NotGGUF,
        ShapeMismatch,
        TruncatedFile,
        UnsupportedArchitecture,
    )
    from strata.quant import UnsupportedType

    out_dir.mkdir(parents=True, exist_ok=True)
    reader = GGUFReader(good, "r")
    data_start, size = reader.data_offset, good.stat().st_size
    arch = reader.fields[Keys.General.ARCHITECTURE].contents()
    n_expert = reader.fields[Keys.LLM.EXPERT_COUNT.format(arch=arch)].contents()
    q = {t.name: t for t in reader.tensors}["blk.0.attn_q.weight"]
    q_shape = tuple(int(x) for x in reversed(q.shape.tolist()))  # numpy order
    del reader

    rng = np.random.default_rng(0)
    q4_0 = gguf.quants.quantize(rng.standard_normal(q_shape).astype(np.float32), QT.Q4_0)
    text = out_dir / "notes.gguf"
    text.write_text("These are my notes, not a model.\n")

    def p(name: str) -> Path:
        return out_dir / f"{name}.gguf"

    cases = {
        "not_gguf": BadModel(text, NotGGUF, ("notes.gguf",)),
        "truncated_in_header": BadModel(
            _cut(good, p("cut_header"), data_start // 2), TruncatedFile, ("cut_header.gguf",)
        ),
        "truncated_half": BadModel(
            _cut(good, p("cut_half"), size // 2), TruncatedFile, ("cut_half.gguf",)
        ),
        "truncated_in_last_tensor": BadModel(
            _cut(good, p("cut_tail"), size - 1), TruncatedFile, ("cut_tail.gguf",)
        ),
        "unsupported_arch": BadModel(
            rewrite_gguf(good, p("llama"), arch="llama"),
            UnsupportedArchitecture,
            ("llama.gguf", "'llama'"),
        ),
        "missing_tensor": BadModel(
            rewrite_gguf(good, p("no_down"), drop=["blk.1.ffn_down_exps.weight"]),
            MissingTensor,
            ("no_down.gguf", "blk.1.ffn_down_exps"),
        ),
        "expert_count_contradicts_shapes": BadModel(
            rewrite_gguf(
                good, p("experts"), meta={Keys.LLM.EXPERT_COUNT.format(arch=arch): 2 * n_expert}
            ),
            ShapeMismatch,
            ("experts.gguf", "blk.0.ffn_gate_inp"),
        ),
        "tensor_shape_contradicts_metadata": BadModel(
            rewrite_gguf(
                good,
                p("reshaped"),
                reshape={"blk.0.attn_q.weight": (q_shape[0] // 2, q_shape[1] * 2)},
            ),
            ShapeMismatch,
            ("reshaped.gguf", "blk.0.attn_q"),
        ),
        "unsupported_tensor_type": BadModel(
            rewrite_gguf(
                good,
                p("q4_0"),
                drop=["blk.0.attn_q.weight"],
                extra_tensors={"blk.0.attn_q.weight": (q4_0, QT.Q4_0)},
            ),
            UnsupportedType,
            ("q4_0.gguf", "blk.0.attn_q", "Q4_0"),
        ),
    }
    return cases
