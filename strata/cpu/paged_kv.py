"""The host tier's KV cache in fixed-size blocks of one pool, for many sequences at once.

    L = layers, N = blocks in the pool, P = positions a block, G = KV heads, Dh = head dim,
    Dv = value head dim, T = tokens in the call, S = positions a call's queries see

A sequence's KV rows live in the blocks its block table names (position p in block
table[p // P], row p % P); `PagedKv.attention` runs `HostTier`'s attention for one sequence over
them: the same q/k/v, the same f16 (or int8 + scale) rows, the same softmax (`HostTier.attend`),
so a sequence's logits are the single-sequence cache's bit for bit. The pool is allocated once.
"""

from __future__ import annotations

import numpy as np

from strata.cpu.half import to_f32
from strata.cpu.kv import dequantize_kv_rows, quantize_kv_rows
from strata.cpu.tier import check_kv_type


class PagedKv:
    def __init__(self, args, n_blocks: int, block_size: int, kv_type: str = "f16"):
        a = args
        self.n_blocks, self.block_size = n_blocks, block_size
        self.kv_type = check_kv_type(kv_type)
        dt = np.int8 if kv_type == "int8" else np.float16
        shape = (a.n_layer, n_blocks, block_size, a.n_head_kv)
        self.k = np.zeros((*shape, a.head_dim), dt)  # [L, N, P, G, Dh]
        self.v = np.zeros((*shape, a.v_head_dim), dt)  # [L, N, P, G, Dv]
        self.k_scale = self.v_scale = None
        if kv_type == "int8":
            self.k_scale = np.zeros(shape, np.float32)  # [L, N, P, G]
            self.v_scale = np.zeros(shape, np.float32)

    @property
    def nbytes(self) -> int:
        extra = 0 if self.k_scale is None else self.k_scale.nbytes + self.v_scale.nbytes
        return self.k.nbytes + self.v.nbytes + extra

    def _write(self, layer: int, blk: np.ndarray, row: np.ndarray, k, v) -> None:
        """k [T, G, Dh], v [T, G, Dv] into rows row [T] of blocks blk [T]."""
        if self.kv_type == "int8":  # one scale a row, quantized from float32 k, v
            self.k[layer, blk, row], self.k_scale[layer, blk, row] = quantize_kv_rows(k)
            self.v[layer, blk, row], self.v_scale[layer, blk, row] = quantize_kv_rows(v)
        else:
            self.k[layer, blk, row] = k
            self.v[layer, blk, row] = v

    def _read(self, layer: int, table: np.ndarray, lo: int, s: int):
        """The rows of positions lo..s-1 as float32 kc [S, G, Dh], vc [S, G, Dv]."""
        bs = self.block_size
        b0 = lo // bs
        blocks = table[b0 : -(-s // bs)]
        r0, r1 = lo - b0 * bs, s - b0 * bs

        def rows(pool):  # [S, G, .] of the blocks, contiguous
            return pool[layer, blocks].reshape(-1, *pool.shape[3:])[r0:r1]

        if self.kv_type == "int8":
            kc = dequantize_kv_rows(rows(self.k), rows(self.k_scale))
            vc = dequantize_kv_rows(rows(self.v), rows(self.v_scale))
        else:
            kc, vc = to_f32(rows(self.k)), to_f32(rows(self.v))
        return kc, vc

    def attention(self, tier, layer: int, x: np.ndarray, pos0: int, table: np.ndarray):
        """`tier.attention(layer, x, pos0)` for one sequence whose KV rows live in the blocks
        of `table` (int array, enough blocks for pos0 + T positions) -> x + attention [T, D]."""
        s = pos0 + x.shape[0]
        if -(-s // self.block_size) > table.shape[0]:
            raise ValueError(f"{s} positions need more than the {table.shape[0]} blocks given")
        q, k, v = tier.qkv(layer, x, pos0)
        pos = np.arange(pos0, s)
        self._write(layer, table[pos // self.block_size], pos % self.block_size, k, v)
        kc, vc = self._read(layer, table, tier.first_key(layer, pos0), s)
        return tier.attend(layer, x, q, kc, vc, pos0)

    def decode_attention(
        self, tier, layer: int, x: np.ndarray, pos: np.ndarray, tables
    ) -> np.ndarray:
        """One token of each of B sequences, x [B, D], sequence b at position pos[b] [B] over
        the blocks of tables[b] -> x + attention [B, D]: the projections, RoPE and KV writes run
        over the B rows at once (each row on its own: the rows of `attention`), the softmax
        attention sequence by sequence."""
        bs = self.block_size
        q, k, v = tier.qkv_rows(layer, x)  # [B, H, Dh], [B, G, Dh], [B, G, Dv]
        q, k = tier.rope_at(q, pos), tier.rope_at(k, pos)
        blk = np.array([t[p // bs] for t, p in zip(tables, pos, strict=True)])  # [B]
        self._write(layer, blk, pos % bs, k, v)
        o = np.empty((x.shape[0], q.shape[1] * self.v.shape[-1]), np.float32)  # [B, H * Dv]
        for b, p in enumerate(pos.tolist()):
            kc, vc = self._read(layer, tables[b], tier.first_key(layer, p), p + 1)
            o[b] = tier.attend_heads(layer, q[b : b + 1], kc, vc, p)[0]
        return x + tier.layers[layer]["o"](o)
