"""One layer's three expert matrices, checked to fit together, with the layer's expert biases and
activation where the architecture has them (gpt-oss)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from strata.cpu.layout import ExpertMatrix, prepare_tensor

GLU_SILU, GLU_SWIGLU_OAI = 0, 1  # silu(gate) * up; gpt-oss's clamped SwiGLU (phases._act)


def _none() -> np.ndarray:
    return np.zeros((0, 0), np.float32)


@dataclass(frozen=True)
class LayerWeights:
    gate: ExpertMatrix  # [E, F, D]
    up: ExpertMatrix  # [E, F, D]
    down: ExpertMatrix  # [E, D, F]
    expert_nbytes: int = 0
    expert_gguf_bytes: int = 0
    gate_bias: np.ndarray = field(default_factory=_none)  # [E, F] float32; [0, 0]: none
    up_bias: np.ndarray = field(default_factory=_none)  # [E, F]
    down_bias: np.ndarray = field(default_factory=_none)  # [E, D]
    glu: int = GLU_SILU  # the activation between gate/up and down

    def __post_init__(self):
        g, u, d = self.gate, self.up, self.down
        e, f, dim = g.n_expert, g.rows, g.cols
        shapes = [(m.n_expert, m.rows, m.cols) for m in (u, d)]
        if shapes != [(e, f, dim), (e, dim, f)]:
            raise ValueError(
                f"expert shapes do not fit: gate {[e, f, dim]}, up {[u.n_expert, u.rows, u.cols]},"
                f" down {[d.n_expert, d.rows, d.cols]} (want down [E, D, F])"
            )
        if self.gate_bias.size or self.up_bias.size or self.down_bias.size:
            want = [(e, f), (e, f), (e, dim)]
            got = [b.shape for b in (self.gate_bias, self.up_bias, self.down_bias)]
            if got != want or not all(
                b.dtype == np.float32 and b.flags.c_contiguous
                for b in (self.gate_bias, self.up_bias, self.down_bias)
            ):
                raise ValueError(f"expert biases {got} are not float32 C arrays of {want}")
        if self.glu not in (GLU_SILU, GLU_SWIGLU_OAI):
            raise ValueError(f"unknown expert activation {self.glu}")
        mats = (g, u, d)
        # bytes the kernels read for one expert (gate + up + down), and in the GGUF encoding
        object.__setattr__(self, "expert_nbytes", sum(m.expert_nbytes for m in mats))
        object.__setattr__(self, "expert_gguf_bytes", sum(m.expert_gguf_bytes for m in mats))

    @property
    def extras(self) -> tuple:
        """(gate bias, up bias, down bias, glu): what the phases take besides the matrices."""
        return (self.gate_bias, self.up_bias, self.down_bias, self.glu)


def with_extras(lw: LayerWeights, biases=None, glu: int = GLU_SILU) -> LayerWeights:
    """lw with expert biases (gate [E, F], up [E, F], down [E, D]; None: none) and activation."""
    if biases is None:
        return lw if glu == lw.glu else replace(lw, glu=glu)
    gb, ub, db = (np.ascontiguousarray(b, np.float32) for b in biases)
    return replace(lw, gate_bias=gb, up_bias=ub, down_bias=db, glu=glu)


def prepare_layer(gate, up, down, simd: bool | None = None) -> LayerWeights:
    """LayerWeights from three expert tensors (TensorRef-like or ExpertMatrix)."""
    return LayerWeights(*(prepare_tensor(t, simd) for t in (gate, up, down)))
