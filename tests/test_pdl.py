"""The PDL launcher's host side without a GPU: argument bytes as CuPy passes them, the launch
attribute, where PDL is supported."""

from __future__ import annotations

import numpy as np
import pytest

from strata.gpu import pdl


class _Dev:  # a device array as the launcher sees one: .data.ptr
    def __init__(self, ptr):
        self.data = type("M", (), {"ptr": ptr})()


def test_param_bytes_follow_cupys_conversions():
    rng = np.random.default_rng()
    p = int(rng.integers(1, 2**48))
    assert pdl.Launcher._param(_Dev(p)).tobytes() == np.uint64(p).tobytes()
    assert pdl.Launcher._param(None).tobytes() == bytes(8)
    v = int(rng.integers(-(2**31), 2**31))
    assert pdl.Launcher._param(np.int32(v)).tobytes() == np.int32(v).tobytes()
    assert pdl.Launcher._param(v).tobytes() == np.int64(v).tobytes()  # Python int: 8 bytes
    f = float(rng.standard_normal())
    assert pdl.Launcher._param(np.float32(f)).tobytes() == np.float32(f).tobytes()
    assert pdl.Launcher._param(f).tobytes() == np.float64(f).tobytes()
    with pytest.raises(TypeError, match="str"):
        pdl.Launcher._param("x")


def test_supported_needs_cuda_sm90_and_a_new_driver():
    def cp(hip=False, driver=13000):
        rt = type("RT", (), {"is_hip": hip, "driverGetVersion": staticmethod(lambda: driver)})
        return type("CP", (), {"cuda": type("C", (), {"runtime": rt})})

    assert pdl.supported(cp(), "sm_90")
    assert pdl.supported(cp(), "sm_100")
    assert not pdl.supported(cp(), "sm_89")
    assert not pdl.supported(cp(driver=12020), "sm_90")
    assert not pdl.supported(cp(hip=True), "gfx1100")


def test_launch_attribute_is_programmatic_serialization():
    """cuLaunchKernelEx's attribute list: the programmatic-serialization flag (CUlaunchAttributeID
    6, cuda.h) set to 1."""
    arr = pdl.Launcher.pdl_attrs()
    assert len(arr) == 1 and (arr[0].id, tuple(arr[0].value[:2])) == (6, (1, 0))
