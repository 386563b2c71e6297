"""qwen2moe (Qwen1.5-MoE, Qwen2-57B-A14B): qwen3moe's layout without q/k norm, with q/k/v biases,
no top-K renormalization, and a sigmoid-gated shared expert beside the routed ones.
"""

from __future__ import annotations

from gguf.constants import MODEL_TENSOR as MT

from strata.model.arch.common import (
    OPTIONAL,
    attention_tensors,
    global_tensors,
    name,
    routed_expert_tensors,
)
from strata.model.args import ModelArgs

ARCH = "qwen2moe"
TRAITS = dict(qk_norm=False, qkv_bias=True, norm_topk=False, shared_expert=True)
__all__ = ["ARCH", "TRAITS", "OPTIONAL", "global_tensors", "layer_tensors"]


def layer_tensors(a: ModelArgs, i: int) -> dict[str, tuple[int, ...]]:
    t = attention_tensors(a, i)
    t.update(
        {
            name(MT.ATTN_Q, i, "bias"): (a.q_dim,),
            name(MT.ATTN_K, i, "bias"): (a.kv_dim,),
            name(MT.ATTN_V, i, "bias"): (a.n_head_kv * a.v_head_dim,),
        }
    )
    t.update(routed_expert_tensors(a, i))
    t.update(
        {
            name(MT.FFN_GATE_INP_SHEXP, i): (a.n_embd,),  # shared-expert gate [D] -> sigmoid
            name(MT.FFN_GATE_SHEXP, i): (a.shared_ff, a.n_embd),  # [Fs, D]
            name(MT.FFN_UP_SHEXP, i): (a.shared_ff, a.n_embd),
            name(MT.FFN_DOWN_SHEXP, i): (a.n_embd, a.shared_ff),  # [D, Fs]
        }
    )
    return t
