"""qwen3moe (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B): the tensors the architecture needs, with shapes.

Per layer: attention with per-head q/k RMS norm and NEOX RoPE; a softmax router over E experts,
top-K renormalized; SwiGLU experts stored as stacked [E, ...] tensors.
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

ARCH = "qwen3moe"
# ModelArgs flags this architecture fixes (norm_topk: the default when metadata is silent)
TRAITS = dict(qk_norm=True, qkv_bias=False, norm_topk=True, shared_expert=False)
__all__ = ["ARCH", "TRAITS", "OPTIONAL", "global_tensors", "layer_tensors", "name"]


def layer_tensors(a: ModelArgs, i: int) -> dict[str, tuple[int, ...]]:
    t = attention_tensors(a, i)
    t[name(MT.ATTN_Q_NORM, i)] = (a.head_dim,)
    t[name(MT.ATTN_K_NORM, i)] = (a.head_dim,)
    t.update(routed_expert_tensors(a, i))
    return t
