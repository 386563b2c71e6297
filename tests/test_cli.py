"""The `strata` command line: bad input is one line and exit 2; generate, inspect and synth work."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from gguf.constants import GGMLQuantizationType as QT

from strata.cli.main import main
from strata.model import synth
from strata.model.synth import SynthSpec, make_args, write_synthetic
from strata.quant import fmt
from tests.gguf_edit import BAD_MODEL_CASES, assemble_set, bad_models
from tests.strata_cli import run_strata

REPO = Path(__file__).resolve().parents[1]
STEM = "tiny"


def _write(dir_: Path, split: int = 0, quant: QT = QT.IQ3_XXS) -> Path:
    dir_.mkdir(parents=True)
    spec = SynthSpec(make_args("tiny"), expert_quant=quant, split_max_tensors=split)
    return write_synthetic(dir_ / f"{STEM}.gguf", spec, progress=False)[0]


@pytest.fixture(scope="session")
def cli_models(tmp_path_factory) -> SimpleNamespace:
    """A tiny model, and every kind of bad model file made from it (written once)."""
    root = tmp_path_factory.mktemp("cli")
    ns = SimpleNamespace(tiny=_write(root / "tiny"))
    ns.bad = {k: b.path for k, b in bad_models(ns.tiny, root / "bad").items()}
    split10 = sorted((_write(root / "s10", split=10)).parent.glob("*.gguf"))
    split9 = sorted((_write(root / "s9", split=9)).parent.glob("*.gguf"))
    q4k7 = sorted((_write(root / "q4k7", split=7, quant=QT.Q4_K)).parent.glob("*.gguf"))
    ns.bad["missing_shard"] = assemble_set(root / "gap", STEM, [split10[0], None, split10[2]])
    ns.bad["mixed_sets"] = assemble_set(root / "mix", STEM, [split10[0], split9[1], split10[2]])
    ns.bad["mixed_quants"] = assemble_set(root / "mixq", STEM, [split10[0], q4k7[1], split10[2]])
    ns.bad["no_such_file"] = root / "nowhere.gguf"
    return ns


def _run(capsys, argv: list[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def _assert_one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("strata: error: "), err
    return lines[0]


BAD_CASES = [*BAD_MODEL_CASES, "missing_shard", "mixed_sets", "mixed_quants", "no_such_file"]


# ---- bad input: exit 2, one line on stderr, nothing on stdout ----


@pytest.mark.parametrize("case", BAD_CASES)
def test_inspect_of_a_bad_model_exits_2_with_one_error_line(cli_models, capsys, case):
    path = cli_models.bad[case]
    rc, out, err = _run(capsys, ["inspect", str(path)])
    assert rc == 2
    assert out == ""
    line = _assert_one_error_line(err)
    assert path.name in line or "shard" in line


@pytest.mark.parametrize(
    "case",
    ["not_gguf", "truncated_half", "missing_tensor", "unsupported_tensor_type", "missing_shard"],
)
def test_generate_with_a_bad_model_exits_2_with_one_error_line(cli_models, capsys, case):
    rc, out, err = _run(
        capsys, ["generate", "hello", "-n", "2", "--model", str(cli_models.bad[case])]
    )
    assert rc == 2
    assert out == ""
    _assert_one_error_line(err)


def test_the_model_may_come_from_the_environment(cli_models, capsys, monkeypatch):
    monkeypatch.setenv("STRATA_MODEL", str(cli_models.bad["missing_tensor"]))
    rc, _, err = _run(capsys, ["inspect"])
    assert rc == 2 and "blk.1.ffn_down_exps" in _assert_one_error_line(err)


def test_a_value_error_from_deep_code_is_one_line_not_a_traceback(cli_models, capsys, monkeypatch):
    import strata.cli.inspect

    def broken(*a, **kw):
        raise ValueError("a reason\nspread over\n  three lines")

    monkeypatch.setattr(strata.cli.inspect, "report", broken)
    rc, _, err = _run(capsys, ["inspect", str(cli_models.tiny)])
    assert rc == 2
    assert _assert_one_error_line(err) == "strata: error: a reason spread over three lines"


@pytest.mark.parametrize("case", ["not_gguf", "truncated_in_last_tensor", "missing_shard"])
def test_python_dash_m_strata_exits_2_on_a_bad_model(cli_models, case):
    r = run_strata("inspect", str(cli_models.bad[case]))
    assert r.returncode == 2, r.stderr
    assert r.stdout == ""
    _assert_one_error_line(r.stderr)


# ---- generate and inspect on good models ----


def test_generate_prints_the_prompt_and_its_continuation(cli_models, capsys):
    prompt = "def fibonacci(n):"
    rc, out, err = _run(capsys, ["generate", prompt, "-n", "8", "--model", str(cli_models.tiny)])
    assert rc == 0, err
    assert out.startswith(prompt)
    assert len(out.rstrip("\n")) > len(prompt)


def test_python_dash_m_strata_generate_exits_0(cli_models):
    r = run_strata("generate", "def fibonacci(n):", "-n", "4", "--model", str(cli_models.tiny))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("def fibonacci(n):")


def test_generate_refuses_a_non_positive_token_count(cli_models, capsys):
    rc, _, err = _run(capsys, ["generate", "x", "-n", "0", "--model", str(cli_models.tiny)])
    assert rc == 2 and "--max-tokens" in _assert_one_error_line(err)


def _expert_bytes_per_token(report: str) -> int:
    m = re.search(r"expert bytes per token:\s*([\d,]+)\s*B", report)
    assert m, report
    return int(m.group(1).replace(",", ""))


def test_inspect_reports_expert_bytes_per_token_of_the_tiny_model(cli_models, capsys):
    rc, out, _ = _run(capsys, ["inspect", str(cli_models.tiny)])
    assert rc == 0
    a = make_args("tiny")  # K=2, L=2, D=F=256, IQ3_XXS experts
    true = a.n_expert_used * a.n_layer * 3 * (a.expert_ff * a.n_embd // 256 * 98)
    assert _expert_bytes_per_token(out) == pytest.approx(true, rel=0.01)


@pytest.mark.slow
def test_inspect_expert_bytes_per_token_of_a_qwen3_30b_a3b_shaped_iq3_xxs_file(tmp_path, capsys):
    out = tmp_path / "q30.gguf"
    try:
        rc, _, err = _run(
            capsys,
            [
                "synth",
                str(out),
                "--shape",
                "qwen3-30b-a3b",
                "--layers",
                "2",
                "--vocab",
                "2048",
                "--quant",
                "IQ3_XXS",
            ],
        )
        assert rc == 0, err
        rc, report, err = _run(capsys, ["inspect", str(out)])
        assert rc == 0, err
    finally:
        out.unlink(missing_ok=True)
    # Qwen3-30B-A3B: K = 8 experts of gate [768, 2048] + up [768, 2048] + down [2048, 768]
    k, layers, d, f = 8, 2, 2048, 768
    block_elems, block_bytes = 256, 98  # IQ3_XXS
    one_expert = 3 * (d * f // block_elems * block_bytes)
    true = k * layers * one_expert
    got = _expert_bytes_per_token(report)
    assert abs(got - true) <= 0.01 * true, (got, true)
    assert f"{k} experts x {layers} layers" in report


# ---- synth ----


def _synth(capsys, out: Path, *extra: str) -> tuple[int, str, str]:
    return _run(capsys, ["synth", str(out), "--shape", "tiny", "--quant", "IQ3_XXS", *extra])


def test_synth_writes_a_model_that_loads(tmp_path, capsys):
    out = tmp_path / "m.gguf"
    rc, stdout, err = _synth(capsys, out)
    assert rc == 0, err
    assert f"wrote {out}" in stdout
    rc, report, _ = _run(capsys, ["inspect", str(out)])
    assert rc == 0 and "IQ3_XXS" in report
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


def test_synth_refuses_to_overwrite_without_force(tmp_path, capsys):
    out = tmp_path / "m.gguf"
    out.write_bytes(b"precious")
    rc, _, err = _synth(capsys, out)
    assert rc == 2
    assert "--force" in _assert_one_error_line(err)
    assert out.read_bytes() == b"precious"
    rc, _, err = _synth(capsys, out, "--force")
    assert rc == 0, err
    assert out.read_bytes()[:4] == b"GGUF"


def test_synth_refuses_to_overwrite_an_existing_shard_set(tmp_path, capsys):
    out = tmp_path / "m.gguf"
    assert _synth(capsys, out, "--split-max-tensors", "10")[0] == 0
    shards = sorted(tmp_path.iterdir())
    assert [p.name for p in shards] == [f"m-0000{k}-of-00003.gguf" for k in (1, 2, 3)]
    before = [p.stat().st_mtime_ns for p in shards]
    rc, _, err = _synth(capsys, out, "--split-max-tensors", "10", "--seed", "1")
    assert rc == 2
    assert "m-00001-of-00003.gguf" in _assert_one_error_line(err)
    assert [p.stat().st_mtime_ns for p in shards] == before


@pytest.mark.parametrize(
    "flag,value",
    [("--quant", "Q9_Z"), ("--quant", "Q4_0"), ("--dense-quant", "nope"), ("--quant", "Q8_K")],
)
def test_synth_rejects_an_unknown_or_unusable_quant(tmp_path, capsys, flag, value):
    out = tmp_path / "m.gguf"
    rc, _, err = _run(capsys, ["synth", str(out), "--shape", "tiny", flag, value])
    assert rc == 2
    assert value in _assert_one_error_line(err)
    assert list(tmp_path.iterdir()) == []


def test_synth_rejects_an_unknown_shape(tmp_path, capsys):
    rc, _, err = _run(capsys, ["synth", str(tmp_path / "m.gguf"), "--shape", "huge"])
    assert rc == 2 and "huge" in _assert_one_error_line(err)
    assert list(tmp_path.iterdir()) == []


def test_synth_leaves_no_partial_file_when_writing_fails(tmp_path, capsys, monkeypatch):
    calls = {"n": 0}
    make_tensor = synth._Generator.tensor

    def failing(self, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 12:  # well into the tensor data
            raise OSError(28, "No space left on device")
        return make_tensor(self, *a, **kw)

    monkeypatch.setattr(synth._Generator, "tensor", failing)
    for split in ("0", "10"):
        calls["n"] = 0
        rc, _, err = _synth(capsys, tmp_path / "m.gguf", "--split-max-tensors", split)
        assert rc == 2
        assert "No space left on device" in _assert_one_error_line(err)
        assert list(tmp_path.iterdir()) == [], split


def test_synth_refuses_a_quant_whose_blocks_do_not_tile_the_rows_before_writing(tmp_path):
    """No CLI override changes a row length, so this is checked on write_synthetic itself."""
    args = make_args("tiny", expert_ff=320)  # down_exps rows of 320: not a multiple of 256
    assert 320 % fmt(QT.Q4_K).block_elems
    spec = SynthSpec(args, expert_quant=QT.Q4_K)
    with pytest.raises(ValueError, match="not a multiple of Q4_K's block size") as e:
        write_synthetic(tmp_path / "m.gguf", spec, progress=False)
    assert "ffn_down_exps" in str(e.value) and "\n" not in str(e.value)
    assert list(tmp_path.iterdir()) == []


# ---- a closed stdout (`strata inspect | head -1`) ----


def test_a_closed_stdout_ends_quietly_with_the_exit_code_of_a_piped_command(cli_models):
    """The reader is gone before strata writes: no 'Broken pipe' line, exit 128 + SIGPIPE."""
    from strata.cli.main import EXIT_PIPE

    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for argv in (["inspect", str(cli_models.tiny)], ["synth", "--help"]):
        r, w = os.pipe()
        os.close(r)  # like `head -1` after its line: nobody reads any more
        try:
            p = subprocess.run(
                [sys.executable, "-m", "strata", *argv],
                stdout=w,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=REPO,
                timeout=120,
            )
        finally:
            os.close(w)
        if argv[-1] == "--help":  # argparse exits on its own: only the quiet part holds there
            assert "Broken pipe" not in p.stderr and "Traceback" not in p.stderr
            continue
        assert p.returncode == EXIT_PIPE == 141
        assert p.stderr == ""


def test_a_stdout_that_breaks_mid_stream_is_no_error_line(cli_models, capsys, monkeypatch):
    class Closed:
        def write(self, s):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", Closed())
    rc = main(["generate", "hello", "-n", "2", "--model", str(cli_models.tiny)])
    assert rc == 141
    err = capsys.readouterr().err
    assert "error" not in err and "Broken pipe" not in err


def test_generate_on_the_embedded_model_says_once_what_it_knows():
    r = run_strata("generate", "def f(x):", "-n", "2", "--device", "host")
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("trained on Python source only") == 1
