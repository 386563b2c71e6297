"""What `strata synth` writes beyond a plain MoE model for hybrid linear-attention models
(qwen3next): the ssm / interval / rope / NextN keys, the tensors' types and their values where a
random normal would not do (a negative decay rate, a conv kernel kept in F32).
"""

from __future__ import annotations

import gguf
import numpy as np
from gguf.constants import GGMLQuantizationType

from strata.model.args import ModelArgs

QT = GGMLQuantizationType
SKIP = "skip"  # a tensor the file may omit and synth does not write
# decay per token exp(ssm_a * softplus(.)) in about [0.5, 0.99]: the state remembers a few tokens
SSM_A_RANGE = (0.02, 0.5)


def plan(tname: str, shape: tuple[int, ...], dense: QT) -> tuple[QT, float] | str | None:
    """(type, std) of a hybrid-only tensor, SKIP for one synth leaves out, None: the default."""
    parts = tname.split(".")
    if len(parts) == 3 and parts[2] == "ssm_a":
        return QT.F32, -1.0  # values: see `values`
    base = ".".join(parts[2:-1])
    if base in ("ssm_in", "nextn.embed_tokens", "nextn.shared_head_head"):
        return SKIP  # the split attn_qkv + attn_gate form; the trunk's embeddings and head
    if base == "nextn.shared_head_norm":
        return SKIP
    if base == "ssm_conv1d":
        return QT.F32, 1.0 / np.sqrt(shape[-1])  # llama.cpp's ssm_conv reads F32 only
    if base in ("nextn.enorm", "nextn.hnorm"):
        return QT.F32, 0.0  # a norm weight
    if base == "nextn.eh_proj":
        return dense, 1.0 / np.sqrt(shape[-1])
    return None


def values(tname: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray | None:
    """Values for a tensor whose distribution is not a scaled normal; None: the default."""
    if tname.endswith(".ssm_a"):
        return -rng.uniform(*SSM_A_RANGE, size=shape).astype(np.float32)
    return None


def add_metadata(w: gguf.GGUFWriter, a: ModelArgs) -> None:
    """The keys llama.cpp's qwen3next / qwen35moe loaders read besides the plain MoE ones."""
    w.add_ssm_conv_kernel(a.ssm_d_conv)
    w.add_ssm_inner_size(a.ssm_d_inner)
    w.add_ssm_state_size(a.ssm_d_state)
    w.add_ssm_group_count(a.ssm_n_group)
    w.add_ssm_time_step_rank(a.ssm_dt_rank)
    w.add_full_attention_interval(a.full_attn_interval)
    w.add_rope_dimension_count(a.rope_dims)
    if a.rope_sections:
        w.add_rope_dimension_sections(list(a.rope_sections))
    if a.n_nextn:
        w.add_nextn_predict_layers(a.n_nextn)
