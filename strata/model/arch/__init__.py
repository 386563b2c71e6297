"""The architectures Strata runs, keyed by GGUF `general.architecture`.

A new architecture is one module here: `ARCH`, `TRAITS` (the ModelArgs flags it fixes),
`global_tensors(args)`, `layer_tensors(args, i)` and `OPTIONAL`, added to `ARCHS`; `ALIASES`
where it stores a role's tensor under another name (gpt-oss's FFN norm).
"""

from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import Any

from gguf.constants import Keys

from strata.model.arch import gpt_oss, qwen2moe, qwen3moe, qwen3next, qwen35moe
from strata.model.args import ModelArgs
from strata.model.errors import UnsupportedArchitecture

ARCHS: dict[str, ModuleType] = {
    m.ARCH: m for m in (qwen3moe, qwen2moe, qwen3next, qwen35moe, gpt_oss)
}


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
    mod = get(arch)
    args = ModelArgs.from_metadata(meta, arch, mod.TRAITS, n_vocab_fallback)
    if getattr(mod, "V_HEADS_TILED", False):  # how its DeltaNet value heads share key heads
        args = dataclasses.replace(args, v_heads_tiled=True)
    if hasattr(mod, "check_args"):  # what the architecture needs beyond the common keys
        mod.check_args(args)
    return args
