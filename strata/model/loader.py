"""`load_model(path)`: open a GGUF (file or shard set), read `ModelArgs`, check every tensor."""

from __future__ import annotations

import os
from functools import cached_property

from gguf.constants import MODEL_TENSOR as MT
from gguf.constants import Keys

from strata.model import arch
from strata.model.arch.common import allowed_types, name
from strata.model.errors import (
    BadMetadata,
    MissingTensor,
    ModelError,
    ShapeMismatch,
    TensorTypeError,
)
from strata.model.gguf_file import GGUFModel, TensorRef

EXPERT_TENSORS = (MT.FFN_GATE_EXP, MT.FFN_UP_EXP, MT.FFN_DOWN_EXP)


class Model:
    """A checked, memory-mapped model: `args`, tensors by name, tokenizer and chat template."""

    def __init__(self, gguf: GGUFModel):
        self.gguf = gguf
        try:
            self.args = arch.model_args(gguf.metadata)
        except ModelError as e:  # name the file the metadata came from
            raise type(e)(f"{gguf.path.name}: {e}") from None
        self.arch_module = arch.get(self.args.arch)
        self.aliases = getattr(self.arch_module, "ALIASES", {})  # role -> the name stored
        self._check_layer_count()
        self.expected = self._expected_shapes()
        self._check()

    @property
    def path(self):
        return self.gguf.path

    @property
    def metadata(self):
        return self.gguf.metadata

    def _check_layer_count(self) -> None:
        """block_count must name exactly the layers the file holds: checked before anything
        loops over it (a count of 2^32-1 fails here at once)."""
        ids = set()
        for tname in self.gguf.tensors:
            parts = tname.split(".")
            if parts[0] == "blk" and len(parts) > 1 and parts[1].isdecimal():
                ids.add(int(parts[1]))
        held = max(ids) + 1 if ids else 0
        n = self.args.n_layer + self.args.n_nextn  # block_count: the trunk and NextN layers
        if n != held:
            key = Keys.LLM.BLOCK_COUNT.format(arch=self.args.arch)
            raise BadMetadata(f"{self.path.name}: {key} is {n}, the file holds {held} layers")

    def _expected_shapes(self) -> dict[str, tuple[int, ...]]:
        m, a = self.arch_module, self.args
        shapes = dict(m.global_tensors(a))
        for i in range(a.n_layer + a.n_nextn):
            shapes.update(m.layer_tensors(a, i))
        return shapes

    def _check(self) -> None:
        for tname, shape in self.expected.items():
            t = self.gguf.tensors.get(tname)
            if t is None:
                if tname in self.arch_module.OPTIONAL:
                    continue
                raise MissingTensor(f"{self.path.name}: tensor {tname} is missing")
            if t.shape != shape:
                raise ShapeMismatch(
                    f"{self.path.name}: tensor {tname} has shape {list(t.shape)}, "
                    f"metadata implies {list(shape)}"
                )
            allowed = allowed_types(tname)
            if t.qtype not in allowed:
                kinds = ", ".join(sorted(q.name for q in allowed)) if len(allowed) < 5 else ""
                raise TensorTypeError(
                    f"{self.path.name}: tensor {tname} is {t.qtype.name}, "
                    + (f"{self.args.arch} stores it as {kinds}" if kinds else "not a type for it")
                )
        if hasattr(self.arch_module, "check"):  # what one tensor at a time cannot say
            self.arch_module.check(self)

    def tensor(self, t: MT | str, layer: int | None = None) -> TensorRef:
        tname = t if isinstance(t, str) else name(self.aliases.get(t, t), layer)
        if tname == name(MT.OUTPUT) and tname not in self.gguf.tensors:
            tname = name(MT.TOKEN_EMBD)  # tied embeddings
        return self.gguf.tensors[tname]

    def has(self, tname: str) -> bool:
        return tname in self.gguf.tensors

    @cached_property
    def tokenizer(self):
        from strata.model.tokenizer import Tokenizer

        return Tokenizer.from_metadata(self.gguf.metadata)

    @property
    def chat_template(self) -> str | None:
        return self.gguf.metadata.get(Keys.Tokenizer.CHAT_TEMPLATE)

    # ---- sizes (for inspect, budgets and the bandwidth bound) ----
    def expert_bytes(self, layer: int) -> int:
        """Bytes of ONE expert (gate + up + down) in `layer`."""
        return sum(self.tensor(t, layer).nbytes for t in EXPERT_TENSORS) // self.args.n_expert

    def expert_bytes_per_token(self) -> int:
        """Bytes of routed-expert weights one decode token reads (K experts in every layer)."""
        return sum(self.expert_bytes(i) * self.args.n_expert_used for i in range(self.args.n_layer))

    def total_expert_bytes(self) -> int:
        return sum(self.expert_bytes(i) * self.args.n_expert for i in range(self.args.n_layer))

    def kv_bytes(self, n_ctx: int, kv_type: str = "f16") -> int:
        """K and V for every layer at `n_ctx` positions: f16, or int8 with a float32 scale per
        row (token, KV head; K and V each)."""
        a = self.args
        n_attn = sum(not a.is_recurrent(i) for i in range(a.n_layer))  # DeltaNet layers: none
        rows = n_attn * n_ctx * a.n_head_kv  # per K and per V
        if kv_type == "int8":
            return rows * (a.head_dim + a.v_head_dim + 2 * 4)
        return rows * (a.head_dim + a.v_head_dim) * 2

    def recurrent_bytes(self) -> int:
        """One sequence's DeltaNet states in float32: per DeltaNet layer the conv window
        [Kc-1, C] and the recurrent matrices [Hv, Dk, Dk] (0 without such layers)."""
        a = self.args
        n_rec = sum(a.is_recurrent(i) for i in range(a.n_layer))
        c = 2 * a.ssm_n_group * a.ssm_d_state + a.ssm_d_inner
        per = max(a.ssm_d_conv - 1, 0) * c + a.ssm_dt_rank * a.ssm_d_state**2
        return n_rec * per * 4

    def dense_bytes(self) -> int:
        layers = range(self.args.n_layer + self.args.n_nextn)
        expert = {name(t, i) for i in layers for t in EXPERT_TENSORS}
        return sum(t.nbytes for n, t in self.gguf.tensors.items() if n not in expert)


def load_model(path: str | os.PathLike) -> Model:
    return Model(GGUFModel(path))
