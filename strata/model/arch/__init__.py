"""The architectures Strata runs, keyed by GGUF `general.architecture`.

A new architecture is one module here: `ARCH`, `TRAITS` (the ModelArgs flags it fixes),
`global_tensors(args)`, `layer_tensors(args, i)` and `OPTIONAL`, added to `ARCHS`; `ALIASES`
where it stores a role's tensor under another name (gpt-oss's FFN norm).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from gguf.constants import Keys

from strata.model.arch import gpt_oss, qwen2moe, qwen3moe
from strata.model.args import ModelArgs
from strata.model.errors import UnsupportedArchitecture

ARCHS: dict[str, ModuleType] = {m.ARCH: m for m in (qwen3moe, qwen2moe, gpt_oss)}


def get(arch: str) -> ModuleType:
    """The module of this architecture; UnsupportedArchitecture names the supported ones."""
    if arch not in ARCHS:
        raise UnsupportedArchitecture(
            f"unsupported architecture {arch or '(none)'!r} (supported: {', '.join(ARCHS)})"
        )
    return ARCHS[arch]


def model_args(meta: dict[str, Any], n_vocab_fallback: int | None = None) -> ModelArgs:
    """ModelArgs from GGUF metadata, with the architecture's own traits."""
    arch = str(meta.get(Keys.General.ARCHITECTURE, ""))
    return ModelArgs.from_metadata(meta, arch, get(arch).TRAITS, n_vocab_fallback)
