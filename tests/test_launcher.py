"""run.sh: every refusal comes before a container sees anything (a fake `docker` on PATH records
its calls), the container command on fixture GPUs, the dry run on a machine with no GPU, and a
native start that serves the embedded model on loopback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from strata.cli.common import DEFAULT_MODEL
from strata.cli.main import build_parser
from strata.cli.serve import serve_options
from tests.test_resolve import QWEN, fake_hub

REPO = Path(__file__).resolve().parents[1]
KFD = Path(__file__).parent / "fixtures" / "kfd"

FAKE_DOCKER = """#!/bin/sh
# records every call; `run --env-file F` also records F's lines
echo "$*" >> "$FAKE_DOCKER_LOG"
case "$1" in
info) exit 0 ;;
image) [ -n "$FAKE_DOCKER_NO_IMAGE" ] && exit 1; printf '%s\\n' "$FAKE_DOCKER_LABEL"; exit 0 ;;
run) while [ $# -gt 0 ]; do
        [ "$1" = --env-file ] && sed 's/^/ENV /' "$2" >> "$FAKE_DOCKER_LOG"; shift
     done; exit 0 ;;
esac
"""


@pytest.fixture
def launcher(tmp_path):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "docker").write_text(FAKE_DOCKER)
    (bin_ / "nvidia-smi").write_text("#!/bin/sh\nexit 9\n")  # present but no driver
    for f in bin_.iterdir():
        f.chmod(0o755)
    log = tmp_path / "docker.log"

    def run(*args, tree="no_gpu", nvidia=None, **extra):
        if nvidia is not None:  # compute_cap, memory.total, memory.used
            (bin_ / "nvidia-smi").write_text(f"#!/bin/sh\necho '{nvidia}'\n")
        env = {
            "PATH": f"{bin_}:{Path(sys.executable).parent}:/usr/bin:/bin",
            "HOME": str(tmp_path),
            "STRATA_PYTHON": sys.executable,
            "STRATA_SYSFS_ROOT": str(KFD / tree),
            "HF_HUB_CACHE": str(tmp_path / "hub"),
            "HF_HUB_OFFLINE": "1",
            "STRATA_PACKS_DIR": str(tmp_path / "packs"),
            "FAKE_DOCKER_LOG": str(log),
            "FAKE_DOCKER_LABEL": "1",
            "TMPDIR": str(tmp_path),
        } | extra
        out = subprocess.run(
            ["bash", str(REPO / "run.sh"), *args], capture_output=True, text=True, env=env
        )
        calls = log.read_text().splitlines() if log.exists() else []
        return out, calls

    run.tmp = tmp_path
    return run


def engine_lines(text: str) -> dict[str, str]:
    return dict(ln.split("=", 1) for ln in text.splitlines() if ln.startswith("STRATA_"))


REFUSALS = [
    (["--release", "swift"], {"HSA_OVERRIDE_GFX_VERSION": "11.0.0"}, "HSA_OVERRIDE_GFX_VERSION"),
    (["--release", "swift"], {"tree": "gfx1030_gfx1032"}, "AMD gfx1030 is not on the validated"),
    (["--release", "swift"], {"nvidia": "7.5, 16384, 300"}, "NVIDIA sm_75 is not supported"),
    (["--vram-budget-mib", "1280"], {"tree": "gfx1101_12g"}, "outside the contract's 1281..10240"),
    (["--vram-budget-mib", "10241"], {}, "outside the contract's 1281..10240"),
    (["--max-context", "131072"], {"tree": "gfx1101_12g"}, "--max-context 131072 is unsupported"),
    (["--max-context", "lots"], {}, "--max-context must be a whole number"),
    (["--release", "llama"], {}, "'llama' is not a release"),
    (["--release", "qwen"], {"tree": "gfx1101_12g"}, "fetch it with: hf download " + QWEN),
    (["--release", "qwen", "--quant", "IQ3_XXS"], {"disk": 1}, "GB free"),
    (["--release", "swift", "--device", "gpu"], {}, "a GPU start is refused"),
    (
        ["--release", "swift"],
        {"tree": "gfx1101_12g", "STRATA_VRAM_RUNTIME_RESERVE_MIB": "4000"},
        "exceeds the card's 12272 MiB",
    ),
    (["--release", "swift"], {"tree": "gfx1101_12g", "FAKE_DOCKER_LABEL": ""}, "is too old"),
    (["--release", "swift"], {"tree": "gfx1101_12g", "FAKE_DOCKER_NO_IMAGE": "1"}, "not found"),
    (["--port", "70000"], {}, "--port must be in 1..65535"),
    (["--bogus"], {}, "unknown argument --bogus"),
    (["--release"], {}, "--release needs a value"),
]


@pytest.mark.parametrize("args, extra, msg", REFUSALS, ids=[r[2][:28] for r in REFUSALS])
def test_every_refusal_is_one_line_and_reaches_no_container(launcher, args, extra, msg):
    if extra.pop("disk", None):  # a cached quant, no pack, and a floor no disk has
        fake_hub(launcher.tmp / "hub", QWEN, ["Qwen3-30B-A3B.i1-IQ3_XXS.gguf"])
        extra["STRATA_DISK_FLOOR_GB"] = "1000000000"
    out, calls = launcher(*args, **extra)
    assert out.returncode == 2, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(("run.sh: error: ", "strata: error: ")) and msg in last
    assert not [c for c in calls if c.startswith("run ")]
    assert not list(launcher.tmp.glob("strata-env.*"))  # nothing half-written


def test_amd_start_runs_the_image_with_the_card_and_the_config(launcher):
    out, calls = launcher("--release", "swift", "--port", "8123", tree="gfx1101_12g")
    assert out.returncode == 0, out.stderr
    assert calls[0] == "info" and calls[1].startswith("image inspect")
    assert '"io.strata.vram-budget"' in calls[1] and calls[1].endswith("strata-rocm:gfx1101")
    run = next(c for c in calls if c.startswith("run "))
    assert "-p 127.0.0.1:8123:8000" in run and f"--user {os.getuid()}:{os.getgid()}" in run
    assert "--device /dev/kfd" in run and "--device /dev/dri/renderD128" in run
    assert run.endswith("strata-rocm:gfx1101")
    env = {c[4:].split("=", 1)[0]: c[4:].split("=", 1)[1] for c in calls if c.startswith("ENV ")}
    assert env["STRATA_RELEASE"] == "swift" and env["STRATA_DEVICE"] == "gpu"
    assert env["STRATA_EXPERT_CACHE"] == "auto" and env["HF_HUB_OFFLINE"] == "1"
    assert "STRATA_MODEL" not in env  # the container resolves its own paths
    assert not list(launcher.tmp.glob("strata-env.*"))  # the env file is removed afterwards


def test_nvidia_start_uses_the_cuda_image(launcher):
    out, calls = launcher("--release", "swift", nvidia="8.9, 24564, 400")
    assert out.returncode == 0, out.stderr
    run = next(c for c in calls if c.startswith("run "))
    assert "--gpus device=0" in run and run.endswith("strata-cuda:sm_89")


def test_dry_run_without_a_gpu_prints_the_config_and_refuses_a_gpu_start(launcher):
    out, calls = launcher("--release", "swift", "--dry-run", "--max-context", "2048")
    assert out.returncode == 0, out.stderr
    refused = [ln for ln in out.stderr.splitlines() if "a GPU start is refused" in ln]
    assert len(refused) == 1
    lines = engine_lines(out.stdout)
    cfg = serve_options(build_parser().parse_args(["serve"]), lines)["config"]
    assert cfg.model == str(DEFAULT_MODEL) and cfg.device == "host" and cfg.n_ctx == 2048
    assert not [c for c in calls if c.startswith("run ")]
    out, _ = launcher("--release", "swift", "--dry-run", "--device", "gpu")
    assert out.returncode == 0 and "a GPU start is refused" in out.stderr


def _native_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """No fake docker, a fixture topology without a GPU, and an nvidia-smi that finds none
    (whatever the machine running the tests has)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    (bin_ / "nvidia-smi").write_text("#!/bin/sh\nexit 9\n")
    (bin_ / "nvidia-smi").chmod(0o755)
    return {
        "PATH": f"{bin_}:{Path(sys.executable).parent}:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "STRATA_PYTHON": sys.executable,
        "STRATA_SYSFS_ROOT": str(KFD / "no_gpu"),
        "STRATA_PACKS_DIR": str(tmp_path / "packs"),
    } | extra


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_without_docker_the_embedded_model_is_served_natively_on_loopback(tmp_path):
    port = _free_port()
    # an environment knob the server must see through the launcher
    env = _native_env(tmp_path, STRATA_CAR_THRESHOLD="1.0")
    cmd = ["bash", str(REPO / "run.sh"), "--release", "swift", "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as r:
                    models = json.load(r)
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read().decode()
                assert time.monotonic() < deadline, "server did not come up"
                time.sleep(0.3)
        assert models["data"][0]["architecture"] == "qwen3moe"
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    assert "mode native, device host" in err.decode()
    assert engine_lines(out.decode())["STRATA_CAR_THRESHOLD"] == "1.0"


@pytest.mark.slow
def test_a_pack_of_another_release_stops_the_native_start(tmp_path):
    from strata.cpu.pack import build_pack
    from strata.model.loader import load_model

    pack = tmp_path / "packs" / "swift-iq3_xxs"  # the swift pack dir, built for qwen
    build_pack(load_model(DEFAULT_MODEL), pack, release="qwen", progress=False)
    env = _native_env(tmp_path, STRATA_EXPERT_CACHE="0")  # all experts in the pool: pack read
    cmd = ["bash", str(REPO / "run.sh"), "--release", "swift", "--port", str(_free_port())]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert f"STRATA_PACK={pack}" in out.stdout
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("strata: error: ") and "release 'qwen'" in last


def test_container_sees_the_primary_and_helpers_renumbered_as_it_numbers_them(launcher):
    out, calls = launcher(
        "--release", "swift", "--primary-device", "2", "--helper-cache", "0=auto,3=3400",
        nvidia="9.0, 81559, 400",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    run = next(c for c in calls if c.startswith("run "))
    assert '--gpus "device=0,2,3"' in run  # the container numbers them 0, 1, 2
    env = dict(c[4:].split("=", 1) for c in calls if c.startswith("ENV "))
    assert env["STRATA_PRIMARY_DEVICE"] == "1" and env["STRATA_HELPER_CACHE"] == "0=auto,2=3400"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    out, calls = launcher("--release", "swift", nvidia="9.0, 81559, 400", STRATA_PRIMARY_DEVICE="1")
    run = next(c for c in calls if c.startswith("run ") and "device=1" in c)
    env = [c for c in calls if c.startswith("ENV STRATA_PRIMARY_DEVICE")]
    assert "--gpus device=1" in run and env[-1] == "ENV STRATA_PRIMARY_DEVICE=0"


def test_native_start_keeps_the_primary_device_and_probes_each_helper(launcher):
    out, _ = launcher(
        "--release", "swift", "--native", "--dry-run", "--primary-device", "1",
        "--helper-cache", "0=auto", nvidia="9.0, 81559, 400",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = engine_lines(out.stdout)
    assert lines["STRATA_PRIMARY_DEVICE"] == "1" and lines["STRATA_HELPER_CACHE"] == "0=auto"
    assert "helper cards: 0=auto" in out.stderr
    smi = launcher.tmp / "bin" / "nvidia-smi"  # GPUs 0 and 1 only
    smi.write_text(
        '#!/bin/sh\ncase "$1" in --id=[01]) echo "9.0, 81559, 400" ;; *) exit 6 ;; esac\n'
    )
    bad, _ = launcher("--release", "swift", "--helper-cache", "1=auto,4=auto")
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.strip().splitlines()[-1] == (
        "run.sh: error: helper GPU 4: nvidia-smi finds no such card"
    )
    bad, _ = launcher("--release", "swift", "--helper-cache", "1=auto", nvidia="9.0, 81559, 400",
                      STRATA_PRIMARY_DEVICE="1")  # fmt: skip
    assert bad.returncode == 2 and "the primary device" in bad.stderr.strip().splitlines()[-1]
