"""Kernel build options (host side, no device): the device's warp size, and nothing else."""

from __future__ import annotations

import pytest

from strata.gpu.rawmod import Kernels


@pytest.mark.parametrize("warp", [32, 64])
def test_build_options_are_the_warp_size_only(warp):
    assert Kernels(None, warp, 4).options() == (f"-DWARP_SIZE={warp}",)
