"""What the architectures share: GGUF tensor names, the attention block's tensors and the types
each kind of tensor may have."""

from __future__ import annotations

from gguf.constants import MODEL_TENSOR as MT
from gguf.constants import TENSOR_NAMES, GGMLQuantizationType

from strata.model.args import ModelArgs
from strata.quant import MODEL_TYPES, fmt

QT = GGMLQuantizationType
# norms, biases and routers stay in a float type in every GGUF (llama.cpp never quantizes them)
VECTOR_TYPES = frozenset({QT.F32, QT.F16, QT.BF16})
MATRIX_TYPES = frozenset(MODEL_TYPES)
EXPERT_TYPES = frozenset(q for q in MODEL_TYPES if fmt(q).can_hold_experts)
TENSOR_TYPES: dict[MT, frozenset[QT]] = {
    MT.TOKEN_EMBD: MATRIX_TYPES,
    MT.OUTPUT: MATRIX_TYPES,
    MT.OUTPUT_NORM: VECTOR_TYPES,
    MT.ATTN_NORM: VECTOR_TYPES,
    MT.ATTN_Q: MATRIX_TYPES,
    MT.ATTN_K: MATRIX_TYPES,
    MT.ATTN_V: MATRIX_TYPES,
    MT.ATTN_OUT: MATRIX_TYPES,
    MT.ATTN_Q_NORM: VECTOR_TYPES,
    MT.ATTN_K_NORM: VECTOR_TYPES,
    MT.FFN_NORM: VECTOR_TYPES,
    MT.ATTN_POST_NORM: VECTOR_TYPES,  # gpt-oss's FFN norm
    MT.ATTN_SINKS: VECTOR_TYPES,
    MT.FFN_GATE_INP: VECTOR_TYPES,  # the router
    MT.FFN_GATE_EXP: EXPERT_TYPES,
    MT.FFN_UP_EXP: EXPERT_TYPES,
    MT.FFN_DOWN_EXP: EXPERT_TYPES,
    MT.FFN_GATE_INP_SHEXP: VECTOR_TYPES,
    MT.FFN_GATE_SHEXP: MATRIX_TYPES,
    MT.FFN_UP_SHEXP: MATRIX_TYPES,
    MT.FFN_DOWN_SHEXP: MATRIX_TYPES,
}
_BY_BASE = {TENSOR_NAMES[t].replace("blk.{bid}.", ""): t for t in TENSOR_TYPES}


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


def allowed_types(tname: str) -> frozenset[QT]:
    """The types tensor `tname` may have: a bias is a vector whatever its matrix may be."""
    parts = tname.split(".")
    base = parts[2] if parts[0] == "blk" and len(parts) == 4 else parts[0]
    if parts[-1] == "bias":
        return VECTOR_TYPES
    return TENSOR_TYPES.get(_BY_BASE.get(base), MATRIX_TYPES)
