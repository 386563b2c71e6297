"""Content hashes of an expert pack: what `build_pack` records in src.json, what `open_pack` and
`strata pack --verify` check.

- `experts_bin`: blake2b-128 of every BLOCK bytes of experts.bin from its data offset, fed while
  the pack is written (the zero gaps between regions included), with the file's size and mtime.
- per source shard: blake2b-128 of the GGUF expert bytes the pack was made from, in pack order,
  fed from the same rows the builder prepares, with the shard's mtime.

At load a file whose size and mtime are those recorded gets the fast path (sampled blocks of
experts.bin; sampled experts prepared from the GGUF and compared with the pack); any other gets
every block and every expert byte of the source hashed, so a write into either file or a source
of the same name and size but other experts is refused, not computed with.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

import numpy as np

HASH = "blake2b-128"
BLOCK = 4 << 20  # experts.bin bytes per recorded block hash
SAMPLE_BLOCKS = 8  # blocks of experts.bin the fast path hashes (besides the first and last)
SAMPLE_EXPERTS = 4  # experts per shard the fast path prepares from the GGUF and compares
REBUILD = "rebuild it: strata pack MODEL -o DIR --force"


class PackError(ValueError):
    """A pack that cannot be used with this model or host; the message is one line."""


def _new():
    return hashlib.blake2b(digest_size=16)


def _bytes(a: np.ndarray) -> memoryview:
    return memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8))


class BlockHasher:
    """Hashes of consecutive BLOCK-byte blocks of a stream fed in order."""

    def __init__(self, block: int = BLOCK):
        self.block, self.blocks, self._h, self._fill = block, [], _new(), 0

    def feed(self, data) -> None:
        mv = memoryview(data).cast("B")
        while len(mv):
            take = min(len(mv), self.block - self._fill)
            self._h.update(mv[:take])
            self._fill += take
            mv = mv[take:]
            if self._fill == self.block:
                self.blocks.append(self._h.hexdigest())
                self._h, self._fill = _new(), 0

    def finish(self) -> list[str]:
        if self._fill:
            self.blocks.append(self._h.hexdigest())
            self._h, self._fill = _new(), 0
        return self.blocks


class SourceHasher:
    """One hash per source shard of the expert bytes read from it, fed in pack order."""

    def __init__(self, n_shards: int):
        self._h = [_new() for _ in range(n_shards)]

    def feed(self, shard: int, raw: np.ndarray) -> None:
        self._h[shard].update(_bytes(raw))

    def hexdigests(self) -> list[str]:
        return [h.hexdigest() for h in self._h]


def root(blocks: list[str]) -> str:
    """The whole file's hash: blake2b of its block hashes."""
    return hashlib.blake2b("".join(blocks).encode(), digest_size=16).hexdigest()


def stamp(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def unchanged(path: Path, rec: dict) -> bool:
    """The file's size and mtime are the recorded ones (the fast path's guard)."""
    return stamp(path) == {k: rec.get(k) for k in ("size", "mtime_ns")}


def _where(regions: list[dict], lo: int, hi: int) -> str:
    """The regions bytes lo..hi (from data_offset) belong to, for a message."""
    names = [r["tensor"] for r in regions if r["offset"] < hi and lo < r["offset"] + r["nbytes"]]
    return ", ".join(names[:3]) or "padding between regions"


def sample(n: int, k: int, seed: str) -> list[int]:
    """k of range(n) (always 0 and n-1), chosen by a seed: the same every load of one pack."""
    rng = np.random.default_rng(int(seed[:16], 16) if seed else 0)
    picks = {0, n - 1} | {int(i) for i in rng.integers(0, n, size=min(k, n))}
    return sorted(i for i in picks if 0 <= i < n)


def check_blocks(
    path: Path, mm: np.ndarray, data_offset: int, rec: dict, regions: list, which: Iterable[int]
) -> None:
    """Hash the given blocks of experts.bin; PackError names the experts of the first bad one."""
    blocks, block = rec["blocks"], rec["block_bytes"]
    for i in which:
        lo = data_offset + i * block
        if _new_digest(mm[lo : lo + block]) != blocks[i]:
            raise PackError(
                f"{path}: bytes {lo:,}..{lo + block:,} changed since the pack was built "
                f"({_where(regions, i * block, (i + 1) * block)}); {REBUILD}"
            )


def _new_digest(a: np.ndarray) -> str:
    h = _new()
    h.update(_bytes(a))
    return h.hexdigest()


def check_file(path: Path, mm: np.ndarray, data_offset: int, rec, regions, full: bool) -> None:
    """experts.bin against its recorded block hashes: all of them, or a sample when `full` is
    off and the file's size and mtime are those recorded."""
    if not isinstance(rec, dict) or not isinstance(rec.get("blocks"), list):
        raise PackError(f"{path}: src.json records no content hash; {REBUILD}")
    n = len(rec["blocks"])
    if root(rec["blocks"]) != rec.get("blake2b"):
        raise PackError(f"{path}: src.json's block hashes do not add up; {REBUILD}")
    fast = not full and unchanged(path, rec)
    which = sample(n, SAMPLE_BLOCKS, rec.get("blake2b", "")) if fast else range(n)
    check_blocks(path, mm, data_offset, rec, regions, which)


def source_digests(model, tensors: list) -> list[str]:
    """Every expert byte of the model's shards, hashed in pack order (the full source check)."""
    h = SourceHasher(len(model.gguf.paths))
    for t in tensors:
        h.feed(t.shard, t.data)
    return h.hexdigests()
