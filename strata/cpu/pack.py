"""The expert pack: every layer's expert matrices in the kernels' layout, built once, mmapped.

`prepare` repacks some formats (IQ3_XXS -> LUT4, IQ1_M -> T2, ...) into a RAM copy at every start;
the pack stores what `prepare` produces, so a start maps the file instead.

    build_pack(model, "packs/swift-iq3_xxs", release="swift")   # experts.bin + experts.bin.src.json
    pack = open_pack("packs/swift-iq3_xxs", model, release="swift")
    pack.layers[i]                                              # LayerWeights, views into the mmap

`experts.bin` (all integers little-endian; offsets in bytes):

    0   magic b"STRXPAK1"
    8   u32 header version (HEADER_VERSION), u32 zero
    16  u64 data_offset (a multiple of PAGE), u64 index length
    32  the index: UTF-8 JSON {"format", "pack_id", "simd", "regions": [...]}
    data_offset ... regions, each starting on a PAGE boundary

A region is one expert tensor [E, R, C] as `ExpertMatrix.data` holds it: uint8 [E * R, row_bytes],
expert-major (expert e's rows are contiguous), recorded with its layer, role (gate/up/down),
GGUF tensor name, qtype, layout, kernel, shape, row_bytes and offset (from data_offset).
`experts.bin.src.json` names where the pack came from: format, model_id, release, quant, the
source shards (basename, byte size, mtime, a hash of their expert bytes), the host's SIMD level and
the layout of each qtype, the pack_id that ties it to its experts.bin and that file's block hashes
(strata.cpu.pack_check). A pack whose provenance or content does not match the model refuses to
load (`PackError`); one without src.json loads with a warning naming the missing file. A build
writes temporary files only (`.experts.bin.<pack_id>.tmp`), renamed at the end; a killed build's
are removed by the next one.

Imports numpy, gguf and strata.cpu only (no CuPy, no engine); the model is duck-typed
(`args`, `tensor(MT, layer)`, `gguf.paths`, `metadata`: `strata.model.loader.Model`).
"""

from __future__ import annotations

import json
import os
import re
import struct
import uuid
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf.constants import MODEL_TENSOR as MT
from gguf.constants import GGMLQuantizationType

from strata.cpu import pack_check
from strata.cpu.kernels.features import simd_enabled
from strata.cpu.layout import ExpertMatrix, prepare
from strata.cpu.pack_check import REBUILD, BlockHasher, PackError, SourceHasher
from strata.cpu.pool import LayerWeights

FORMAT = "strata-experts-2"  # the pack layout and src.json schema; bump on any change
MAGIC = b"STRXPAK1"
HEADER_VERSION = 1
PAGE = 4096
PACK_FILE = "experts.bin"
SRC_FILE = "experts.bin.src.json"
ROLES = (("gate", MT.FFN_GATE_EXP), ("up", MT.FFN_UP_EXP), ("down", MT.FFN_DOWN_EXP))
_HEAD = struct.Struct("<8sIIQQ")  # magic, version, zero, data_offset, index length
CHUNK_BYTES = 64 << 20  # experts prepared and written per step (bounds the builder's RAM)
TMP_GLOB = (f".{PACK_FILE}.*.tmp", f".{SRC_FILE}.*.tmp")  # a build's temporary files


class PackWarning(UserWarning):
    """A pack loads, but something about it could not be checked."""


def _simd_name(simd: bool | None) -> str:
    return "avx2" if (simd_enabled() if simd is None else simd) else "portable"


def _align(n: int) -> int:
    return -(-n // PAGE) * PAGE


# ---- the model side: expert tensors, their prepared rows, provenance ----


def probe(t, simd: bool | None = None) -> ExpertMatrix:
    """What `prepare` makes of tensor t's first row on this host: layout, kernel, row bytes."""
    c = t.shape[-1]
    return prepare(t.qtype, (1, 1, c), t.data[0, :1], simd)


def expert_rows(t, e0: int, e1: int, simd: bool | None = None):
    """Experts e0..e1 of tensor t [E, R, C] as the kernels read them: uint8 [(e1-e0) * R, B]."""
    _, r, c = t.shape
    return prepare(t.qtype, (e1 - e0, r, c), t.data[e0:e1], simd).data


def expert_quant(model) -> str:
    """The experts' type name: the type most expert tensors have (e.g. "IQ3_XXS")."""
    n = Counter(model.tensor(m, i).qtype.name for i in range(model.args.n_layer) for _, m in ROLES)
    return n.most_common(1)[0][0]


def source_shards(model) -> list[dict]:
    return [{"name": p.name, "size": p.stat().st_size} for p in model.gguf.paths]


def temporaries(out_dir: str | os.PathLike) -> list[Path]:
    """The temporary files builds left in out_dir (a killed `strata pack`'s)."""
    d = Path(out_dir)
    return sorted(q for g in TMP_GLOB for q in d.glob(g)) if d.is_dir() else []


def remove_temporaries(out_dir: str | os.PathLike) -> list[Path]:
    """Remove what killed builds left in out_dir; returns what was removed."""
    gone = temporaries(out_dir)
    for q in gone:
        q.unlink(missing_ok=True)
    return gone


def default_model_id(model) -> str:
    """The first shard's stem without its shard suffix (what the server names the model)."""
    return re.sub(r"-\d{5}-of-\d{5}$", "", model.gguf.paths[0].stem)


# ---- building ----


@dataclass(frozen=True)
class _Plan:
    layer: int
    role: str
    t: object  # the model's TensorRef
    m: ExpertMatrix  # the probe (one row)
    offset: int  # from data_offset

    @property
    def nbytes(self) -> int:
        e, r, _ = self.t.shape
        return e * r * self.m.data.shape[1]

    def entry(self) -> dict:
        e, r, c = self.t.shape
        return {
            "layer": self.layer,
            "role": self.role,
            "tensor": self.t.name,
            "qtype": self.t.qtype.name,
            "layout": self.m.layout,
            "kernel": self.m.kernel,
            "shape": [e, r, c],
            "row_bytes": int(self.m.data.shape[1]),
            "offset": self.offset,
            "nbytes": self.nbytes,
        }


def build_pack(
    model,
    out_dir: str | os.PathLike,
    *,
    release: str | None = None,
    model_id: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    simd: bool | None = None,
) -> Path:
    """Write out_dir/experts.bin and experts.bin.src.json; returns the experts.bin path.

    Both files are written to temporary names and renamed at the end: after any failure neither
    is left half-written (an older pack in out_dir stays whole; a directory this call created
    is removed again). simd as in `prepare` (None: the host's). `progress(done, total)` is
    called with the bytes written so far after each chunk.
    """
    out = Path(out_dir)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    remove_temporaries(out)  # a killed build's leftovers
    plans, rel = [], 0
    for i in range(model.args.n_layer):
        for role, m in ROLES:
            t = model.tensor(m, i)
            p = _Plan(i, role, t, probe(t, simd), rel)
            plans.append(p)
            rel += _align(p.nbytes)
    pack_id = uuid.uuid4().hex
    level = _simd_name(simd)
    index = {
        "format": FORMAT,
        "pack_id": pack_id,
        "simd": level,
        "regions": [p.entry() for p in plans],
    }
    blob = json.dumps(index, separators=(",", ":")).encode()
    data_offset = _align(_HEAD.size + len(blob))
    tmp_bin = out / f".{PACK_FILE}.{pack_id}.tmp"
    tmp_src = out / f".{SRC_FILE}.{pack_id}.tmp"
    blocks, sources = BlockHasher(), SourceHasher(len(model.gguf.paths))
    try:
        done = 0
        with open(tmp_bin, "wb") as f:
            f.write(_HEAD.pack(MAGIC, HEADER_VERSION, 0, data_offset, len(blob)) + blob)
            for p in plans:
                blocks.feed(bytes(p.offset - done))  # the zero gap up to this region's page
                done = p.offset
                f.seek(data_offset + p.offset)
                e = p.t.shape[0]
                step = max(1, CHUNK_BYTES // max(1, p.nbytes // e))
                for e0 in range(0, e, step):
                    e1 = min(e, e0 + step)
                    sources.feed(p.t.shard, p.t.data[e0:e1])
                    rows = expert_rows(p.t, e0, e1, simd)
                    if rows.shape[1] != p.m.data.shape[1]:  # prepare must not depend on E
                        raise PackError(f"{p.t.name}: prepared row size changed with the slice")
                    out_bytes = memoryview(np.ascontiguousarray(rows)).cast("B")
                    f.write(out_bytes)
                    blocks.feed(out_bytes)
                    done += rows.nbytes
                    if progress:
                        progress(done, rel)
            blocks.feed(bytes(rel - done))
            f.truncate(data_offset + rel)
            f.flush()
            os.fsync(f.fileno())
        block_hashes = blocks.finish()
        src = {
            "format": FORMAT,
            "model_id": model_id or default_model_id(model),
            "release": release,
            "quant": expert_quant(model),
            "shards": source_shards(model),
            "pack_id": pack_id,
            "simd": level,
            "layouts": {p.t.qtype.name: p.m.layout for p in plans},
            "hash": pack_check.HASH,
            "source": [
                {**pack_check.stamp(path), "experts": h}
                for path, h in zip(model.gguf.paths, sources.hexdigests(), strict=True)
            ],
            "experts_bin": {
                **pack_check.stamp(tmp_bin),  # os.replace keeps the size and mtime
                "block_bytes": pack_check.BLOCK,
                "blake2b": pack_check.root(block_hashes),
                "blocks": block_hashes,
            },
        }
        with open(tmp_src, "w") as f:
            json.dump(src, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        # a crash between the renames leaves a pack without src.json (a warning), never a pack
        # beside another pack's provenance
        (out / SRC_FILE).unlink(missing_ok=True)
        os.replace(tmp_bin, out / PACK_FILE)
        os.replace(tmp_src, out / SRC_FILE)
    finally:
        tmp_bin.unlink(missing_ok=True)
        tmp_src.unlink(missing_ok=True)
        if created and not any(out.iterdir()):
            out.rmdir()  # a failed first build leaves no directory behind either
    return out / PACK_FILE


# ---- opening ----


@dataclass
class Pack:
    """An opened pack: per-layer `LayerWeights` whose matrices are views into `mm`."""

    path: Path
    layers: list[LayerWeights]
    index: dict
    src: dict | None  # None: loaded without src.json
    mm: np.ndarray  # the whole experts.bin, memory-mapped read-only

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for lw in self.layers for m in (lw.gate, lw.up, lw.down))

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, layer: int) -> LayerWeights:
        return self.layers[layer]

    def __iter__(self):
        return iter(self.layers)


_REGION_KEYS = {
    "layer": int,
    "role": str,
    "tensor": str,
    "qtype": str,
    "layout": str,
    "shape": list,
    "row_bytes": int,
    "offset": int,
    "nbytes": int,
}


def _regions_ok(regions) -> bool:
    return isinstance(regions, list) and all(
        isinstance(r, dict)
        and all(isinstance(r.get(k), t) for k, t in _REGION_KEYS.items())
        and r["qtype"] in GGMLQuantizationType.__members__
        and len(r["shape"]) == 3
        and r["nbytes"] == r["shape"][0] * r["shape"][1] * r["row_bytes"]
        for r in regions
    )


def _read_index(path: Path) -> tuple[dict, int]:
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD.size)
            if len(head) < _HEAD.size or head[:8] != MAGIC:
                raise PackError(f"{path}: not a strata expert pack (magic {head[:8]!r})")
            _, version, _, data_offset, n = _HEAD.unpack(head)
            if version != HEADER_VERSION:
                raise PackError(
                    f"{path}: pack header version {version}, this strata reads "
                    f"{HEADER_VERSION}; {REBUILD}"
                )
            blob = f.read(n)
    except FileNotFoundError:
        raise PackError(
            f"{path}: no such file (build the pack: strata pack MODEL -o DIR)"
        ) from None
    try:
        index = json.loads(blob)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise PackError(f"{path}: the pack index is corrupt; {REBUILD}") from None
    if not isinstance(index, dict) or not _regions_ok(index.get("regions")):
        raise PackError(f"{path}: the pack index is corrupt; {REBUILD}")
    if index.get("format") != FORMAT:
        raise PackError(
            f"{path}: pack format {index.get('format')!r}, this strata reads {FORMAT!r}; {REBUILD}"
        )
    return index, data_offset


def _read_src(src_path: Path) -> dict | None:
    if not src_path.exists():
        warnings.warn(
            f"{src_path}: missing; the pack's source shards, quant and release are not checked",
            PackWarning,
            stacklevel=3,
        )
        return None
    try:
        src = json.loads(src_path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PackError(f"{src_path}: not valid JSON ({e.msg}); {REBUILD}") from None
    if not isinstance(src, dict):
        raise PackError(f"{src_path}: not a JSON object; {REBUILD}")
    return src


def _shards(ss) -> str:
    if not isinstance(ss, list) or not all(isinstance(s, dict) for s in ss):
        return repr(ss)
    return ", ".join(f"{s.get('name')} ({s.get('size')} B)" for s in ss)


def _check_src(src: dict, src_path: Path, index: dict, model, release: str | None) -> None:
    name = str(src_path)
    if src.get("format") != FORMAT:
        raise PackError(
            f"{src_path}: pack format {src.get('format')!r}, this strata reads {FORMAT!r}; "
            f"{REBUILD}"
        )
    if src.get("pack_id") != index.get("pack_id"):
        raise PackError(f"{src_path}: describes another experts.bin (pack_id differs); {REBUILD}")
    want = source_shards(model)
    got = src.get("shards")
    if got != want:
        raise PackError(
            f"{name} names other source shards: {_shards(got)}; the model is {_shards(want)}"
        )
    quant = expert_quant(model)
    if src.get("quant") != quant:
        raise PackError(f"{name}: pack of {src.get('quant')} experts, the model's are {quant}")
    if release is not None and src.get("release") != release:
        built = src.get("release")
        built = "built without --release" if built is None else f"of release {built!r}"
        raise PackError(f"{name}: pack {built}, this run is release {release!r}")


def open_pack(
    pack_dir: str | os.PathLike,
    model,
    *,
    release: str | None = None,
    simd: bool | None = None,
    verify: bool = False,
) -> Pack:
    """Memory-map pack_dir/experts.bin for `model` after checking its provenance and layout.

    Refuses (`PackError`) a pack of other shards, another quant, another release (when `release`
    is given), another format, a layout this host's kernels would not pick (simd as in
    `prepare`; None: the host's), or content that differs from what was built: experts.bin's
    blocks and the source's expert bytes are hashed in full where a file's size or mtime moved
    since the build, or when `verify` asks; else sampled (strata.cpu.pack_check).
    """
    d = Path(pack_dir)
    path = d / PACK_FILE
    index, data_offset = _read_index(path)
    src_path = d / SRC_FILE
    src = _read_src(src_path)
    if src is not None:
        _check_src(src, src_path, index, model, release)
    regions = index["regions"]
    end = max((data_offset + r["offset"] + r["nbytes"] for r in regions), default=data_offset)
    size = path.stat().st_size
    if size < end:
        raise PackError(f"{path}: truncated ({size} bytes, the index needs {end}); {REBUILD}")
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    by_key = {(r["layer"], r["role"]): r for r in regions}
    host = _simd_name(simd)
    layers = []
    for i in range(model.args.n_layer):
        mats = []
        for role, m in ROLES:
            t = model.tensor(m, i)
            r = by_key.get((i, role))
            if r is None:
                raise PackError(f"{path}: holds no {role} experts of layer {i}; {REBUILD}")
            if r["tensor"] != t.name or r["qtype"] != t.qtype.name or r["shape"] != list(t.shape):
                raise PackError(
                    f"{path}: {r['tensor']} is {r['qtype']} {r['shape']}, the model's "
                    f"{t.name} is {t.qtype.name} {list(t.shape)}"
                )
            mats.append(_matrix(path, mm, data_offset, r, t, index.get("simd"), host, simd))
        layers.append(LayerWeights(*mats))
    if src is not None:
        pack_check.check_file(path, mm, data_offset, src.get("experts_bin"), regions, verify)
        _check_source(d / SRC_FILE, src, model, layers, verify, simd)
    return Pack(path, layers, index, src, mm)


def _check_source(src_path: Path, src: dict, model, layers, full: bool, simd) -> None:
    """The model's expert bytes are those the pack was built from: hashed in full where a shard's
    size or mtime moved (or `full`), else a sample of experts prepared again and compared."""
    recs, paths = src.get("source"), model.gguf.paths
    if not isinstance(recs, list) or len(recs) != len(paths):
        raise PackError(f"{src_path}: records no hash of the source's experts; {REBUILD}")
    tensors = [model.tensor(m, i) for i in range(model.args.n_layer) for _, m in ROLES]
    if full or not all(pack_check.unchanged(q, r) for q, r in zip(paths, recs, strict=True)):
        got = pack_check.source_digests(model, tensors)
        for q, r, h in zip(paths, recs, got, strict=True):
            if r.get("experts") != h:
                raise PackError(
                    f"{src_path}: built from other expert bytes than {q.name} has (same name and "
                    f"size, other content); {REBUILD}"
                )
        return
    mats = [m for lw in layers for m in (lw.gate, lw.up, lw.down)]
    picks = pack_check.sample(
        len(mats) * mats[0].n_expert, pack_check.SAMPLE_EXPERTS, src["pack_id"]
    )
    for k in picks:
        t, m = tensors[k // mats[0].n_expert], mats[k // mats[0].n_expert]
        e = k % m.n_expert
        if not np.array_equal(
            expert_rows(t, e, e + 1, simd), m.data[e * m.rows : (e + 1) * m.rows]
        ):
            raise PackError(
                f"{src_path}: expert {e} of {t.name} differs from the model's; {REBUILD}"
            )


def _matrix(path, mm, data_offset, r, t, built_simd, host_simd, simd) -> ExpertMatrix:
    """Region r as an ExpertMatrix view, after checking this host's kernels read its layout."""
    p = probe(t, simd)
    qt = GGMLQuantizationType[r["qtype"]]
    if p.layout != r["layout"]:
        raise PackError(
            f"{path}: {qt.name} experts packed in the {r['layout']} layout (built with SIMD "
            f"{built_simd}), this host's kernels read {p.layout} (SIMD {host_simd}); rebuild the "
            "pack on this host: strata pack MODEL -o DIR --force"
        )
    e, rows, c = r["shape"]
    b = r["row_bytes"]
    start = data_offset + r["offset"]
    view = mm[start : start + e * rows * b].reshape(e * rows, b)
    # the first row, prepared now from the GGUF, must be the stored one: catches a layout that
    # kept its name but changed its bytes (a newer kernel) and a pack of other weights
    if p.data.shape[1] != b or not np.array_equal(p.data[0], view[0]):
        raise PackError(
            f"{path}: the {r['layout']} layout of {qt.name} ({r['tensor']}) differs from what "
            f"this strata prepares; {REBUILD}"
        )
    return ExpertMatrix(qt, e, rows, c, view, p.kernel, p.act, p.layout)
