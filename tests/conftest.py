"""Shared fixtures: synthetic models written once per session, the llama.cpp oracle."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def synth_model(tmp_path_factory):
    """synth_model(shape="tiny", quant="Q4_K", **kw) -> path of a synthetic GGUF (cached)."""
    from strata.model.synth import SynthSpec, make_args, write_synthetic
    from strata.quant import fmt

    cache: dict = {}

    def make(
        shape="tiny",
        quant="Q4_K",
        dense="Q8_0",
        embd="Q8_0",
        arch=None,
        seed=0,
        skew=0.0,
        **overrides,
    ):
        key = (shape, quant, dense, embd, arch, seed, skew, tuple(sorted(overrides.items())))
        if key not in cache:
            args = make_args(shape, arch, **overrides)
            spec = SynthSpec(
                args,
                expert_quant=fmt(quant).qtype,
                dense_quant=fmt(dense).qtype,
                embd_quant=fmt(embd).qtype,
                seed=seed,
                skew=skew,
            )
            out = tmp_path_factory.mktemp("synth") / f"{shape}-{quant}-{seed}.gguf"
            cache[key] = write_synthetic(out, spec, progress=False)[0]
        return cache[key]

    return make


@pytest.fixture(scope="session")
def llama_cpp():
    return pytest.importorskip(
        "llama_cpp", reason="llama-cpp-python (the llama.cpp oracle) missing"
    )


@pytest.fixture(scope="session")
def device():
    """The primary GPU's DeviceInfo; the test skips where CuPy or a usable device is missing."""
    from strata.gpu.device import primary_device

    try:
        info = primary_device()
    except Exception as e:  # an unusable device is a skip here, not a failure
        pytest.skip(f"no usable GPU: {e}")
    if info is None:
        pytest.skip("no GPU")
    return info


@pytest.fixture(scope="session")
def K(device):
    """The kernel loader for the primary GPU, as the engine makes it (its arch: PDL inside
    pdl_scope and thread-block clusters where the card has them)."""
    import cupy as cp

    from strata.gpu.rawmod import Kernels

    return Kernels(cp, device.warp_size, device.sm_count, arch=device.arch)
