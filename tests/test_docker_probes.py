"""docker/hipinfo.py on KFD fixture trees, docker/vram-guard.py on sysfs/fdinfo fixtures and a
fake NVML, docker/entrypoint.sh outside a container (base images cannot be pulled here),
docker/build.sh with a fake `docker`."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from strata.cli.common import DEFAULT_MODEL
from strata.cli.main import build_parser
from strata.cli.serve import serve_options

REPO = Path(__file__).resolve().parents[1]
KFD = Path(__file__).parent / "fixtures" / "kfd"
GiB = 1 << 30


def load(name: str):
    spec = importlib.util.spec_from_file_location(name.replace("-", "_"), REPO / "docker" / name)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


hipinfo = load("hipinfo.py")
guard = load("vram-guard.py")


def ask(tree: str, *args: str, env: dict | None = None) -> tuple[int, str]:
    out = subprocess.run(
        [sys.executable, str(REPO / "docker/hipinfo.py"), "--root", str(KFD / tree), *args],
        capture_output=True,
        text=True,
        env=env,
    )
    return out.returncode, (out.stdout + out.stderr).strip()


def test_hipinfo_gfx1101_12gb():
    assert ask("gfx1101_12g", "--arch") == (0, "gfx1101")
    assert ask("gfx1101_12g", "--vram") == (0, "12272")
    assert ask("gfx1101_12g", "--render-node") == (0, "/dev/dri/renderD128")
    assert ask("gfx1101_12g", "--reserve-mib") == (0, str(700 + hipinfo.RUNTIME_RESERVE_MIB))


def test_hipinfo_gfx1030_gfx1032_pair_in_node_order_and_by_device():
    rc, out = ask("gfx1030_gfx1032", "--list")
    assert rc == 0 and out.splitlines() == [
        "0 gfx1030 16368 MiB /dev/dri/renderD128",
        "1 gfx1032 8176 MiB /dev/dri/renderD129",
    ]
    assert ask("gfx1030_gfx1032", "--arch", "--device", "1") == (0, "gfx1032")
    env = dict(os.environ, STRATA_PRIMARY_DEVICE="1")
    assert ask("gfx1030_gfx1032", "--vram", env=env) == (0, "8176")
    rc, out = ask("gfx1030_gfx1032", "--arch", "--device", "2")
    assert rc != 0 and "device 2 does not exist (2 AMD GPU(s))" in out


def test_hipinfo_without_a_gpu_exits_1_with_one_line():
    rc, out = ask("no_gpu", "--arch")
    assert rc == 1 and out.startswith("hipinfo: no AMD GPU in the KFD topology")
    assert len(out.splitlines()) == 1


@pytest.mark.parametrize("v, name", [(110001, "gfx1101"), (100302, "gfx1032"), (90010, "gfx90a")])
def test_gfx_names_from_target_versions(v, name):
    assert hipinfo.gfx_name(v) == name


# ---------------------------------------------------------------- vram-guard


@pytest.fixture
def amd(tmp_path):
    root = tmp_path / "root"
    shutil.copytree(KFD / "gfx1101_12g", root)
    (root / "proc/4242").mkdir(parents=True)
    return root


def guard_main(root: Path, *args: str) -> int:
    return guard.main(["--root", str(root), "--vendor", "amd", "--samples", "1", *args], env={})


def test_guard_attributes_the_engine_process_through_kfd_and_passes_under_budget(amd, capsys):
    kfd = amd / "sys/class/kfd/kfd/proc/4242"
    kfd.mkdir(parents=True)
    (kfd / "vram_45411").write_text(str(9 * GiB))
    assert guard_main(amd, "--pid", "4242", "--budget-mib", "10240") == 0
    (kfd / "vram_45411").write_text(str(11 * GiB))
    assert guard_main(amd, "--pid", "4242", "--budget-mib", "10240") == guard.BREACH
    err = capsys.readouterr().err
    assert "pid 4242 holds 11264 MiB on GPU 0 (gfx1101), over the budget of 10240 MiB" in err
    assert "device in use 700 MiB" in err


def test_guard_reads_amdgpu_fdinfo_counting_each_client_once(amd, capsys):
    fd = amd / "proc/4242/fdinfo"
    fd.mkdir()
    client = "drm-driver:\tamdgpu\ndrm-pdev:\t0000:03:00.0\ndrm-client-id:\t7\n"
    (fd / "5").write_text(client + "drm-memory-vram:\t10747904 KiB\n")  # 10496 MiB
    (fd / "6").write_text(client + "drm-memory-vram:\t10747904 KiB\n")  # the same client again
    (fd / "7").write_text("pos:\t0\nflags:\t02\n")  # not a DRM file
    assert guard.fdinfo_vram(amd, 4242) == 10747904 * 1024
    assert guard_main(amd, "--pid", "4242", "--budget-mib", "10240") == guard.BREACH
    assert "pid 4242 holds 10496 MiB" in capsys.readouterr().err
    assert guard_main(amd, "--pid", "4242", "--budget-mib", "10240", "--slack-mib", "300") == 0


def test_guard_falls_back_to_the_whole_device_when_the_pid_has_no_record(amd, capsys):
    assert guard_main(amd, "--pid", "4242", "--budget-mib", "2000") == 0  # 700 MiB in use
    assert "holding the whole device's use to the budget" in capsys.readouterr().err
    assert guard_main(amd, "--budget-mib", "1281", "--slack-mib", "0") == 0
    dev = amd / "sys/class/drm/renderD128/device/mem_info_vram_used"
    dev.write_text(str(3 * GiB))
    assert guard_main(amd, "--budget-mib", "2048") == guard.BREACH
    assert "the device holds 3072 MiB" in capsys.readouterr().err


def test_guard_stops_with_0_when_the_engine_process_ends(amd):
    shutil.rmtree(amd / "proc/4242")
    ns = ["--root", str(amd), "--vendor", "amd", "--pid", "4242", "--interval", "0"]
    assert guard.main(ns + ["--budget-mib", "4096"], env={}) == 0


class FakeNvml:
    def __init__(self, used: int, procs: list[tuple[int, int | None]]):
        self.used, self.procs = used, procs

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, n):
        return n

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=self.used, total=24 * GiB)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in self.procs]


def test_guard_on_nvidia_attributes_through_nvml(capsys):
    args = ["--vendor", "nvidia", "--samples", "1", "--pid", "77", "--budget-mib", "10240"]
    nv = FakeNvml(12 * GiB, [(12, 2 * GiB), (77, 9 * GiB)])
    assert guard.main(args, env={}, nvml=nv) == 0  # the other process's 2 GiB is not ours
    nv.procs = [(77, 10 * GiB + (1 << 20))]
    assert guard.main(args, env={}, nvml=nv) == guard.BREACH
    assert "pid 77 holds" in capsys.readouterr().err
    nv.procs = []  # a PID namespace hides the engine: the device is held to the budget
    assert guard.main(args, env={}, nvml=nv) == guard.BREACH
    assert "the device holds 12288 MiB" in capsys.readouterr().err


# ---------------------------------------------------------------- entrypoint and build


def entry(tmp_path, tree: str, *args: str, **extra) -> subprocess.CompletedProcess:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "STRATA_PYTHON": sys.executable,
        "PYTHONPATH": str(REPO),  # as installed in the image
        "STRATA_VENDOR": "rocm",
        "STRATA_SYSFS_ROOT": str(KFD / tree),
        "HF_HUB_CACHE": str(tmp_path / "hub"),
        "HF_HUB_OFFLINE": "1",
        "STRATA_PACKS_DIR": str(tmp_path / "packs"),
        "STRATA_STATE_DIR": str(tmp_path / "state"),
    } | extra
    return subprocess.run(
        ["bash", str(REPO / "docker/entrypoint.sh"), *(args or ["--dry-run"])],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )


def test_entrypoint_writes_the_config_the_server_reads(tmp_path):
    out = entry(
        tmp_path, "gfx1101_12g", STRATA_RELEASE="swift", STRATA_VRAM_BUDGET_MIB="9000",
        STRATA_CTX="2048", STRATA_ADAPT_SWAPS="5",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "device gfx1101, 12272 MiB" in out.stderr
    assert "license: training text under the Python Software Foundation License" in out.stderr
    lines = dict(ln.split("=", 1) for ln in out.stdout.splitlines() if ln.startswith("STRATA_"))
    cfg = serve_options(build_parser().parse_args(["serve"]), lines)["config"]
    assert cfg.model == str(DEFAULT_MODEL) and cfg.device == "gpu"
    assert (cfg.vram_budget_mib, cfg.n_ctx, cfg.adapt_swaps) == (9000, 2048, 5)
    assert cfg.expert_cache == "auto"  # the swift:IQ3_XXS tuning row
    assert not (tmp_path / "state").exists()  # a dry run writes nothing


def test_entrypoint_starts_the_server_on_the_config_file_it_wrote(tmp_path):
    # a fixture card but no real GPU: the server itself refuses --device gpu, and the
    # entrypoint ends with the server's status (the guard, watching its pid, ends with it)
    env = {"STRATA_RELEASE": "swift", "STRATA_VRAM_BUDGET_MIB": "9000", "STRATA_PORT": "0"}
    dry = entry(tmp_path, "gfx1101_12g", **env)
    out = entry(tmp_path, "gfx1101_12g", "start", **env)
    assert out.returncode != 0
    assert "--device gpu: no usable GPU" in out.stderr.strip().splitlines()[-1]
    written = (tmp_path / "state/engine.env").read_text()
    assert written.splitlines() == [ln for ln in dry.stdout.splitlines() if "=" in ln]


@pytest.mark.parametrize(
    "tree, extra, msg",
    [
        ("gfx1101_12g", {"HSA_OVERRIDE_GFX_VERSION": "11.0.0"}, "HSA_OVERRIDE_GFX_VERSION"),
        ("gfx1101_12g", {"STRATA_VRAM_BUDGET_MIB": "12000"}, "outside the contract"),
        ("no_gpu", {}, "no AMD GPU visible"),
        ("gfx1030_gfx1032", {}, "AMD gfx1030 is not on the validated list"),
        ("gfx1101_12g", {"STRATA_VRAM_RUNTIME_RESERVE_MIB": "3000"}, "exceeds the card's 12272"),
        ("gfx1101_12g", {"STRATA_RELEASE": "qwen"}, "fetch it with: hf download"),
    ],
)
def test_entrypoint_refusals(tmp_path, tree, extra, msg):
    out = entry(tmp_path, tree, **extra)
    if "qwen" in extra.values():  # offline, absent: a dry run names the fetch, a start fails
        assert "would fetch" in out.stderr and msg in out.stderr
        return
    assert out.returncode == 2 and msg in out.stderr.strip().splitlines()[-1]


def test_build_sh_tags_and_labels_the_image(tmp_path):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    log = tmp_path / "docker.log"
    (bin_ / "docker").write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    (bin_ / "docker").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_}:{os.environ['PATH']}", STRATA_PYTHON=sys.executable)
    subprocess.run(
        ["bash", str(REPO / "docker/build.sh"), "--vendor", "rocm", "--arch", "gfx1101"],
        check=True,
        env=env,
        cwd=tmp_path,
    )
    call = log.read_text().split()
    sha = (
        subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
        ).stdout.strip()
        or "nogit"
    )
    assert call[:3] == ["build", "-f", "docker/Dockerfile.rocm"]
    assert "io.strata.vram-budget=1" in call
    tags = [call[i + 1] for i, a in enumerate(call) if a == "-t"]
    assert tags == [
        "strata-rocm:gfx1101",
        f"strata-rocm:gfx1101-{sha}",
        "strata-rocm:gfx1101-latest",
    ]
    bad = subprocess.run(
        ["bash", str(REPO / "docker/build.sh"), "--arch", "rx7700"], capture_output=True, env=env
    )
    assert bad.returncode == 2 and b"--arch must look like" in bad.stderr


def test_dockerfiles_carry_the_label_and_the_entrypoint():
    for vendor in ("rocm", "cuda"):
        text = (REPO / f"docker/Dockerfile.{vendor}").read_text()
        assert 'LABEL io.strata.vram-budget="${VRAM_GUARD}"' in text
        assert f"STRATA_VENDOR={vendor}" in text
        assert 'ENTRYPOINT ["/opt/strata/docker/entrypoint.sh"]' in text
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    assert ignore[1] == "*" and "**/*.gguf" in ignore  # source-only context
