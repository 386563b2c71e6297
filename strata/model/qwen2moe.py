"""qwen2moe (Qwen1.5-MoE, Qwen2-57B-A14B): qwen3moe's layout without q/k norm, with q/k/v biases,
no top-K renormalization, and a sigmoid-gated shared expert beside the routed ones.
"""

from __future__ import annotations

from gguf.constants import MODEL_TENSOR as MT

from strata.model import qwen3moe
from strata.model.args import ModelArgs
from strata.model.qwen3moe import global_tensors, name

ARCH = "qwen2moe"
__all__ = ["ARCH", "global_tensors", "layer_tensors", "OPTIONAL"]


def layer_tensors(a: ModelArgs, i: int) -> dict[str, tuple[int, ...]]:
    t = qwen3moe.attention_tensors(a, i)
    t.update(
        {
            name(MT.ATTN_Q, i, "bias"): (a.q_dim,),
            name(MT.ATTN_K, i, "bias"): (a.kv_dim,),
            name(MT.ATTN_V, i, "bias"): (a.n_head_kv * a.v_head_dim,),
            name(MT.FFN_NORM, i): (a.n_embd,),
            name(MT.FFN_GATE_INP, i): (a.n_expert, a.n_embd),  # router [E, D]
            name(MT.FFN_GATE_EXP, i): (a.n_expert, a.expert_ff, a.n_embd),
            name(MT.FFN_UP_EXP, i): (a.n_expert, a.expert_ff, a.n_embd),
            name(MT.FFN_DOWN_EXP, i): (a.n_expert, a.n_embd, a.expert_ff),
            name(MT.FFN_GATE_INP_SHEXP, i): (a.n_embd,),  # shared-expert gate [D] -> sigmoid
            name(MT.FFN_GATE_SHEXP, i): (a.shared_ff, a.n_embd),  # [Fs, D]
            name(MT.FFN_UP_SHEXP, i): (a.shared_ff, a.n_embd),
            name(MT.FFN_DOWN_SHEXP, i): (a.n_embd, a.shared_ff),  # [D, Fs]
        }
    )
    return t


OPTIONAL = qwen3moe.OPTIONAL
