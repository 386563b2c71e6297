"""One layer's three expert matrices, checked to fit together."""

from __future__ import annotations

from dataclasses import dataclass

from strata.cpu.layout import ExpertMatrix, prepare_tensor


@dataclass(frozen=True)
class LayerWeights:
    gate: ExpertMatrix  # [E, F, D]
    up: ExpertMatrix  # [E, F, D]
    down: ExpertMatrix  # [E, D, F]
    expert_nbytes: int = 0
    expert_gguf_bytes: int = 0

    def __post_init__(self):
        g, u, d = self.gate, self.up, self.down
        e, f, dim = g.n_expert, g.rows, g.cols
        shapes = [(m.n_expert, m.rows, m.cols) for m in (u, d)]
        if shapes != [(e, f, dim), (e, dim, f)]:
            raise ValueError(
                f"expert shapes do not fit: gate {[e, f, dim]}, up {[u.n_expert, u.rows, u.cols]},"
                f" down {[d.n_expert, d.rows, d.cols]} (want down [E, D, F])"
            )
        mats = (g, u, d)
        # bytes the kernels read for one expert (gate + up + down), and in the GGUF encoding
        object.__setattr__(self, "expert_nbytes", sum(m.expert_nbytes for m in mats))
        object.__setattr__(self, "expert_gguf_bytes", sum(m.expert_gguf_bytes for m in mats))


def prepare_layer(gate, up, down, simd: bool | None = None) -> LayerWeights:
    """LayerWeights from three expert tensors (TensorRef-like or ExpertMatrix)."""
    return LayerWeights(*(prepare_tensor(t, simd) for t in (gate, up, down)))
