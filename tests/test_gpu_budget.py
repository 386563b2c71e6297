"""DeviceBudget accounting and device discovery rules: CPU-only (no CuPy, no GPU needed)."""

from __future__ import annotations

import pytest

from strata.gpu import device as dev
from strata.gpu.budget import (
    MIB,
    BudgetError,
    BudgetExceeded,
    DeviceBudget,
)


def test_default_budget_is_10240_mib_with_reserve_and_slack_left_out():
    b = DeviceBudget()
    assert b.total_mib == 10240
    assert b.plannable_bytes == (10240 - b.runtime_reserve_mib - b.slack_mib) * MIB
    assert b.pool_limit_bytes == (10240 - b.runtime_reserve_mib) * MIB
    assert b.free_bytes == b.plannable_bytes


@pytest.mark.parametrize("mib", [1280, 10241, 0, -5])
def test_budget_outside_1281_to_10240_is_refused(mib):
    with pytest.raises(BudgetError, match="1281..10240"):
        DeviceBudget(total_mib=mib)


def test_widened_budget_may_exceed_10240():
    assert DeviceBudget(total_mib=40000, widen=True).total_mib == 40000
    with pytest.raises(BudgetError):
        DeviceBudget(total_mib=1000, widen=True)  # the floor stays


def test_reserve_and_slack_must_leave_room():
    with pytest.raises(BudgetError, match="leaves nothing"):
        DeviceBudget(total_mib=2048, runtime_reserve_mib=1800, slack_mib=248)


def test_reservations_add_up_and_refuse_past_the_budget_naming_the_biggest():
    b = DeviceBudget(total_mib=4096, runtime_reserve_mib=512, slack_mib=256)
    b.reserve("weights", 2000 * MIB)
    b.reserve("kv", 1000 * MIB)
    b.reserve("kv", 100 * MIB)  # a second reservation under the same name adds up
    assert b.reservations == {"weights": 2000 * MIB, "kv": 1100 * MIB}
    assert b.free_bytes == (4096 - 512 - 256 - 3100) * MIB
    with pytest.raises(BudgetExceeded) as e:
        b.reserve("expert_slots", 500 * MIB)
    msg = str(e.value)
    assert "4096 MiB" in msg and "weights 2000 MiB" in msg and "kv 1100 MiB" in msg
    assert "expert_slots" in msg
    assert "expert_slots" not in b.reservations  # a refused reservation leaves no trace
    assert b.release("kv") == 1100 * MIB
    b.reserve("expert_slots", 500 * MIB)


def test_budget_round_trips_through_json():
    b = DeviceBudget(total_mib=8192, runtime_reserve_mib=900, slack_mib=100)
    b.reserve("weights", 123456789)
    b.reserve("workspace", 4242)
    c = DeviceBudget.from_json(b.to_json())
    assert c == b and c.free_bytes == b.free_bytes


class _StubCupy:
    """Just enough of CuPy's pool and allocator hook to test the cap's error path."""

    class cuda:
        class memory:
            class OutOfMemoryError(MemoryError):
                pass

        allocator = None

        class runtime:
            current = 0

            @classmethod
            def getDevice(cls):
                return cls.current

        @classmethod
        def set_allocator(cls, fn):
            cls.allocator = fn

    class _Pool:
        limit = None
        used = 0

        def set_limit(self, size):
            self.limit = size

        def malloc(self, n):
            if self.used + n > self.limit:
                raise _StubCupy.cuda.memory.OutOfMemoryError(f"limit {self.limit}")
            self.used += n
            return n

    pool = _Pool()

    @classmethod
    def get_default_memory_pool(cls):
        return cls.pool


def test_pool_cap_turns_out_of_memory_into_a_budget_error():
    b = DeviceBudget(total_mib=2048, runtime_reserve_mib=512, slack_mib=128)
    b.reserve("weights", 1000 * MIB)
    b.install_pool_cap(_StubCupy)
    assert _StubCupy.pool.limit == 1536 * MIB
    alloc = _StubCupy.cuda.allocator
    alloc(1400 * MIB)
    with pytest.raises(BudgetExceeded, match=r"2048 MiB exceeded.*weights 1000 MiB"):
        alloc(200 * MIB)


def test_an_allocation_on_a_helper_card_names_the_helpers_budget():
    primary = DeviceBudget(total_mib=2048, runtime_reserve_mib=512, slack_mib=128)
    primary.reserve("weights", 1000 * MIB)
    primary.install_pool_cap(_StubCupy)
    _StubCupy.cuda.runtime.current = 1
    try:
        helper = DeviceBudget(total_mib=4096, widen=True)
        helper.reserve("helper_slots", 2000 * MIB)
        helper.install_pool_cap(_StubCupy)
        _StubCupy.pool.used = 0
        with pytest.raises(BudgetExceeded, match=r"4096 MiB exceeded.*helper_slots 2000 MiB"):
            _StubCupy.cuda.allocator(5000 * MIB)
    finally:
        _StubCupy.cuda.runtime.current = 0


# ---- device discovery (no GPU needed) ----
def test_arch_rules():
    assert dev.check_arch("cuda", "sm_90") and dev.check_arch("cuda", "sm_80")
    with pytest.raises(dev.DeviceError, match="8.0 or newer"):
        dev.check_arch("cuda", "sm_75")
    assert dev.check_arch("rocm", "gfx1100") and dev.check_arch("rocm", "gfx1101")
    assert dev.check_arch("rocm", "gfx1030") is False  # allowed, with a warning
    with pytest.raises(dev.DeviceError, match="gfx906 is not supported"):
        dev.check_arch("rocm", "gfx906")


def test_primary_device_refuses_a_negative_ordinal():
    with pytest.raises(dev.DeviceError, match="0 or more"):
        dev.primary_device(-1)


def test_no_cupy_means_no_device_said_once(monkeypatch, capsys):
    monkeypatch.setattr(dev, "import_cupy", lambda: None)
    monkeypatch.setattr(dev, "_said", set())
    assert dev.primary_device() is None
    assert dev.primary_device() is None
    err = capsys.readouterr().err
    assert err.count("using the host tier") == 1
