"""scripts/profile_decode.py report: ncu's CSV log (a real one, cut to its first launches) into the
per-kernel table."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = Path(__file__).parent / "fixtures" / "ncu_decode_head.csv"


@pytest.fixture
def prof(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import profile_decode

    return profile_decode


def _want() -> list[tuple[str, float]]:
    """(name, us) per launch, read independently of the script (the ns column, commas removed)."""
    with open(FIXTURE, newline="") as f:
        rows = [r for r in csv.reader(f) if r and r[0] != "ID" and not r[0].startswith("==")]
    return [(r[4], float(r[-1].replace(",", "")) / 1e3) for r in rows]


def test_rows_skip_the_profiler_lines_and_convert_units(prof):
    got = prof._ncu_rows(str(FIXTURE))
    assert [n for n, _ in got] == [n for n, _ in _want()]
    assert [u for _, u in got] == pytest.approx([u for _, u in _want()])


def test_report_groups_by_kernel_and_compares_with_the_step(prof, capsys):
    want = _want()
    tokens, step_ms = 2, 0.05
    assert (
        prof.main(["report", str(FIXTURE), "--tokens", str(tokens), "--step-ms", str(step_ms)]) == 0
    )
    out = capsys.readouterr().out.splitlines()
    total = sum(u for _, u in want) / tokens
    assert out[0] == f"{len(want)} kernels over {tokens} tokens; kernel time {total:.1f} us/token"
    gap = step_ms * 1e3 - total
    assert out[1].startswith(f"measured step {step_ms * 1e3:.1f} us: {gap:.1f} us/token outside")
    by = {}
    for n, u in want:
        by.setdefault(n, []).append(u)
    first = max(by, key=lambda n: sum(by[n]))  # the table is sorted by time per token
    row = out[3].split()
    assert row[0] == first[:44]
    assert float(row[1]) == pytest.approx(len(by[first]) / tokens)
    assert float(row[3]) == pytest.approx(sum(by[first]) / tokens, abs=0.05)
    assert len(out) == 3 + len(by)


def test_report_refuses_a_log_without_kernels(prof, tmp_path, capsys):
    empty = tmp_path / "empty.csv"
    empty.write_text("==PROF== Disconnected from process 1\n")
    assert prof.main(["report", str(empty)]) == 1
    assert "no kernel rows" in capsys.readouterr().err
