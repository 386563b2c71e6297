"""Progress bars for work that takes more than a moment (tqdm, on stderr, only on a terminal)."""

from __future__ import annotations

import sys
from contextlib import contextmanager


class _Null:
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
