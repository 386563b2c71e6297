"""Open a GGUF model (one file or a shard set) memory-mapped: metadata and tensor views.

Nothing is copied at open: every tensor is a numpy view into the mmap of its shard. numpy shapes
are ggml `ne` reversed (the last axis is the contiguous one).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGMLQuantizationType, Keys

from strata.model.errors import CorruptFile, NotGGUF, ShardError, TruncatedFile
from strata.model.gguf_reader import GGUFFormatError, GGUFHeader, GGUFTruncated, TensorInfo
from strata.quant import UnsupportedType, fmt

GGUF_MAGIC = b"GGUF"
_SHARD_RE = re.compile(r"^(?P<stem>.*)-(?P<idx>\d{5})-of-(?P<count>\d{5})\.gguf$")


@dataclass(frozen=True)
class TensorRef:
    """One tensor of the model: its type, numpy shape and the raw bytes (a view into the mmap)."""

    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]  # numpy order: ggml ne reversed
    data: np.ndarray  # uint8 bytes (quantized) or typed array (F32/F16), memory-mapped
    shard: int

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def raw(self) -> np.ndarray:
        """The tensor bytes as uint8, shape [rows, row_bytes]."""
        b = self.data.view(np.uint8)
        rows = int(np.prod(self.shape[:-1], dtype=np.int64)) if len(self.shape) > 1 else 1
        return b.reshape(rows, -1)


def shard_paths(path: str | os.PathLike) -> list[Path]:
    """All shards of the set `path` belongs to (`[path]` for a single file); missing ones fail."""
    p = Path(path)
    if p.is_dir():
        ggufs = sorted(p.glob("*.gguf"))
        if not ggufs:
            raise NotGGUF(f"{p}: directory holds no .gguf file")
        p = ggufs[0]
    m = _SHARD_RE.match(p.name)
    if not m:
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such file")
        return [p]
    stem, count = m["stem"], int(m["count"])
    paths = [p.with_name(f"{stem}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [q.name for q in paths if not q.exists()]
    if missing:
        raise ShardError(f"{p.name}: shard set is incomplete, missing {', '.join(missing)}")
    return paths


def _open_reader(path: Path) -> GGUFHeader:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file") from None
    if stat.S_ISDIR(mode):
        raise NotGGUF(f"{path}: is a directory, not a GGUF file")
    if not stat.S_ISREG(mode):  # a named pipe or device would block the open or the read
        raise NotGGUF(f"{path}: not a regular file (a pipe, socket or device), not a GGUF file")
    with open(path, "rb") as f:
        head = f.read(4)
    if head != GGUF_MAGIC:
        raise NotGGUF(f"{path}: not a GGUF file (magic {head!r}, expected b'GGUF')")
    try:
        return GGUFHeader(path)
    except (GGUFFormatError, OverflowError, MemoryError) as e:
        size = path.stat().st_size
        err = TruncatedFile if isinstance(e, GGUFTruncated) else CorruptFile
        what = "truncated" if err is TruncatedFile else "corrupt"
        raise err(f"{path}: {what} GGUF file ({size:,} bytes; reader: {_one_line(e)})") from None


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _tensor_type_and_bytes(t: TensorInfo, where: str) -> tuple[GGMLQuantizationType, int]:
    """The tensor's type and byte size, after checking the type is one Strata reads and every
    dimension is >= 1 with rows a whole number of blocks (Python ints: no overflow)."""
    try:
        qtype = GGMLQuantizationType(t.ggml_type)
    except ValueError:
        raise UnsupportedType(f"{where}: unknown tensor type id {t.ggml_type}") from None
    try:
        f = fmt(qtype)
    except UnsupportedType as e:
        raise UnsupportedType(f"{where}: {e}") from None
    if min(t.ne) < 1:
        raise CorruptFile(f"{where} has a dimension of 0 ({list(t.ne)})")
    if t.ne[0] % f.block_elems:
        raise CorruptFile(
            f"{where}: rows of {t.ne[0]} are not a whole number of {qtype.name} blocks "
            f"({f.block_elems} values)"
        )
    n = 1
    for d in t.ne:
        n *= d
    return qtype, n // f.block_elems * f.block_bytes


def _typed_view(raw: np.ndarray, qtype: GGMLQuantizationType, shape: tuple[int, ...]):
    """F32/F16 tensors as typed arrays of `shape`; the others as uint8 [.., row_bytes]."""
    if qtype == GGMLQuantizationType.F32:
        return raw.view(np.float32).reshape(shape)
    if qtype == GGMLQuantizationType.F16:
        return raw.view(np.float16).reshape(shape)
    return raw.reshape(*shape[:-1], -1)


class GGUFModel:
    """A memory-mapped GGUF model: `metadata` (key -> value) and `tensors` (name -> TensorRef)."""

    def __init__(self, path: str | os.PathLike):
        self.paths = shard_paths(path)
        self.readers = [_open_reader(p) for p in self.paths]
        self.metadata: dict[str, Any] = {}
        self.metadata.update(self.readers[0].fields)
        self._check_shards()
        self.tensors: dict[str, TensorRef] = {}
        for i, r in enumerate(self.readers):
            self._add_tensors(i, r)
        self._check_tensor_count()

    @property
    def path(self) -> Path:
        return self.paths[0]

    def _check_shards(self) -> None:
        n = len(self.paths)
        if n == 1:
            return
        count_key, idx_key = Keys.Split.LLM_KV_SPLIT_COUNT, Keys.Split.LLM_KV_SPLIT_NO
        ftype0 = self.metadata.get(Keys.General.FILE_TYPE)
        for i, (p, r) in enumerate(zip(self.paths, self.readers, strict=True)):
            f = r.fields
            count, no = f.get(count_key), f.get(idx_key)
            if count is not None and count != n:
                raise ShardError(f"{p.name}: belongs to a set of {count} shards, found {n}")
            if no is not None and no != i:
                raise ShardError(f"{p.name}: is shard {no + 1} of its set, expected {i + 1}")
            ft = f.get(Keys.General.FILE_TYPE, ftype0)
            if ftype0 is not None and ft != ftype0:
                raise ShardError(
                    f"{p.name}: file type {ft} differs from shard 1's {ftype0} (mixed quants?)"
                )

    def _check_tensor_count(self) -> None:
        """Every shard states the set's tensor total; a shard of another set disagrees with it."""
        if len(self.paths) == 1:
            return
        key = Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT
        for p, r in zip(self.paths, self.readers, strict=True):
            want = r.fields.get(key)
            if want is not None and want != len(self.tensors):
                raise ShardError(
                    f"{p.name}: belongs to a set of {want} tensors, the shards hold "
                    f"{len(self.tensors)} (shards from different sets?)"
                )

    def _add_tensors(self, shard: int, r: GGUFHeader) -> None:
        """Check each tensor's type, dims and place, then view its bytes. As llama.cpp does, the
        data must follow the header's order, each tensor at the next multiple of the alignment:
        an offset moved by even one byte is refused, not read as other weights."""
        size, fname = len(r.mm), self.paths[shard].name
        expect, prev = 0, None  # where the next tensor's data must start, after which tensor
        for t in r.tensors:
            where = f"{fname}: tensor {t.name}"
            qtype, need = _tensor_type_and_bytes(t, where)
            if t.offset != expect:
                after = f"right after {prev[0]} ({prev[1]:,} bytes as {prev[2]})" if prev else ""
                raise CorruptFile(
                    f"{where} starts at data offset {t.offset:,}, expected {expect:,} "
                    f"{after or 'at the start'} (tensors follow one another in header order, "
                    f"each aligned to {r.alignment} bytes)"
                )
            expect += -(-need // r.alignment) * r.alignment
            prev = (t.name, need, qtype.name)
            if r.data_offset + t.offset + need > size:
                raise TruncatedFile(
                    f"{where} ({need:,} bytes as {qtype.name}) runs past the end of the file "
                    f"(truncated at {size} bytes)"
                )
            if t.name in self.tensors:
                first = self.paths[self.tensors[t.name].shard].name
                raise ShardError(f"{where} is also in {first} (shards from different sets?)")
            shape = tuple(reversed(t.ne))
            data = _typed_view(r.tensor_bytes(t, need), qtype, shape)
            self.tensors[t.name] = TensorRef(t.name, qtype, shape, data, shard)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get(Keys.General.ARCHITECTURE, "?"))

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def arch_key(self, key_template: str, default: Any = None) -> Any:
        """Value of an architecture-scoped key, e.g. `Keys.LLM.EXPERT_COUNT`."""
        return self.metadata.get(key_template.format(arch=self.architecture), default)
