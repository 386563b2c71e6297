"""`ModelArgs`: the hyper-parameters of a MoE model, read from GGUF metadata through gguf's keys.

Shape letters used across Strata (defined once here):
  T = tokens in a batch, D = hidden size (n_embd), V = vocab, L = layers,
  H = query heads, G = KV heads, Dh = head dim, E = experts, K = experts used per token,
  F = expert FFN size, Fs = shared-expert FFN size, S = KV positions (sequence so far).
Hybrid linear attention (qwen3next's gated DeltaNet layers):
  Hk = linear-attention key heads (ssm_n_group), Hv = value heads (ssm_dt_rank),
  Dk = their head dim (ssm_d_state, also the value head dim), C = conv channels 2*Hk*Dk + Hv*Dk,
  Kc = conv kernel (ssm_d_conv).

Fields past `qkv_bias` are the pieces of newer architectures (gpt-oss, qwen3next); each default
means "absent", so an architecture that never sets them reads as before.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gguf.constants import Keys

from strata.model.errors import BadMetadata, ModelError

# the fields every model needs at >= 1 (each is divided by, looped over or sized by somewhere),
# with the key a message names
_COUNTS = {
    "n_vocab": Keys.LLM.VOCAB_SIZE,
    "n_embd": Keys.LLM.EMBEDDING_LENGTH,
    "n_layer": Keys.LLM.BLOCK_COUNT,
    "n_head": Keys.Attention.HEAD_COUNT,
    "n_head_kv": Keys.Attention.HEAD_COUNT_KV,
    "head_dim": Keys.Attention.KEY_LENGTH,
    "v_head_dim": Keys.Attention.VALUE_LENGTH,
    "n_expert": Keys.LLM.EXPERT_COUNT,
    "n_expert_used": Keys.LLM.EXPERT_USED_COUNT,
    "expert_ff": Keys.LLM.EXPERT_FEED_FORWARD_LENGTH,
    "n_ctx_train": Keys.LLM.CONTEXT_LENGTH,
}
_REALS = {"rope_theta": Keys.Rope.FREQ_BASE, "rms_eps": Keys.Attention.LAYERNORM_RMS_EPS}
MAX_COUNT = 2**31 - 1  # every count and dimension fits an int32 index

# router gating: softmax over all E logits, top-K of the probabilities (qwen3moe, qwen2moe), or
# top-K of the logits, then a softmax over the K picked (gpt-oss; llama.cpp's SOFTMAX_WEIGHT)
GATINGS = ("softmax", "softmax_weight")
# expert activation: silu(gate) * up, or gpt-oss's clamped SwiGLU (llama.cpp's SWIGLU_OAI)
FFN_ACTS = ("silu", "swiglu_oai")
SWIGLU_OAI_ALPHA = 1.702  # llama.cpp hard-codes both (build_moe_ffn, LLM_FFN_SWIGLU_OAI_MOE)
SWIGLU_OAI_LIMIT = 7.0
ROPE_SCALINGS = ("none", "linear", "yarn")
MAX_LAYERS = 1 << 16  # a per-layer pattern is spelled out; no model comes near


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
    o_bias: bool = False  # a bias on the attention output (gpt-oss)
    attn_sinks: bool = False  # a learned logit per head in the softmax's denominator [H]
    router_bias: bool = False  # a bias on the router logits [E]
    expert_bias: bool = False  # biases on each expert's gate, up [E, F] and down [E, D]
    gating: str = "softmax"  # GATINGS
    ffn_act: str = "silu"  # FFN_ACTS
    sliding_window: int = 0  # n_swa: a sliding layer's query sees its last n_swa positions
    swa_layers: tuple[bool, ...] = ()  # per layer: sliding (True) or full attention
    rope_scaling: str = "none"  # ROPE_SCALINGS
    rope_factor: float = 1.0  # context scale factor (llama.cpp's 1 / freq_scale)
    rope_orig_ctx: int = 0  # YaRN's original context (0: n_ctx_train)
    rope_attn_factor: float = 1.0  # extra magnitude scale of cos/sin
    yarn_beta_fast: float = 32.0  # YaRN ramp ends (llama.cpp's defaults; gpt-oss files omit them)
    yarn_beta_slow: float = 1.0
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    # hybrid linear attention (qwen3next); every 0 / () means "absent"
    ssm_d_conv: int = 0  # Kc
    ssm_d_inner: int = 0  # Hv * Dk
    ssm_d_state: int = 0  # Dk
    ssm_n_group: int = 0  # Hk
    ssm_dt_rank: int = 0  # Hv
    full_attn_interval: int = 0  # every n-th layer is full attention (with ssm_*)
    recurrent_layers: tuple[bool, ...] = ()  # per layer, from the file; () = by the interval
    n_rot: int = 0  # RoPE'd dims of a head (0: all, head_dim)
    n_nextn: int = 0  # NextN/MTP layers stored after the L trunk layers (a forward skips them)
    v_heads_tiled: bool = False  # value head j reads key head j % Hk (qwen35moe); else j // (Hv/Hk)
    rope_sections: tuple[int, ...] = ()  # multi-section RoPE (qwen35moe); text: all one position

    def __post_init__(self) -> None:
        problems = []
        for name, key in _COUNTS.items():
            v = getattr(self, name)
            if not 1 <= v <= MAX_COUNT:
                problems.append(f"{key.format(arch=self.arch)} = {v} is not in 1..{MAX_COUNT}")
        if not 0 <= self.shared_ff <= MAX_COUNT:
            key = Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH.format(arch=self.arch)
            problems.append(f"{key} = {self.shared_ff} is not in 0..{MAX_COUNT}")
        for name, key in _REALS.items():
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                problems.append(f"{key.format(arch=self.arch)} = {v} is not a finite number > 0")
        if problems:
            raise BadMetadata(f"{self.arch}: invalid metadata: {'; '.join(problems)}")
        if self.n_head % self.n_head_kv:
            problems.append(
                f"head_count {self.n_head} not a multiple of head_count_kv {self.n_head_kv}"
            )
        if not 0 < self.n_expert_used <= self.n_expert:
            problems.append(f"expert_used_count {self.n_expert_used} not in 1..{self.n_expert}")
        problems += _hybrid_problems(self)
        if self.swa_layers and len(self.swa_layers) != self.n_layer:
            problems.append(
                f"sliding_window_pattern names {len(self.swa_layers)} layers, not {self.n_layer}"
            )
        if not 0 <= self.sliding_window <= MAX_COUNT:
            problems.append(f"sliding_window {self.sliding_window} is not in 0..{MAX_COUNT}")
        elif any(self.swa_layers) and self.sliding_window < 1:
            problems.append(f"sliding layers with a sliding_window of {self.sliding_window}")
        if self.gating not in GATINGS or self.ffn_act not in FFN_ACTS:
            problems.append(f"gating {self.gating!r} / activation {self.ffn_act!r} unknown")
        if self.rope_scaling not in ROPE_SCALINGS:
            problems.append(f"rope scaling {self.rope_scaling!r} not one of {ROPE_SCALINGS}")
        elif not (math.isfinite(self.rope_factor) and self.rope_factor > 0):
            problems.append(f"rope scaling factor {self.rope_factor} is not > 0")
        if problems:
            raise ModelError(f"{self.arch}: inconsistent metadata: {'; '.join(problems)}")

    @property
    def linear_attn(self) -> bool:
        """Whether some layers are gated DeltaNet (linear attention) layers."""
        return self.ssm_d_state > 0

    def is_recurrent(self, i: int) -> bool:
        """Whether trunk layer i is a DeltaNet layer (else full attention)."""
        if not self.linear_attn or i >= self.n_layer:
            return False
        if self.recurrent_layers:
            return bool(self.recurrent_layers[i])
        return (i + 1) % self.full_attn_interval != 0

    @property
    def rope_dims(self) -> int:
        return self.n_rot or self.head_dim

    @property
    def q_dim(self) -> int:
        return self.n_head * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_head_kv * self.head_dim

    def is_swa(self, layer: int) -> bool:
        """Whether `layer` attends over a sliding window of `sliding_window` positions."""
        return bool(self.swa_layers) and self.swa_layers[layer]

    def window(self, layer: int) -> int:
        """Positions a query of `layer` sees (itself included); 0 = every earlier one."""
        return self.sliding_window if self.is_swa(layer) else 0

    @classmethod
    def from_metadata(
        cls,
        meta: dict[str, Any],
        arch: str,
        traits: Mapping[str, bool],
        n_vocab_fallback: int | None = None,
    ) -> ModelArgs:
        """Read the `arch.*` keys; `traits` are the architecture's fixed flags
        (strata.model.arch: qk_norm, qkv_bias, shared_expert, norm_topk when metadata is silent;
        the newer fields' names where the architecture has them, and `swa_pattern`, the period
        of sliding layers when the file has no sliding_window_pattern)."""

        def get(key: str, default: Any = ModelError) -> Any:
            k = key.format(arch=arch)
            if k in meta:
                return meta[k]
            if default is ModelError:
                raise ModelError(f"{arch}: metadata key {k} is missing")
            return default

        def count(key: str, default: Any = ModelError) -> int:
            """An integer key (a bool or a string is refused, not read as 1 or parsed)."""
            v = get(key, default)
            if type(v) is not int:
                raise BadMetadata(
                    f"{arch}: {key.format(arch=arch)} = {_short(v)} is not an integer"
                )
            return v

        def real(key: str, default: float) -> float:
            v = get(key, default)
            if type(v) not in (int, float):
                raise BadMetadata(f"{arch}: {key.format(arch=arch)} = {_short(v)} is not a number")
            return float(v)

        n_embd = count(Keys.LLM.EMBEDDING_LENGTH)
        n_head = count(Keys.Attention.HEAD_COUNT)
        if n_head < 1:  # the head dim's default divides by it
            raise BadMetadata(f"{arch}: {Keys.Attention.HEAD_COUNT.format(arch=arch)} is {n_head}")
        head_dim = count(Keys.Attention.KEY_LENGTH, n_embd // n_head)
        n_vocab = meta.get(Keys.LLM.VOCAB_SIZE.format(arch=arch))
        if n_vocab is None:
            toks = meta.get(Keys.Tokenizer.LIST)
            n_vocab = len(toks) if isinstance(toks, list) else n_vocab_fallback
        if n_vocab is None:
            raise ModelError(f"{arch}: vocabulary size is unknown (no vocab_size, no token list)")
        if type(n_vocab) is not int:
            raise BadMetadata(f"{arch}: vocab_size = {_short(n_vocab)} is not an integer")
        shared = traits["shared_expert"]
        norm_topk = get(Keys.LLM.EXPERT_WEIGHTS_NORM, traits["norm_topk"])
        if type(norm_topk) is not bool:
            key = Keys.LLM.EXPERT_WEIGHTS_NORM.format(arch=arch)
            raise BadMetadata(f"{arch}: {key} = {_short(norm_topk)} is not a bool")
        hybrid = _hybrid_fields(meta, arch, get, count)
        newer = {k: traits[k] for k in _NEWER if k in traits}
        if "swa_pattern" in traits:
            newer.update(_sliding(get, count, arch, traits["swa_pattern"]))
            newer.update(_rope_scaling(get, count, real, arch))
        return cls(
            arch=arch,
            n_vocab=n_vocab,
            n_embd=n_embd,
            n_layer=count(Keys.LLM.BLOCK_COUNT) - hybrid.get("n_nextn", 0),
            n_head=n_head,
            n_head_kv=count(Keys.Attention.HEAD_COUNT_KV, n_head),
            head_dim=head_dim,
            v_head_dim=count(Keys.Attention.VALUE_LENGTH, head_dim),
            n_expert=count(Keys.LLM.EXPERT_COUNT),
            n_expert_used=count(Keys.LLM.EXPERT_USED_COUNT),
            expert_ff=count(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH),
            shared_ff=count(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, 0) if shared else 0,
            n_ctx_train=count(Keys.LLM.CONTEXT_LENGTH, 4096),
            rope_theta=real(Keys.Rope.FREQ_BASE, 10000.0),
            rms_eps=real(Keys.Attention.LAYERNORM_RMS_EPS, 1e-6),
            norm_topk=norm_topk,
            qk_norm=traits["qk_norm"],
            qkv_bias=traits["qkv_bias"],
            **hybrid,
            **newer,
        )


# gguf 0.19 has no constant for it; llama.cpp's LLM_KV_ATTENTION_RECURRENT_LAYERS
RECURRENT_LAYERS_KEY = getattr(
    Keys.Attention, "RECURRENT_LAYERS", "{arch}.attention.recurrent_layers"
)


def _hybrid_fields(meta: Mapping[str, Any], arch: str, get, count) -> dict[str, Any]:
    """The linear-attention keys of a hybrid model (present when ssm.state_size is); {} else."""
    if Keys.SSM.STATE_SIZE.format(arch=arch) not in meta:
        return {}
    n_nextn = count(Keys.LLM.NEXTN_PREDICT_LAYERS, 0)
    kw = dict(
        ssm_d_conv=count(Keys.SSM.CONV_KERNEL),
        ssm_d_inner=count(Keys.SSM.INNER_SIZE),
        ssm_d_state=count(Keys.SSM.STATE_SIZE),
        ssm_n_group=count(Keys.SSM.GROUP_COUNT),
        ssm_dt_rank=count(Keys.SSM.TIME_STEP_RANK),
        full_attn_interval=count(Keys.LLM.FULL_ATTENTION_INTERVAL, 4),
        n_rot=count(Keys.Rope.DIMENSION_COUNT, 0),
        n_nextn=n_nextn,
    )
    sections = get(Keys.Rope.DIMENSION_SECTIONS, None)
    if sections is not None:
        if not isinstance(sections, list) or any(type(v) is not int for v in sections):
            key = Keys.Rope.DIMENSION_SECTIONS.format(arch=arch)
            raise BadMetadata(f"{arch}: {key} = {_short(sections)} is not a list of integers")
        kw["rope_sections"] = tuple(sections)
    rec = get(RECURRENT_LAYERS_KEY, None)
    if rec is not None:
        if not isinstance(rec, list) or any(type(r) not in (bool, int) for r in rec):
            key = RECURRENT_LAYERS_KEY.format(arch=arch)
            raise BadMetadata(f"{arch}: {key} = {_short(rec)} is not a list of bools")
        kw["recurrent_layers"] = tuple(bool(r) for r in rec)
    return kw


def _hybrid_problems(a: ModelArgs) -> list[str]:
    """What is inconsistent in the linear-attention sizes (none when they are absent)."""
    if not a.linear_attn:
        return [] if a.n_nextn == 0 else [f"nextn_predict_layers {a.n_nextn} without ssm sizes"]
    p = []
    for n in ("ssm_d_conv", "ssm_d_inner", "ssm_d_state", "ssm_n_group", "ssm_dt_rank"):
        if not 1 <= getattr(a, n) <= MAX_COUNT:
            p.append(f"{n} = {getattr(a, n)} is not in 1..{MAX_COUNT}")
    if p:
        return p
    if a.ssm_dt_rank % a.ssm_n_group:
        p.append(f"ssm time_step_rank {a.ssm_dt_rank} not a multiple of group_count")
    if a.ssm_d_inner != a.ssm_dt_rank * a.ssm_d_state:
        p.append(f"ssm inner_size {a.ssm_d_inner} != time_step_rank x state_size")
    if not 1 <= a.full_attn_interval <= MAX_COUNT:
        p.append(f"full_attention_interval {a.full_attn_interval} is not >= 1")
    if not 0 <= a.n_rot <= a.head_dim or a.n_rot % 2:
        p.append(f"rope dimension_count {a.n_rot} not an even number in 0..{a.head_dim}")
    if not 0 <= a.n_nextn < MAX_COUNT or a.n_layer < 1:
        p.append(f"nextn_predict_layers {a.n_nextn} leaves {a.n_layer} trunk layers")
    if a.rope_sections and (min(a.rope_sections) < 0 or 2 * sum(a.rope_sections) > a.rope_dims):
        p.append(f"rope dimension_sections {list(a.rope_sections)} exceed {a.rope_dims} dims")
    if a.recurrent_layers and len(a.recurrent_layers) < a.n_layer:
        p.append(f"recurrent_layers has {len(a.recurrent_layers)} entries for {a.n_layer} layers")
    return p


# ModelArgs fields an architecture's TRAITS may fix beyond the four every one names
_NEWER = ("o_bias", "attn_sinks", "router_bias", "expert_bias", "gating", "ffn_act")


def _sliding(get, count, arch: str, default_period: int) -> dict[str, Any]:
    """sliding_window and the sliding layers: the file's sliding_window_pattern (a bool per
    layer, or a period n: layer i slides unless i % n == n - 1), else `default_period`
    (llama.cpp's set_swa_pattern; period 0: every layer slides)."""
    n_layer = count(Keys.LLM.BLOCK_COUNT)
    pattern = get(Keys.Attention.SLIDING_WINDOW_PATTERN, default_period)
    key = Keys.Attention.SLIDING_WINDOW_PATTERN.format(arch=arch)
    if isinstance(pattern, list):
        if not all(type(b) is bool for b in pattern):
            raise BadMetadata(f"{arch}: {key} = {_short(pattern)} is not a list of bools")
        layers = tuple(pattern)
    elif not 0 < n_layer <= MAX_LAYERS:
        key = Keys.LLM.BLOCK_COUNT.format(arch=arch)
        raise BadMetadata(f"{arch}: {key} = {n_layer} is not in 1..{MAX_LAYERS}")
    elif type(pattern) is int and 0 <= pattern <= MAX_COUNT:
        layers = swa_period_layers(pattern, n_layer)
    else:
        raise BadMetadata(f"{arch}: {key} = {_short(pattern)} is not a period or a list")
    return dict(sliding_window=count(Keys.Attention.SLIDING_WINDOW), swa_layers=layers)


def swa_period_layers(period: int, n_layer: int) -> tuple[bool, ...]:
    """llama.cpp's set_swa_pattern: layer i slides unless i % period == period - 1 (0: all)."""
    return tuple(period == 0 or i % period < period - 1 for i in range(n_layer))


def _rope_scaling(get, count, real, arch: str) -> dict[str, Any]:
    """RoPE scaling as llama.cpp reads it: type (default linear), factor (0 or absent: 1),
    YaRN's original context and attention factor."""
    kind = get(Keys.Rope.SCALING_TYPE, "linear")
    if kind not in ROPE_SCALINGS:
        key = Keys.Rope.SCALING_TYPE.format(arch=arch)
        raise BadMetadata(f"{arch}: {key} = {_short(kind)} is not one of {ROPE_SCALINGS}")
    factor = real(Keys.Rope.SCALING_FACTOR, 0.0)
    return dict(
        rope_scaling=kind,
        rope_factor=factor if factor != 0.0 else 1.0,
        rope_orig_ctx=count(Keys.Rope.SCALING_ORIG_CTX_LEN, 0),
        rope_attn_factor=real(Keys.Rope.SCALING_ATTN_FACTOR, 1.0),
    )


def _short(v: Any) -> str:
    """A metadata value for a one-line message (a long list or string is cut)."""
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."
