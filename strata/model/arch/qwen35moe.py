"""qwen35moe (the Qwen3.5 MoE models): qwen3next's hybrid layout (strata/model/arch/qwen3next.py)
with three differences, read from llama.cpp's src/models/qwen35moe.cpp:
  - beta and alpha come from two projections, ssm_beta [Hv, D] and ssm_alpha [Hv, D] (not the
    per-key-head interleaved ssm_ba), and the input projections are always split
    (attn_qkv + attn_gate);
  - value head j reads key head j % Hk (tiled), not j // (Hv/Hk);
  - the attention's RoPE is multi-section (rope.dimension_sections, interleaved); for text every
    section has the token's position, which makes it NEOX RoPE over the first n_rot dims.
"""

from __future__ import annotations

from gguf.constants import MODEL_TENSOR as MT

from strata.model.arch import qwen3next
from strata.model.arch.common import global_tensors, name
from strata.model.args import ModelArgs
from strata.model.errors import BadMetadata

ARCH = "qwen35moe"
TRAITS = dict(qwen3next.TRAITS)
V_HEADS_TILED = True
__all__ = ["ARCH", "TRAITS", "OPTIONAL", "global_tensors", "layer_tensors", "check_args"]
_NEXTN_OPTIONAL = ("nextn.embed_tokens.weight", "nextn.shared_head_head.weight",
                   "nextn.shared_head_norm.weight")  # fmt: skip


class _Optional:
    """A tied output head; the NextN block's own embeddings, head and head norm."""

    def __contains__(self, tname: str) -> bool:
        return tname == name(MT.OUTPUT) or tname.endswith(_NEXTN_OPTIONAL)


OPTIONAL = _Optional()


def layer_tensors(a: ModelArgs, i: int) -> dict[str, tuple[int, ...]]:
    t = qwen3next.layer_tensors(a, i)
    if a.is_recurrent(i):
        del t[name(MT.SSM_IN, i)], t[name(MT.SSM_BETA_ALPHA, i)]
        t[name(MT.SSM_BETA, i)] = (a.ssm_dt_rank, a.n_embd)  # [Hv, D] -> sigmoid
        t[name(MT.SSM_ALPHA, i)] = (a.ssm_dt_rank, a.n_embd)  # [Hv, D] -> softplus(. + dt)
    return t


def check_args(a: ModelArgs) -> None:
    if not a.linear_attn:
        raise BadMetadata(f"{ARCH}: the ssm.* keys (DeltaNet sizes) are missing")
