"""Pick the device tier: `CupyTier` on the primary GPU when there is one, else `HostTier`.

    tier = make_tier(model, n_ctx, vram_budget_mib=None, expert_slots="auto", device="auto")

`kv_type` ("f16" or "int8") picks the KV cache's element type on either tier; `prefill_stage`
staging slots let a prompt's missed experts run on the tier (`experts_staged`); `host_dense`
("float", "quant" or "auto") how the host tier computes its dense matrices (HostTier's `dense`).

`device="auto"` falls back to the host tier (said once) where CuPy or a GPU is missing;
`device="gpu"` refuses instead; `device="host"` never touches CuPy.
"""

from __future__ import annotations

from strata.gpu.device import DeviceError, primary_device, say_once
from strata.model.loader import Model


def make_tier(
    model: Model,
    n_ctx: int,
    vram_budget_mib: int | None = None,
    expert_slots: int | str = "auto",
    device: str = "auto",
    widen_budget: bool = False,
    kv_type: str = "f16",
    prefill_stage: int = 0,
    host_dense: str = "float",
):
    if device not in ("auto", "gpu", "host"):
        raise ValueError(f"device must be auto, gpu or host, not {device!r}")
    if device != "host":
        info = primary_device()
        if info is not None:
            from strata.gpu.budget import DeviceBudget
            from strata.gpu.cupy_tier import CupyTier

            budget = DeviceBudget.from_env(total_mib=vram_budget_mib, widen=widen_budget)
            say_once(f"GPU tier on {info.describe()}, VRAM budget {budget.total_mib} MiB")
            return CupyTier(
                model,
                n_ctx,
                budget,
                expert_slots=expert_slots,
                device=info,
                kv_type=kv_type,
                prefill_stage=prefill_stage,
            )
        if device == "gpu":
            raise DeviceError("--device gpu: no usable GPU (CuPy and a CUDA/ROCm device needed)")
    from strata.gpu.host import HostTier

    return HostTier(
        model, n_ctx=n_ctx, kv_type=kv_type, prefill_stage=prefill_stage, dense=host_dense
    )
