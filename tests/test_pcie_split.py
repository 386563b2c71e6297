"""The PCIe split rule of decode misses (strata/engine/pcie_split.py): how many of a window's
missed experts go over the link so that the pool and the card finish together."""

from __future__ import annotations

import numpy as np
import pytest

from strata.engine.pcie_split import PoolClock, pcie_count, pcie_count_reference


def test_the_split_equals_trying_every_count():
    rng = np.random.default_rng(47)
    for _ in range(2000):
        n, most = int(rng.integers(0, 12)), int(rng.integers(0, 12))
        p, g, link = rng.uniform(1e-6, 1e-3, 3)
        assert pcie_count(n, p, g, link, most) == pcie_count_reference(n, p, g, link, most)


@pytest.mark.parametrize(
    ("n", "pool_us", "gather_us", "link_us", "want"),
    [
        (6, 30.0, 5.0, 30.0, 3),  # the link as fast as the pool: half each
        (6, 60.0, 5.0, 30.0, 4),  # a pool twice as slow: two thirds to the card
        (6, 30.0, 30.0, 10.0, 0),  # gathering costs the host what the pool does: no upload
        (4, 10.0, 1.0, 90.0, 0),  # a slow link: everything in the pool
        (1, 30.0, 1.0, 20.0, 1),  # one miss: the card finishes first
        (0, 30.0, 1.0, 20.0, 0),
    ],
)  # fmt: skip
def test_split_for_given_rates(n, pool_us, gather_us, link_us, want):
    assert pcie_count(n, pool_us, gather_us, link_us, most=8) == want


def test_no_more_than_the_staging_slots():
    assert pcie_count(8, 100.0, 1.0, 1.0, most=2) == 2


def test_pool_clock_smooths_seconds_per_expert():
    c = PoolClock()
    c.add(1.0, 0)
    assert c.s_per_expert is None
    c.add(4e-4, 4)
    assert c.s_per_expert == pytest.approx(1e-4)
    c.add(2e-4, 1)
    assert c.s_per_expert == pytest.approx(1e-4 + 0.1 * 1e-4)
