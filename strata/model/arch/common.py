"""What the architectures share: GGUF tensor names and the attention block's tensors."""

from __future__ import annotations

from gguf.constants import MODEL_TENSOR as MT
from gguf.constants import TENSOR_NAMES

from strata.model.args import ModelArgs


def name(t: MT, layer: int | None = None, suffix: str = "weight") -> str:
    """The tensor's name in a GGUF file, e.g. `blk.3.ffn_down_exps.weight`."""
    return f"{TENSOR_NAMES[t].format(bid=layer)}.{suffix}"


def global_tensors(a: ModelArgs) -> dict[str, tuple[int, ...]]:
    """numpy shapes (ggml ne reversed) of the non-layer tensors; `output` may be tied (absent)."""
    return {
        name(MT.TOKEN_EMBD): (a.n_vocab, a.n_embd),  # [V, D]
        name(MT.OUTPUT_NORM): (a.n_embd,),
        name(MT.OUTPUT): (a.n_vocab, a.n_embd),  # [V, D]
    }


def attention_tensors(a: ModelArgs, i: int) -> dict[str, tuple[int, ...]]:
    return {
        name(MT.ATTN_NORM, i): (a.n_embd,),
        name(MT.ATTN_Q, i): (a.q_dim, a.n_embd),  # [H*Dh, D]
        name(MT.ATTN_K, i): (a.kv_dim, a.n_embd),  # [G*Dh, D]
        name(MT.ATTN_V, i): (a.n_head_kv * a.v_head_dim, a.n_embd),
        name(MT.ATTN_OUT, i): (a.n_embd, a.n_head * a.v_head_dim),
    }


def routed_expert_tensors(a: ModelArgs, i: int) -> dict[str, tuple[int, ...]]:
    """The router and the SwiGLU experts stored as stacked [E, ...] tensors."""
    return {
        name(MT.FFN_NORM, i): (a.n_embd,),
        name(MT.FFN_GATE_INP, i): (a.n_expert, a.n_embd),  # router [E, D]
        name(MT.FFN_GATE_EXP, i): (a.n_expert, a.expert_ff, a.n_embd),  # [E, F, D]
        name(MT.FFN_UP_EXP, i): (a.n_expert, a.expert_ff, a.n_embd),  # [E, F, D]
        name(MT.FFN_DOWN_EXP, i): (a.n_expert, a.n_embd, a.expert_ff),  # [E, D, F]
    }


OPTIONAL = {name(MT.OUTPUT)}  # tied to token_embd when absent
