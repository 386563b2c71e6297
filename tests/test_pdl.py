"""The PDL launcher's host side without a GPU: argument bytes as CuPy passes them, the launch
attributes of each (PDL, cluster) form, the switch."""

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


def test_switch(monkeypatch):
    monkeypatch.delenv("STRATA_GPU_PDL", raising=False)
    assert pdl.enabled_by_env()
    monkeypatch.setenv("STRATA_GPU_PDL", "0")
    assert not pdl.enabled_by_env()
    monkeypatch.setenv("STRATA_GPU_PDL", "maybe")
    with pytest.raises(ValueError, match="STRATA_GPU_PDL"):
        pdl.enabled_by_env()


def test_supported_needs_cuda_sm90_and_a_new_driver():
    def cp(hip=False, driver=13000):
        rt = type("RT", (), {"is_hip": hip, "driverGetVersion": staticmethod(lambda: driver)})
        return type("CP", (), {"cuda": type("C", (), {"runtime": rt})})

    assert pdl.supported(cp(), "sm_90")
    assert pdl.supported(cp(), "sm_100")
    assert not pdl.supported(cp(), "sm_89")
    assert not pdl.supported(cp(driver=12020), "sm_90")
    assert not pdl.supported(cp(hip=True), "gfx1100")


def test_env_switch(monkeypatch):
    from strata.gpu.device import env_switch

    monkeypatch.delenv("STRATA_GPU_ROUTED_AHEAD", raising=False)
    assert env_switch("STRATA_GPU_ROUTED_AHEAD") and not env_switch("STRATA_X_UNSET", False)
    for v, want in (("0", False), ("off", False), ("1", True), (" ON ", True)):
        monkeypatch.setenv("STRATA_GPU_ROUTED_AHEAD", v)
        assert env_switch("STRATA_GPU_ROUTED_AHEAD") is want
    monkeypatch.setenv("STRATA_GPU_ROUTED_AHEAD", "yes please")
    with pytest.raises(ValueError, match="STRATA_GPU_ROUTED_AHEAD='yes please'"):
        env_switch("STRATA_GPU_ROUTED_AHEAD")


@pytest.mark.parametrize("use_pdl,cluster", [(True, None), (False, (8, 1, 1)), (True, (16, 1, 1))])
def test_launch_attributes_of_each_form(use_pdl, cluster):
    """cuLaunchKernelEx's attribute list: the programmatic-serialization flag and/or the cluster
    shape (CUlaunchAttributeID 6 / 4, cuda.h), one array per form, reused by later launches."""
    la = pdl.Launcher.__new__(pdl.Launcher)  # no driver: only the host-side tables
    la._attrs = {}
    arr, n = la._attr_array(use_pdl, cluster)
    got = [(arr[i].id, tuple(arr[i].value[:3])) for i in range(n)]
    want = [(6, (1, 0, 0))] if use_pdl else []
    want += [(4, cluster)] if cluster else []
    assert got == want
    assert la._attr_array(use_pdl, cluster)[0] is arr
