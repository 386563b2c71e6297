"""gpt-oss (gpt-oss-20b, gpt-oss-120b; llama.cpp's LLM_ARCH_OPENAI_MOE): the tensors, with shapes.

Per layer: attention with biases on q, k, v and the output, a learned logit per head added to
the softmax's denominator (`attn_sinks`), NEOX RoPE with YaRN scaling, no q/k norm, sliding-
window (`n_swa`) and full attention alternating (layer i slides where i % 2 == 0 unless the file
says otherwise); the FFN's RMS norm is stored as `post_attention_norm`; a router with a bias,
top-K on its logits and a softmax over the K picked; SwiGLU experts with biases and the clamped
activation of gpt-oss (SWIGLU_OAI: alpha 1.702, limit 7, up + 1).
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

ARCH = "gpt-oss"
# ModelArgs fields this architecture fixes (llama.cpp hard-codes them for LLM_ARCH_OPENAI_MOE)
TRAITS = dict(
    qk_norm=False,
    qkv_bias=True,
    norm_topk=False,
    shared_expert=False,
    o_bias=True,
    attn_sinks=True,
    router_bias=True,
    expert_bias=True,
    gating="softmax_weight",
    ffn_act="swiglu_oai",
    swa_pattern=2,  # the default when the file has no sliding_window_pattern
)
# tensors this architecture stores under another role's name
ALIASES = {MT.FFN_NORM: MT.ATTN_POST_NORM}
__all__ = ["ALIASES", "ARCH", "TRAITS", "OPTIONAL", "global_tensors", "layer_tensors"]


def layer_tensors(a: ModelArgs, i: int) -> dict[str, tuple[int, ...]]:
    t = attention_tensors(a, i)
    t.update(
        {
            name(MT.ATTN_Q, i, "bias"): (a.q_dim,),  # [H*Dh]
            name(MT.ATTN_K, i, "bias"): (a.kv_dim,),  # [G*Dh]
            name(MT.ATTN_V, i, "bias"): (a.n_head_kv * a.v_head_dim,),
            name(MT.ATTN_OUT, i, "bias"): (a.n_embd,),  # [D]
            name(MT.ATTN_SINKS, i): (a.n_head,),  # [H] a logit per head
        }
    )
    experts = routed_expert_tensors(a, i)
    experts[name(MT.ATTN_POST_NORM, i)] = experts.pop(name(MT.FFN_NORM, i))
    t.update(experts)
    t.update(
        {
            name(MT.FFN_GATE_INP, i, "bias"): (a.n_expert,),  # [E]
            name(MT.FFN_GATE_EXP, i, "bias"): (a.n_expert, a.expert_ff),  # [E, F]
            name(MT.FFN_UP_EXP, i, "bias"): (a.n_expert, a.expert_ff),  # [E, F]
            name(MT.FFN_DOWN_EXP, i, "bias"): (a.n_expert, a.n_embd),  # [E, D]
        }
    )
    return t
