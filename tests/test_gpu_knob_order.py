"""Every compile-time knob of the kernel sources is read only after its default is defined: a
`#if STRATA_X` above `#ifndef STRATA_X / #define STRATA_X d` reads an undefined X as 0, so a
default build silently takes the 0 arm (as STRATA_SIGN_SPREAD did until session 20)."""

from __future__ import annotations

import re

import pytest

from strata.gpu.source import SOURCES, expand

_DEFAULT = re.compile(r"^\s*#\s*ifndef\s+(STRATA_[A-Z0-9_]+)\s*\n\s*#\s*define\s+\1\b", re.M)
_COND = re.compile(r"^\s*#\s*(?:if|elif)\b(.*)$", re.M)
_NAME = re.compile(r"\bSTRATA_[A-Z0-9_]+\b")
_DEFINED = re.compile(r"\bdefined\s*\(?\s*STRATA_[A-Z0-9_]+\s*\)?")


def _reads_before_default(text: str) -> list[str]:
    first_default = {}
    for m in _DEFAULT.finditer(text):
        first_default.setdefault(m.group(1), m.start())
    bad = []
    for m in _COND.finditer(text):
        for name in _NAME.findall(_DEFINED.sub("", m.group(1))):
            at = first_default.get(name)
            if at is not None and m.start() < at:
                line = text.count("\n", 0, m.start()) + 1
                bad.append(f"line {line}: {m.group(0).strip()} (default of {name} below)")
    return bad


@pytest.mark.parametrize("source", SOURCES)
def test_knobs_are_read_after_their_defaults(source):
    assert _reads_before_default(expand(source)) == []


def test_the_check_finds_a_read_above_its_default():
    text = "#if STRATA_K\nint a;\n#endif\n#ifndef STRATA_K\n#define STRATA_K 1\n#endif\n"
    assert len(_reads_before_default(text)) == 1
    assert _reads_before_default(text.replace("#if STRATA_K", "#if defined(STRATA_K)")) == []
