"""The kernel sources carry no build knobs: no `STRATA_*` name (a user setting) and no
`#ifndef X / #define X` default a `-D` could override, but the build target's warp size, which
the launcher passes (rawmod.py) and common.cuh defaults."""

from __future__ import annotations

import re

import pytest

from strata.gpu.source import SOURCES, expand

_DEFAULT = re.compile(r"^\s*#\s*ifndef\s+([A-Z0-9_]+)\s*\n\s*#\s*define\s+\1\b", re.M)


@pytest.mark.parametrize("source", SOURCES)
def test_kernel_sources_have_no_knobs(source):
    text = expand(source)
    assert re.findall(r"\bSTRATA_[A-Z0-9_]+", text) == []
    assert _DEFAULT.findall(text) == ["WARP_SIZE"]
