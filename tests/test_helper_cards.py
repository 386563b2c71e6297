"""Helper cards (strata/gpu/helper.py): a second GPU holding expert slots computes the misses it
holds; the tokens are the single-GPU run's at CAR 1.0 (the same expert math, summed in another
order: logits within the card's tolerance). Runs on a machine with two GPUs and on tools/gpu_emu
with two emulated devices (EMU_NDEV=2; tests/test_gpu_emulated.py)."""

from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from strata.build import build_engine  # noqa: E402
from strata.config import resolve  # noqa: E402
from strata.model.loader import load_model  # noqa: E402
from tests.oracle import FLIP_BOUND, position_errors  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture
def two_devices(monkeypatch, device):
    if getattr(cp, "__emulated__", False):
        monkeypatch.setenv("EMU_NDEV", "2")
    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("one GPU: helper cards need a second")
    yield
    cp.cuda.Device(0).use()


def _engine(path, **flags):
    base = {"model": path, "device": "gpu", "car_threshold": 1.0, "cuda_graphs": False}
    base |= {"threads": 1, "prefill_offload": "off", "n_ctx": 64}
    return build_engine(load_model(path), resolve(base | flags, {}))


def test_helper_card_gives_the_single_gpu_tokens_and_takes_misses_off_the_pool(
    synth_model, two_devices
):
    path = synth_model("tiny", "Q4_K", seed=53, n_expert=16, n_expert_used=4)
    n_layer = load_model(path).args.n_layer
    primary = 3 * n_layer  # three experts a layer on the primary
    engines = {
        "alone": _engine(path, expert_cache=str(primary)),
        "helper": _engine(path, expert_cache=str(primary), helper_cache=f"1={5 * n_layer}"),
        "auto": _engine(path, expert_cache=str(primary), helper_cache="1=auto"),
    }
    h = engines["helper"].miss_runner
    assert h.name == "tiered" and h.helpers[0].index == 1 and h.helpers[0].n_slots == 5 * n_layer
    placed = h.tiers.tier
    assert ((placed == 0) == engines["helper"].resident).all()
    assert ((placed == 1).sum(axis=1) == 5).all()  # the next five ids of each layer
    # auto: the card's free memory holds every expert the primary does not
    assert (engines["auto"].miss_runner.tiers.tier >= 0).all()
    rng = np.random.default_rng(53)
    prompt = rng.integers(0, engines["alone"].args.n_vocab, 6).tolist()
    logits = {k: [e.forward(prompt)] for k, e in engines.items()}
    for _ in range(5):  # decode, every engine fed the single-GPU engine's greedy token
        tok = int(np.argmax(logits["alone"][-1]))
        for k, e in engines.items():
            logits[k].append(e.forward([tok]))
    want = np.array(logits["alone"])
    for k in ("helper", "auto"):
        got = np.array(logits[k])
        np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))
        assert position_errors(got, want).max() <= FLIP_BOUND, k
    st = {k: e.stats for k, e in engines.items()}
    assert st["helper"].helper_hits[0] > 0 and st["auto"].helper_hits[0] > 0
    alone, helped = (st[k].cpu_experts_per_window() for k in ("alone", "helper"))
    assert helped < alone and st["auto"].cpu_experts_per_window() == 0.0


def test_helper_sizes_its_slots_from_its_own_budget_and_refuses_a_count_past_it(
    synth_model, two_devices
):
    from strata.gpu.budget import DeviceBudget
    from strata.gpu.device import DeviceError, device_info
    from strata.gpu.helper import HelperCard

    model = load_model(synth_model("tiny", "Q4_K", seed=53, n_expert=16, n_expert_used=4))
    info = device_info(1)
    probe = HelperCard(model, info, slots=1, budget=DeviceBudget(total_mib=2048, widen=True))
    one, ws = sum(probe.slot_bytes), probe.budget.reservations["workspace"]

    def budget(room: int) -> DeviceBudget:  # `room` bytes left for the workspace and slots
        b = DeviceBudget(total_mib=2048, widen=True)
        b.reserve("taken", b.free_bytes - room)
        return b

    assert HelperCard(model, info, "auto", budget(ws + 3 * one + one // 2)).n_slots == 3
    with pytest.raises(DeviceError, match="helper GPU 1: 4 expert slots"):
        HelperCard(model, info, 4, budget(ws + 3 * one + one // 2))
    with cp.cuda.Device(1):  # the slots live on the helper's device, counted in its pool
        assert probe.stores[0].buf.device.id == 1
        assert cp.get_default_memory_pool().used_bytes() > 0
    assert cp.cuda.runtime.getDevice() == 0  # the primary stays current
