"""qwen3next (Qwen3-Next-80B-A3B): a hybrid of gated DeltaNet and gated full attention, with MoE.

Trunk layer i is a DeltaNet (linear attention) layer unless (i + 1) % full_attention_interval == 0
(or as `attention.recurrent_layers` says). Every layer: attn_norm -> mixer -> +res ->
post_attention_norm -> MoE (softmax top-K renormalized) + a sigmoid-gated shared expert -> +res.
  DeltaNet: attn_qkv -> causal conv1d (kernel Kc, state Kc-1 columns) -> SiLU -> q, k L2-normed,
            decay g = ssm_a * softplus(alpha + dt_bias), beta = sigmoid(b) from ssm_ba; the gated
            delta rule per value head; RMS norm (ssm_norm) times SiLU(attn_gate x); ssm_out.
            (Older converters stored attn_qkv and attn_gate fused, per key head, as ssm_in.)
  attention: attn_q gives per head [q (Dh), gate (Dh)]; q/k RMS norm; NEOX RoPE over the first
            n_rot dims; softmax attention; times sigmoid(gate); attn_output.
The NextN (MTP) block lives in the n_nextn layers after the trunk: a full attention block plus
eh_proj [D, 2D], enorm, hnorm (and optionally its own embeddings and head). A forward skips it.
"""

from __future__ import annotations

from gguf.constants import MODEL_TENSOR as MT
from gguf.constants import TENSOR_NAMES

from strata.model.arch.common import global_tensors, name
from strata.model.args import ModelArgs
from strata.model.errors import BadMetadata, MissingTensor

ARCH = "qwen3next"
TRAITS = dict(qk_norm=True, qkv_bias=False, norm_topk=True, shared_expert=True)
__all__ = ["ARCH", "TRAITS", "OPTIONAL", "global_tensors", "layer_tensors", "check", "check_args"]

# a DeltaNet layer's input projections: the split form (attn_qkv + attn_gate) or the legacy
# fused one (ssm_in); `check` asks for one of the two
_SPLIT = ("attn_qkv.weight", "attn_gate.weight")
_LEGACY = "ssm_in.weight"
_NEXTN_OPTIONAL = ("nextn.embed_tokens.weight", "nextn.shared_head_head.weight",
                   "nextn.shared_head_norm.weight")  # fmt: skip


class _Optional:
    """The tensors a file may omit: a tied output head, one of the two DeltaNet input forms,
    the NextN block's own embeddings / head / head norm."""

    def __contains__(self, tname: str) -> bool:
        return tname == name(MT.OUTPUT) or tname.endswith((*_SPLIT, _LEGACY, *_NEXTN_OPTIONAL))


OPTIONAL = _Optional()


def ssm_a_name(i: int) -> str:
    """`blk.i.ssm_a`: the one tensor name without a .weight suffix."""
    return TENSOR_NAMES[MT.SSM_A].format(bid=i)


def conv_channels(a: ModelArgs) -> int:
    """C: the conv1d's channels, q and k (Hk*Dk each) then v (Hv*Dk)."""
    return 2 * a.ssm_n_group * a.ssm_d_state + a.ssm_d_inner


def deltanet_tensors(a: ModelArgs, i: int) -> dict[str, tuple[int, ...]]:
    d, c, hv, dk = a.n_embd, conv_channels(a), a.ssm_dt_rank, a.ssm_d_state
    return {
        name(MT.ATTN_QKV, i): (c, d),  # [C, D]
        name(MT.ATTN_GATE, i): (a.ssm_d_inner, d),  # z [Hv*Dk, D]
        name(MT.SSM_IN, i): (c + a.ssm_d_inner, d),  # legacy: per key head [q, k, v, z]
        name(MT.SSM_CONV1D, i): (c, a.ssm_d_conv),  # [C, Kc]
        name(MT.SSM_DT, i, "bias"): (hv,),
        ssm_a_name(i): (hv,),  # -exp(A_log)
        name(MT.SSM_BETA_ALPHA, i): (2 * hv, d),  # per key head [b (Hv/Hk), a (Hv/Hk)]
        name(MT.SSM_NORM, i): (dk,),
        name(MT.SSM_OUT, i): (d, a.ssm_d_inner),  # [D, Hv*Dk]
    }


def attention_tensors(a: ModelArgs, i: int) -> dict[str, tuple[int, ...]]:
    d = a.n_embd
    return {
        name(MT.ATTN_Q, i): (2 * a.q_dim, d),  # per head [q (Dh), gate (Dh)]: [2*H*Dh, D]
        name(MT.ATTN_K, i): (a.kv_dim, d),  # [G*Dh, D]
        name(MT.ATTN_V, i): (a.n_head_kv * a.v_head_dim, d),
        name(MT.ATTN_OUT, i): (d, a.n_head * a.v_head_dim),
        name(MT.ATTN_Q_NORM, i): (a.head_dim,),
        name(MT.ATTN_K_NORM, i): (a.head_dim,),
    }


def moe_tensors(a: ModelArgs, i: int) -> dict[str, tuple[int, ...]]:
    d = a.n_embd
    return {
        name(MT.FFN_GATE_INP, i): (a.n_expert, d),  # router [E, D]
        name(MT.FFN_GATE_EXP, i): (a.n_expert, a.expert_ff, d),  # [E, F, D]
        name(MT.FFN_UP_EXP, i): (a.n_expert, a.expert_ff, d),  # [E, F, D]
        name(MT.FFN_DOWN_EXP, i): (a.n_expert, d, a.expert_ff),  # [E, D, F]
        name(MT.FFN_GATE_INP_SHEXP, i): (d,),  # shared-expert gate [D] -> sigmoid
        name(MT.FFN_GATE_SHEXP, i): (a.shared_ff, d),  # [Fs, D]
        name(MT.FFN_UP_SHEXP, i): (a.shared_ff, d),
        name(MT.FFN_DOWN_SHEXP, i): (d, a.shared_ff),  # [D, Fs]
    }


def layer_tensors(a: ModelArgs, i: int) -> dict[str, tuple[int, ...]]:
    """Layer i's tensors; i in [L, L + n_nextn) is a NextN block."""
    d = a.n_embd
    t = {name(MT.ATTN_NORM, i): (d,), name(MT.ATTN_POST_NORM, i): (d,)}
    t.update(deltanet_tensors(a, i) if a.is_recurrent(i) else attention_tensors(a, i))
    t.update(moe_tensors(a, i))
    if i >= a.n_layer:
        t.update(
            {
                name(MT.NEXTN_EH_PROJ, i): (d, 2 * d),  # [D, 2D]: [enorm(e), hnorm(h)] -> D
                name(MT.NEXTN_ENORM, i): (d,),
                name(MT.NEXTN_HNORM, i): (d,),
                name(MT.NEXTN_EMBED_TOKENS, i): (a.n_vocab, d),
                name(MT.NEXTN_SHARED_HEAD_HEAD, i): (a.n_vocab, d),
                name(MT.NEXTN_SHARED_HEAD_NORM, i): (d,),
            }
        )
    return t


def uses_split_qkv(has, i: int) -> bool:
    """Whether DeltaNet layer i stores attn_qkv + attn_gate (else the legacy ssm_in)."""
    return has(name(MT.ATTN_QKV, i))


def check_args(a: ModelArgs) -> None:
    """qwen3next is a hybrid: its ssm.* sizes are not optional (llama.cpp requires them too)."""
    if not a.linear_attn:
        raise BadMetadata(f"{ARCH}: the ssm.* keys (DeltaNet sizes) are missing")


def check(model) -> None:
    """Every DeltaNet layer holds one of its two input-projection forms."""
    a = model.args
    for i in range(a.n_layer):
        if not a.is_recurrent(i):
            continue
        split = [model.has(name(t, i)) for t in (MT.ATTN_QKV, MT.ATTN_GATE)]
        if not all(split) and not model.has(name(MT.SSM_IN, i)):
            raise MissingTensor(
                f"{model.path.name}: layer {i} has neither attn_qkv + attn_gate nor ssm_in"
            )
