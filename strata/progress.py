"""Progress bars for work that takes more than a moment (tqdm, on stderr, only on a terminal)."""

from __future__ import annotations

import sys
from contextlib import contextmanager


class _Null:
    total = 0

    def update(self, n: int = 1) -> None:
        pass


@contextmanager
def bar(total: int, desc: str, enabled: bool = True, unit: str = "it"):
    if not enabled or not sys.stderr.isatty():
        yield _Null()
        return
    from tqdm import tqdm

    scale = unit == "B"
    with tqdm(
        total=total,
        desc=desc,
        unit=unit,
        unit_scale=scale,
        unit_divisor=1024 if scale else 1000,
        leave=False,
        file=sys.stderr,
    ) as pb:
        yield pb


@contextmanager
def reporter(desc: str, enabled: bool = True, unit: str = "it"):
    """A `progress(done, total)` callable drawing a bar, for code that counts its own work (the
    CPU tier's loading, the pack writer) and must not import this module."""
    with bar(0, desc, enabled, unit) as pb:
        seen = 0

        def report(done: int, total: int) -> None:
            nonlocal seen
            if pb.total != total:
                pb.total = total
            pb.update(done - seen)
            seen = done

        yield report
