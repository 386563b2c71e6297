"""The CPU tier: Numba kernels for quantized expert weights and the pool that runs them.

    from strata.cpu import ExpertPool, prepare_layer
    pool = ExpertPool(n_threads=16)
    lw = prepare_layer(gate, up, down)            # [E, F, D], [E, F, D], [E, D, F] tensors
    y = pool.run_layer(x, tok, expert, weight, lw)  # x [T, D] -> [T, D]

Importing this package loads numpy, numba, llvmlite, gguf and strata.quant only (no CuPy, no
engine, no server), so it can be used on its own for quantization experiments.
"""

from strata.cpu.jitcache import guard as _jit_cache_guard

_jit_cache_guard()  # before any cached kernel loads: drop caches a changed source left stale

from strata.cpu.bandwidth import host_read_bandwidth  # noqa: E402
from strata.cpu.kernels.features import force_level, simd_enabled, simd_level  # noqa: E402
from strata.cpu.layout import ExpertMatrix, prepare, prepare_tensor  # noqa: E402
from strata.cpu.pool import ExpertPool, LayerWeights, prepare_layer  # noqa: E402
from strata.cpu.quantize import quantize_act, quantize_q8_0, quantize_q8_K  # noqa: E402

__all__ = [
    "ExpertMatrix",
    "ExpertPool",
    "LayerWeights",
    "force_level",
    "host_read_bandwidth",
    "prepare",
    "prepare_layer",
    "prepare_tensor",
    "quantize_act",
    "quantize_q8_0",
    "quantize_q8_K",
    "simd_enabled",
    "simd_level",
]
