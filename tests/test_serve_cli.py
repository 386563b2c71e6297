"""`strata serve` flags: defaults, flag over environment, one-line refusals."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from strata.cli.serve import add_parser, serve_options


def _parse(*argv: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    add_parser(ap.add_subparsers(dest="cmd"))
    return ap.parse_args(["serve", *argv])


def test_defaults_bind_loopback_port_8000_with_the_embedded_model():
    ns = _parse()
    assert (ns.host, ns.port, ns.max_queue, ns.slots) == ("127.0.0.1", 8000, 64, 1)
    opts = serve_options(ns, environ={})
    assert opts["model"].endswith("default.gguf") and opts["api_key"] is None
    assert opts["reasoning_effort"] is None and opts["config"].n_ctx is None


def test_flags_beat_environment_variables():
    env = {"STRATA_API_KEY": "from-env", "STRATA_REASONING_EFFORT": "low"}
    assert serve_options(_parse(), env)["api_key"] == "from-env"
    assert serve_options(_parse(), env)["reasoning_effort"] == "low"
    opts = serve_options(_parse("--api-key", "flag", "--reasoning-effort", "none"), env)
    assert (opts["api_key"], opts["reasoning_effort"]) == ("flag", "none")


def test_engine_flags_reach_the_engine_config_over_their_environment_variables():
    env = {"STRATA_CAR_THRESHOLD": "0.5", "STRATA_CTX": "512"}
    cfg = serve_options(_parse(), env)["config"]
    assert (cfg.car_threshold, cfg.n_ctx) == (0.5, 512)
    cfg = serve_options(_parse("--car-threshold", "0.7", "--ctx", "256"), env)["config"]
    assert (cfg.car_threshold, cfg.n_ctx) == (0.7, 256)


def test_model_id_from_flag_over_environment_as_the_launcher_writes_it():
    assert serve_options(_parse(), {})["model_id"] is None  # the app uses the file's stem
    env = {"STRATA_MODEL_ID": "swift-iq3_xxs"}
    assert serve_options(_parse(), env)["model_id"] == "swift-iq3_xxs"
    assert serve_options(_parse("--model-id", "mine"), env)["model_id"] == "mine"


def test_bad_values_are_refused():
    with pytest.raises(ValueError, match="STRATA_REASONING_EFFORT"):
        serve_options(_parse(), {"STRATA_REASONING_EFFORT": "max"})
    with pytest.raises(ValueError, match="no such file"):
        serve_options(_parse("--model", "/nonexistent.gguf"), {})
    with pytest.raises(ValueError, match="the server does not draft yet"):
        serve_options(_parse("--spec", "2"), {})
    for argv in (["--reasoning-effort", "max"], ["--port", "70000"], ["--max-queue", "-1"]):
        with pytest.raises(SystemExit):
            _parse(*argv)


def test_python_m_strata_serve_reports_a_missing_model_in_one_line():
    r = subprocess.run(
        [sys.executable, "-m", "strata.serve", "--model", "/nonexistent.gguf"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert r.stderr.strip() == "strata: error: /nonexistent.gguf: no such file"


def test_primary_device_and_router_dump_are_settings_like_the_others():
    env = {"STRATA_PRIMARY_DEVICE": "1", "STRATA_DUMP_ROUTER_SCORES": "/tmp/scores"}
    cfg = serve_options(_parse(), env)["config"]
    assert (cfg.primary_device, cfg.dump_router_scores) == (1, "/tmp/scores")
    cfg = serve_options(_parse("--primary-device", "2"), env)["config"]
    assert cfg.primary_device == 2 and "primary_device" in cfg.explicit


def test_removed_experiment_flags_are_unknown_arguments():
    for argv in (["--host-dense", "float"], ["--car-dampen", "1"]):
        with pytest.raises(SystemExit):
            _parse(*argv)


def test_serve_without_the_serve_extra_names_the_extra(monkeypatch, capsys):
    import importlib.util

    from strata.cli import serve

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda m, *a: None if m == "starlette" else real(m, *a)
    )
    assert serve.cmd_serve(_parse()) == 2
    err = capsys.readouterr().err
    assert "starlette" in err and "serve extra" in err and ".[serve]" in err


def test_strata_version():
    r = subprocess.run(
        [sys.executable, "-m", "strata", "--version"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and r.stdout.startswith("strata ")
