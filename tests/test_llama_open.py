"""strata.bench.llama_open: the AMX check and --peer-extra-bufts, on written cpuinfo files."""

from __future__ import annotations

import pytest

from strata.bench.llama_open import host_has_amx, peer_extra_bufts

AMX = "processor\t: 0\nflags\t\t: fpu sse avx512f avx512_vnni amx_bf16 amx_tile amx_int8\n"
PLAIN = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_vnni\n"


@pytest.mark.parametrize("text,amx", [(AMX, True), (PLAIN, False), ("", False)])
def test_host_has_amx_reads_the_flags(tmp_path, text, amx):
    f = tmp_path / "cpuinfo"
    f.write_text(text)
    assert host_has_amx(f) is amx


def test_host_has_amx_is_false_where_cpuinfo_cannot_be_read(tmp_path):
    assert host_has_amx(tmp_path / "missing") is False


@pytest.mark.parametrize(
    "value,text,survive,want",
    [("auto", AMX, False, False), ("auto", AMX, True, True), ("auto", PLAIN, False, True),
     ("1", AMX, False, True), ("0", PLAIN, True, False)],
)  # fmt: skip
def test_peer_extra_bufts(tmp_path, value, text, survive, want):
    """auto probes only on an AMX CPU; 1 and 0 never probe."""
    f = tmp_path / "cpuinfo"
    f.write_text(text)
    probed = []
    assert peer_extra_bufts(value, f, lambda: probed.append(1) or survive) is want
    assert bool(probed) == (value == "auto" and text == AMX)


def test_peer_extra_bufts_is_a_bench_flag():
    from strata.bench.__main__ import build_parser

    ap = build_parser()
    assert ap.parse_args(["--arm", "llama-cpp"]).peer_extra_bufts == "auto"
    assert ap.parse_args(["--arm", "llama-cpp", "--peer-extra-bufts", "0"]).peer_extra_bufts == "0"
    with pytest.raises(SystemExit):
        ap.parse_args(["--arm", "llama-cpp", "--peer-extra-bufts", "yes"])


@pytest.mark.llama
def test_the_probe_matches_an_eval_in_a_child(llama_cpp):
    """extra_bufts_survive on this host: True where the AMX buffers work or the CPU has none."""
    import subprocess
    import sys

    from strata.bench.llama_open import _PROBE, extra_bufts_survive

    r = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, check=False)
    assert extra_bufts_survive() is (r.returncode == 0)


def test_peer_extra_bufts_refuses_other_values(tmp_path):
    with pytest.raises(ValueError, match="--peer-extra-bufts"):
        peer_extra_bufts("yes", tmp_path / "x")


@pytest.mark.llama
def test_llama_cpp_arm_runs_on_this_host(llama_cpp):
    """The bench's llama.cpp arm on the embedded model (with the extra buffer types as auto picks
    for this CPU): it runs to the end and says which it used."""
    from strata.bench.common import EMBEDDED_MODEL
    from strata.bench.peer import NO_EXTRA, run_llama_cpp_arm

    r = run_llama_cpp_arm(EMBEDDED_MODEL, 8, 4, 1, 2)
    assert r["extra_bufts"] is peer_extra_bufts()
    assert r["decode_tps"] > 0 and r["prefill_tps"] > 0
    assert (NO_EXTRA in r["notices"]) is not r["extra_bufts"]
