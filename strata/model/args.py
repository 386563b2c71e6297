"""`ModelArgs`: the hyper-parameters of a MoE model, read from GGUF metadata through gguf's keys.

Shape letters used across Strata (defined once here):
  T = tokens in a batch, D = hidden size (n_embd), V = vocab, L = layers,
  H = query heads, G = KV heads, Dh = head dim, E = experts, K = experts used per token,
  F = expert FFN size, Fs = shared-expert FFN size, S = KV positions (sequence so far).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gguf.constants import Keys

from strata.model.errors import ModelError


@dataclass(frozen=True)
class ModelArgs:
    arch: str
    n_vocab: int  # V
    n_embd: int  # D
    n_layer: int  # L
    n_head: int  # H
    n_head_kv: int  # G
    head_dim: int  # Dh (key length)
    v_head_dim: int
    n_expert: int  # E
    n_expert_used: int  # K
    expert_ff: int  # F
    shared_ff: int = 0  # Fs (qwen2moe's shared expert; 0 = none)
    n_ctx_train: int = 4096
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6
    norm_topk: bool = True  # renormalize the K router weights (qwen3moe yes, qwen2moe no)
    qk_norm: bool = True  # per-head RMS norm on q and k (qwen3moe)
    qkv_bias: bool = False  # biases on q, k, v (qwen2moe)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        problems = []
        if self.n_head % max(self.n_head_kv, 1):
            problems.append(
                f"head_count {self.n_head} not a multiple of head_count_kv {self.n_head_kv}"
            )
        if not 0 < self.n_expert_used <= self.n_expert:
            problems.append(f"expert_used_count {self.n_expert_used} not in 1..{self.n_expert}")
        if problems:
            raise ModelError(f"{self.arch}: inconsistent metadata: {'; '.join(problems)}")

    @property
    def q_dim(self) -> int:
        return self.n_head * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_head_kv * self.head_dim

    @classmethod
    def from_metadata(
        cls,
        meta: dict[str, Any],
        arch: str,
        traits: Mapping[str, bool],
        n_vocab_fallback: int | None = None,
    ) -> ModelArgs:
        """Read the `arch.*` keys; `traits` are the architecture's fixed flags
        (strata.model.arch: qk_norm, qkv_bias, shared_expert, norm_topk when metadata is silent)."""

        def get(key: str, default: Any = ModelError) -> Any:
            k = key.format(arch=arch)
            if k in meta:
                return meta[k]
            if default is ModelError:
                raise ModelError(f"{arch}: metadata key {k} is missing")
            return default

        n_embd = int(get(Keys.LLM.EMBEDDING_LENGTH))
        n_head = int(get(Keys.Attention.HEAD_COUNT))
        head_dim = int(get(Keys.Attention.KEY_LENGTH, n_embd // n_head))
        n_vocab = meta.get(Keys.LLM.VOCAB_SIZE.format(arch=arch))
        if n_vocab is None:
            toks = meta.get(Keys.Tokenizer.LIST)
            n_vocab = len(toks) if toks is not None else n_vocab_fallback
        if n_vocab is None:
            raise ModelError(f"{arch}: vocabulary size is unknown (no vocab_size, no token list)")
        shared = traits["shared_expert"]
        return cls(
            arch=arch,
            n_vocab=int(n_vocab),
            n_embd=n_embd,
            n_layer=int(get(Keys.LLM.BLOCK_COUNT)),
            n_head=n_head,
            n_head_kv=int(get(Keys.Attention.HEAD_COUNT_KV, n_head)),
            head_dim=head_dim,
            v_head_dim=int(get(Keys.Attention.VALUE_LENGTH, head_dim)),
            n_expert=int(get(Keys.LLM.EXPERT_COUNT)),
            n_expert_used=int(get(Keys.LLM.EXPERT_USED_COUNT)),
            expert_ff=int(get(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH)),
            shared_ff=int(get(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, 0)) if shared else 0,
            n_ctx_train=int(get(Keys.LLM.CONTEXT_LENGTH, 4096)),
            rope_theta=float(get(Keys.Rope.FREQ_BASE, 10000.0)),
            rms_eps=float(get(Keys.Attention.LAYERNORM_RMS_EPS, 1e-6)),
            norm_topk=bool(get(Keys.LLM.EXPERT_WEIGHTS_NORM, traits["norm_topk"])),
            qk_norm=traits["qk_norm"],
            qkv_bias=traits["qkv_bias"],
        )
