"""Kernel build options (host side, no device): STRATA_KERNEL_DEFINES joins a Kernels' -D knobs."""

from __future__ import annotations

import pytest

from strata.gpu.rawmod import Kernels


def test_kernel_defines_from_env_join_the_build_options(monkeypatch):
    monkeypatch.setenv("STRATA_KERNEL_DEFINES", "-DSTRATA_FAST_DECODE=0  -DSTRATA_SMEM_GRID=0")
    k = Kernels(None, 64, 4, ("-DSTRATA_FMT_MASK=3ull",))
    assert k.options() == ("-DWARP_SIZE=64", "-DSTRATA_FMT_MASK=3ull",
                           "-DSTRATA_FAST_DECODE=0", "-DSTRATA_SMEM_GRID=0")  # fmt: skip
    monkeypatch.delenv("STRATA_KERNEL_DEFINES")
    assert Kernels(None, 32).options() == ("-DWARP_SIZE=32",)


@pytest.mark.parametrize("bad", ["-O3", "-DFOO=1", "-DSTRATA_X=1;rm", "--use_fast_math"])
def test_kernel_defines_refuse_anything_but_strata_knobs(monkeypatch, bad):
    monkeypatch.setenv("STRATA_KERNEL_DEFINES", f"-DSTRATA_FAST_DECODE=0 {bad}")
    with pytest.raises(ValueError, match="STRATA_KERNEL_DEFINES"):
        Kernels(None, 32)
