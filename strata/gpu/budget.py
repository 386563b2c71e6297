"""`DeviceBudget`: every byte of device memory Strata uses, by name, under one budget.

Reservations (weights, kv, expert_slots, workspace, ...) are planned up front against
`total - runtime_reserve - slack`; the runtime reserve is what the CUDA/HIP context, modules and
libraries take outside CuPy's pool, the slack a margin inside the pool for transient arrays.
`install_pool_cap()` then caps CuPy's memory pool at `total - runtime_reserve` and routes every
CuPy allocation through an allocator that turns the pool's out-of-memory error into a
`BudgetExceeded` naming the budget and the biggest reservations: never a silent overrun.

The accounting is plain Python (serializable, testable without a GPU); only the cap needs CuPy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

MIB = 1 << 20
DEFAULT_BUDGET_MIB = 10240
MIN_BUDGET_MIB = 1281
MAX_BUDGET_MIB = 10240  # unless widened (--vram-budget-mib above it needs widen=True)
# what the CUDA/HIP context, modules and libraries take outside CuPy's pool, and a margin inside
# it for transient arrays
RUNTIME_RESERVE_MIB = 1024
SLACK_MIB = 256


class BudgetError(ValueError):
    """A budget that cannot be used as given (out of range, reserve larger than the budget)."""


class BudgetExceeded(MemoryError):
    """A reservation or an allocation past the budget."""


@dataclass
class DeviceBudget:
    total_mib: int = DEFAULT_BUDGET_MIB
    runtime_reserve_mib: int = RUNTIME_RESERVE_MIB
    slack_mib: int = SLACK_MIB
    widen: bool = False  # allow a total above MAX_BUDGET_MIB
    reservations: dict[str, int] = field(default_factory=dict)  # name -> bytes

    def __post_init__(self) -> None:
        hi = None if self.widen else MAX_BUDGET_MIB
        if self.total_mib < MIN_BUDGET_MIB or (hi is not None and self.total_mib > hi):
            rng = f"{MIN_BUDGET_MIB}..{MAX_BUDGET_MIB}"
            more = "" if self.widen else " (widen the budget to go above)"
            raise BudgetError(
                f"VRAM budget {self.total_mib} MiB is outside the accepted {rng} MiB{more}"
            )
        if self.runtime_reserve_mib < 0 or self.slack_mib < 0:
            raise BudgetError("VRAM runtime reserve and slack must be 0 MiB or more")
        if self.runtime_reserve_mib + self.slack_mib >= self.total_mib:
            raise BudgetError(
                f"VRAM budget {self.total_mib} MiB leaves nothing after the runtime reserve "
                f"({self.runtime_reserve_mib} MiB) and slack ({self.slack_mib} MiB)"
            )

    # ---- sizes ----
    @property
    def total_bytes(self) -> int:
        return self.total_mib * MIB

    @property
    def pool_limit_bytes(self) -> int:
        """What CuPy's pool may hold: the budget less what the runtime takes outside it."""
        return (self.total_mib - self.runtime_reserve_mib) * MIB

    @property
    def plannable_bytes(self) -> int:
        return (self.total_mib - self.runtime_reserve_mib - self.slack_mib) * MIB

    @property
    def reserved_bytes(self) -> int:
        return sum(self.reservations.values())

    @property
    def free_bytes(self) -> int:
        return self.plannable_bytes - self.reserved_bytes

    # ---- reservations ----
    def reserve(self, name: str, nbytes: int) -> int:
        """Add `nbytes` to reservation `name` (created on first use); refuses past the budget."""
        nbytes = int(nbytes)
        if nbytes < 0:
            raise ValueError(f"reservation {name!r}: negative size {nbytes}")
        if nbytes > self.free_bytes:
            raise BudgetExceeded(
                f"{self.describe_exceeded(nbytes)}: reserving {nbytes / MIB:.1f} MiB for "
                f"{name!r} with {max(self.free_bytes, 0) / MIB:.1f} MiB free"
            )
        self.reservations[name] = self.reservations.get(name, 0) + nbytes
        return nbytes

    def release(self, name: str) -> int:
        return self.reservations.pop(name, 0)

    def biggest(self, n: int = 3) -> list[tuple[str, int]]:
        entries = dict(self.reservations)
        entries["runtime_reserve"] = self.runtime_reserve_mib * MIB
        entries["slack"] = self.slack_mib * MIB
        return sorted(entries.items(), key=lambda kv: -kv[1])[:n]

    def describe_exceeded(self, asked: int | None = None) -> str:
        top = ", ".join(f"{k} {v / MIB:.0f} MiB" for k, v in self.biggest())
        return f"VRAM budget of {self.total_mib} MiB exceeded (biggest reservations: {top})"

    def table(self) -> str:
        rows = [f"VRAM budget {self.total_mib} MiB"]
        for k, v in self.biggest(len(self.reservations) + 2):
            rows.append(f"  {k:16} {v / MIB:10.1f} MiB")
        rows.append(f"  {'free':16} {self.free_bytes / MIB:10.1f} MiB")
        return "\n".join(rows)

    # ---- serialization ----
    def to_dict(self) -> dict:
        return {
            "total_mib": self.total_mib,
            "runtime_reserve_mib": self.runtime_reserve_mib,
            "slack_mib": self.slack_mib,
            "widen": self.widen,
            "reservations": dict(self.reservations),
        }

    @classmethod
    def from_dict(cls, d: dict) -> DeviceBudget:
        b = cls(
            total_mib=int(d["total_mib"]),
            runtime_reserve_mib=int(d.get("runtime_reserve_mib", RUNTIME_RESERVE_MIB)),
            slack_mib=int(d.get("slack_mib", SLACK_MIB)),
            widen=bool(d.get("widen", False)),
        )
        for k, v in d.get("reservations", {}).items():
            b.reserve(k, int(v))
        return b

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, s: str) -> DeviceBudget:
        return cls.from_dict(json.loads(s))

    # ---- the CuPy pool cap ----
    def install_pool_cap(self, cp=None) -> None:
        """Cap CuPy's default pool on the current device at `pool_limit_bytes` and make every
        CuPy allocation that would pass it raise `BudgetExceeded` with the description of the
        budget of the device it was made on (a helper card has its own: `_BY_DEVICE`)."""
        if cp is None:
            import cupy as cp
        pool = cp.get_default_memory_pool()
        pool.set_limit(size=self.pool_limit_bytes)  # CuPy's limit is the current device's
        dev = int(cp.cuda.runtime.getDevice())
        _BY_DEVICE[dev] = self
        oom = cp.cuda.memory.OutOfMemoryError
        budget = self

        def malloc(size: int):
            try:
                return pool.malloc(size)
            except oom as e:
                b = _BY_DEVICE.get(int(cp.cuda.runtime.getDevice()), budget)
                raise BudgetExceeded(
                    f"{b.describe_exceeded(size)}: allocating {size / MIB:.1f} MiB "
                    f"failed ({' '.join(str(e).split())})"
                ) from None

        cp.cuda.set_allocator(malloc)


# device ordinal -> the budget capping its pool (the allocator is one for the process)
_BY_DEVICE: dict[int, DeviceBudget] = {}
