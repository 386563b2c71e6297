"""Many sequences in one decode step on the CPU-only tier (`BatchEngine`, a `BatchRunner`).

    B = sequences in a decode step, T = prompt tokens in a prefill chunk, D = hidden,
    E = experts, V = vocab, L = layers

Each sequence's KV rows live in blocks of one pool (strata/cpu/paged_kv.py) named by its block
table (strata/engine/kv_blocks.py, which also shares the full blocks of identical prompt
prefixes). A prompt runs in chunks as the eager step runs it (attention over the sequence's
blocks, router, experts). A decode step runs, per layer, the q/k/v and output projections over
all B rows at once and the softmax attention of each sequence at its own position over its own
blocks (`PagedKv.decode_attention`), then the router over the B rows and the experts over the B
rows at once (`Moe`: top-k, CAR, resident picks on the tier, the rest in the CPU pool, which
reads each expert's bytes once for every row that picked it), the shared expert, and the output
head over the B rows. The rows never mix: with the dense matrices and the experts on the pool's
kernels a sequence gets the logits of the single-sequence eager path bit for bit, where its
prompt runs in the same chunks (the tier's own float experts: to float noise).

The hybrid tier (DeltaNet layers) keeps one recurrent state: it is refused here for now.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from strata.cpu.paged_kv import PagedKv
from strata.engine.batch_api import BatchStats, KvFull
from strata.engine.kv_blocks import BlockManager
from strata.engine.moe import MissRunner, Moe
from strata.engine.stats import EngineStats
from strata.model.loader import Model
from strata.routing.car import CarKnobs
from strata.routing.slack import SlackMeter

__all__ = ["BatchEngine", "KvFull"]


class _Run:
    __slots__ = ("prompt", "done")

    def __init__(self, prompt: list[int], done: int):
        self.prompt = prompt
        self.done = done  # positions whose KV rows are written (the next position)


class BatchEngine:
    """Prefill and batched decode of up to `max_batch` sequences on a `HostTier` (its own KV
    cache unused: the sequences' rows live in a pool of `kv_blocks` blocks of `block_size`).

    tier: None = a `HostTier` with dense matrices on the pool's kernels; resident [L, E]: the
    experts the tier holds (default: all without a miss runner, none beside one, as
    `build_batch_engine` places them); miss_runner: where the others run (the CPU pool);
    car: None = CAR not wired."""

    def __init__(
        self,
        model: Model,
        tier=None,
        n_ctx: int | None = None,
        max_batch: int = 8,
        kv_blocks: int | None = None,
        block_size: int = 16,
        miss_runner: MissRunner | None = None,
        car: CarKnobs | None = None,
        resident: np.ndarray | None = None,
        kv_type: str = "f16",
    ):
        from strata.cpu.tier import HostTier

        a = self.args = model.args
        self.model = model
        if a.linear_attn:
            raise ValueError(
                f"batched decode: {a.arch}'s DeltaNet layers keep one recurrent state per "
                "engine; batching them is not supported yet (one sequence per engine)"
            )
        if tier is None:
            tier = HostTier(model, n_ctx=1, kv_type=kv_type, dense="quant")
        if not isinstance(tier, HostTier) or type(tier).attention is not HostTier.attention:
            raise ValueError("batched decode runs on the CPU-only tier (HostTier) for now")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.tier, self.max_batch = tier, max_batch
        self.n_ctx = n_ctx or min(a.n_ctx_train, 4096)
        n_blocks = kv_blocks or -(-self.n_ctx // block_size) * max_batch
        self.blocks = BlockManager(n_blocks, block_size)
        self.kv = PagedKv(a, n_blocks, block_size, tier.kv_type)
        self.stats = BatchStats(kv_blocks_total=n_blocks)
        if resident is None:
            resident = np.full((a.n_layer, a.n_expert), miss_runner is None)
        self.resident = resident
        self.engine_stats = EngineStats(
            expert_hist=np.zeros((a.n_layer, a.n_expert), np.int64), slack=SlackMeter(a.n_layer)
        )
        self.moe = Moe(
            a,
            tier,
            miss_runner or tier,
            resident,
            car,
            None,
            None,
            self.engine_stats,
            card=False,
            pool=miss_runner is not None,
        )
        self._runs: dict[int, _Run] = {}

    # ---- BatchRunner ----
    def admit(self, seq: int, tokens: Sequence[int]) -> int:
        if seq in self._runs:
            raise ValueError(f"sequence {seq} is already admitted")
        if len(self._runs) >= self.max_batch:
            raise ValueError(f"at most {self.max_batch} sequences at once")
        prompt = self._ids(tokens).tolist()
        if len(prompt) > self.n_ctx - 1:
            raise ValueError(f"prompt of {len(prompt)} tokens > n_ctx - 1 = {self.n_ctx - 1}")
        reused = self.blocks.admit(seq, prompt, len(prompt) + 1)  # KvFull: nothing changed
        self._runs[seq] = _Run(prompt, reused)
        self.stats.prefix_hit_tokens += reused
        self._count()
        return reused

    def prefill(self, seq: int, budget: int) -> np.ndarray | None:
        run = self._run(seq)
        if budget < 1:
            raise ValueError(f"prefill budget must be >= 1, got {budget}")
        p0, n_prompt = run.done, len(run.prompt)
        if p0 >= n_prompt:
            raise ValueError(f"sequence {seq}: its prompt has run already")
        ids = np.asarray(run.prompt[p0 : p0 + budget], np.int64)  # [T]
        table = np.asarray(self.blocks.table(seq), np.intp)
        tier, moe, a = self.tier, self.moe, self.args
        x = tier.embed(ids)  # [T, D]
        for i in range(a.n_layer):
            x = self.kv.attention(tier, i, x, p0, table)
            h, logits = tier.router(i, x)  # [T, D], [T, E]
            y = moe(i, h, logits, False, p0)
            if a.shared_ff:
                y = y + tier.shared_expert(i, h)
            x = x + y
        run.done = p0 + ids.size
        self.blocks.commit(seq, run.done)
        self.engine_stats.tokens += ids.size
        if run.done < n_prompt:
            return None
        return tier.output(x[-1:])[0]  # [V]

    def decode(self, seqs: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        b_n = len(seqs)
        if b_n == 0 or len(tokens) != b_n or len(set(seqs)) != b_n:
            raise ValueError("decode needs distinct sequences and one token each")
        if b_n > self.max_batch:
            raise ValueError(f"at most {self.max_batch} sequences a step, got {b_n}")
        runs = [self._run(q) for q in seqs]
        for q, run in zip(seqs, runs, strict=True):
            if run.done < len(run.prompt):
                raise ValueError(f"sequence {q}: its prompt has not finished its prefill")
            if run.done + 1 > self.n_ctx:
                raise ValueError(f"sequence {q}: context full ({run.done + 1} > {self.n_ctx})")
        ids = self._ids(tokens)  # [B]
        self.blocks.grow(seqs, [run.done + 1 for run in runs])  # KvFull: nothing changed
        tables = [np.asarray(self.blocks.table(q), np.intp) for q in seqs]
        tier, moe, a, kv = self.tier, self.moe, self.args, self.kv
        pos = np.array([run.done for run in runs])  # [B]
        x = tier.embed(ids)  # [B, D]
        for i in range(a.n_layer):
            x = kv.decode_attention(tier, i, x, pos, tables)  # each at its own position
            h, logits = tier.router(i, x)  # [B, D], [B, E]
            y = moe(i, h, logits, True, int(pos[0]))  # each expert once for its rows
            if a.shared_ff:
                y = y + tier.shared_expert(i, h)
            x = x + y
        out = tier.output(x)  # [B, V]
        for q, run, t in zip(seqs, runs, ids.tolist(), strict=True):
            run.done += 1
            self.blocks.commit(q, run.done, (t,))
        st = self.engine_stats
        st.tokens += b_n
        st.decode_steps += 1
        self.stats.batch_steps += 1
        self.stats.batch_rows += b_n
        self._count()
        return out

    def release(self, seq: int) -> None:
        self._run(seq)
        self.blocks.release(seq)
        del self._runs[seq]
        self._count()

    # ---- helpers ----
    def position(self, seq: int) -> int:
        """`seq`'s next position (the tokens whose KV rows are written)."""
        return self._run(seq).done

    def _run(self, seq: int) -> _Run:
        run = self._runs.get(seq)
        if run is None:
            raise ValueError(f"sequence {seq} is not admitted")
        return run

    def _ids(self, tokens: Sequence[int]) -> np.ndarray:
        ids = np.asarray(tokens, dtype=np.int64)
        if ids.ndim != 1 or ids.size == 0:
            raise ValueError("need a non-empty 1-D list of token ids")
        if ids.min() < 0 or ids.max() >= self.args.n_vocab:
            raise ValueError(f"token id out of range 0..{self.args.n_vocab - 1}")
        return ids

    def _count(self) -> None:
        self.stats.kv_blocks_used = self.blocks.used
