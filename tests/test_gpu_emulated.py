"""GPU kernels checked without a GPU: a subset of the `gpu` tests run on tools/gpu_emu (the CUDA
subset emulated on the CPU, a fake CuPy), at warp 32 and at warp 64 (CDNA's wave64), so kernel
logic and its warp-size assumptions are checked in CI; the GPU machine's run stays the authority
(see tools/gpu_emu/README.md for what the emulator does not model)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EMU = ROOT / "tools" / "gpu_emu"
# small, quick kernel tests touching the decode chain's kernels (router top-k and its pair list,
# the norms and activation quantization, T = 1 GEMV of float and quantized weights, the resident
# experts with and without the residual add, every decode kernel pair; IQ4_XS and IQ1_M for their
# register/SWAR decode, the four sign formats for their sign masks and index permutes, MXFP4 for
# its blocks at every byte offset; a prompt's pairs grouped on the card; the decode GEMV on
# misaligned rows)
SUBSET = (
    "router_topk or norm_quant"
    " or (gemv_matches and (F32 or F16 or BF16 or Q8_0 or IQ3_XXS or IQ4_XS or IQ1_M"
    " or IQ3_S or IQ2_XXS or MXFP4))"
    " or (moe_experts_match_reference and IQ3_XXS-IQ3_XXS-IQ3_XXS)"
    " or group_pairs_on_card"
    " or (gemv1_misaligned and 3- and (IQ3_XXS or IQ1_M or IQ2_S or IQ3_S or IQ2_XXS))"
)

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the emulator builds with g++")


def _on_the_emulator(warp: int, tmp_path: Path, *args: str, timeout: int = 1500) -> None:
    """Run the `gpu` tests named by `args` on tools/gpu_emu at `warp`; all must pass, none skip."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(EMU / "fakecupy"), str(ROOT)])
    env["EMU_WARP"] = str(warp)
    env.setdefault("EMU_BUILD", str(tmp_path / "emu-build"))
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", *args]
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    tail = (r.stdout + r.stderr)[-3000:]
    assert r.returncode == 0, tail
    assert " passed" in r.stdout and "skipped" not in r.stdout.splitlines()[-1], tail


@pytest.mark.parametrize("warp", [32, 64])
def test_gpu_kernel_subset_on_the_emulator(warp, tmp_path):
    _on_the_emulator(warp, tmp_path, str(ROOT / "tests" / "test_gpu_kernels.py"), "-k", SUBSET)


@pytest.mark.parametrize("warp", [32, 64])
def test_route_car_slack_rule_on_the_emulator(warp, tmp_path):
    """The card's CAR (route_car.cu) against the golden cases and car_plan, slack mode too."""
    _on_the_emulator(warp, tmp_path, str(ROOT / "tests" / "test_gpu_route_car.py"), timeout=900)


def test_card_warm_copies_and_pcie_split_on_the_emulator(tmp_path):
    """A prompt's warm admissions copied from staging slots on the card, and decode misses split
    between the pool and the PCIe link: the same bits as without them (warp 32 only: no warp
    logic of their own)."""
    tests = ROOT / "tests"
    _on_the_emulator(
        32, tmp_path, str(tests / "test_card_warm.py"), str(tests / "test_card_split.py")
    )


def test_helper_card_on_two_emulated_devices(tmp_path):
    """A second emulated device holding expert slots (strata/gpu/helper.py): the single-GPU
    run's tokens; its kernels refuse arrays of the other device (warp 32 only)."""
    _on_the_emulator(32, tmp_path, str(ROOT / "tests" / "test_helper_cards.py"), timeout=900)


@pytest.mark.parametrize("warp", [32, 64])
def test_gpt_oss_attention_and_rope_on_the_emulator(warp, tmp_path):
    """gpt-oss's pieces in the card's kernels: YaRN RoPE against the host's table, attention
    with sinks and sliding windows (prompt and both decode grids) against the reference."""
    _on_the_emulator(
        warp,
        tmp_path,
        str(ROOT / "tests" / "test_gpu_gpt_oss.py"),
        "-k",
        "lacks_nothing or yarn_rope or sinks_and_window",
        timeout=900,
    )
