"""gpt-oss on the GPU tier against the host tier: YaRN RoPE, attention sinks and the sliding
window (prompt and decode kernels), the biases of the output, router and experts, the clamped
SwiGLU (decode and grouped expert kernels), then the engine's greedy tokens, every expert
resident and with half of them in the CPU pool.

Tolerance as tests/test_gpu_tier.py: the tiers differ in float32 summation order and libm vs
device cosf/expf until a Q8 or f16 rounding flips (tests/oracle.py FLIP_BOUND).

T = tokens, H/G = query/KV heads, Dh = head dim, S = keys, K = experts a token.
"""

from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from strata.build import build_engine, card_lacks  # noqa: E402
from strata.config import resolve  # noqa: E402
from strata.cpu.hybrid_tier import make_host_tier  # noqa: E402
from strata.cpu.rope import rope_table  # noqa: E402
from strata.cpu.tier import rope_inv_freq  # noqa: E402
from strata.engine.engine import Engine  # noqa: E402
from strata.gpu.attention import (  # noqa: E402
    DEC_SHORT_GRID,
    AttnWorkspace,
    attention,
    attention_decode,
    attention_ref,
)
from strata.gpu.budget import DeviceBudget  # noqa: E402
from strata.gpu.cupy_tier import CupyTier  # noqa: E402
from strata.gpu.rope_kv import RopeScaling, qk_norm_rope_kv  # noqa: E402
from strata.model.loader import load_model  # noqa: E402
from strata.model.synth import make_args  # noqa: E402
from strata.routing.topk import route as route_picks  # noqa: E402
from tests.oracle import FLIP_BOUND, position_errors  # noqa: E402

pytestmark = pytest.mark.gpu
SHAPE = "tiny-gpt-oss"  # window 8, YaRN


def rel(a, b) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max())


@pytest.fixture(scope="module")
def model(synth_model):
    return load_model(synth_model(SHAPE, "MXFP4", dense="Q8_0", seed=5))


def test_gpt_oss_lacks_nothing_on_the_card(model):
    a = model.args
    assert a.rope_scaling == "yarn" and a.attn_sinks and any(a.swa_layers)
    assert card_lacks(a) is None


def test_yarn_rope_matches_the_host_table(K):
    h, g, dh, t, pos0 = 4, 2, 64, 5, 3000
    rng = np.random.default_rng(1)
    qkv = rng.standard_normal((t, (h + 2 * g) * dh)).astype(np.float32)
    a = make_args("gpt-oss-20b")  # its YaRN
    table = rope_table(a)
    q = cp.zeros((t, h, dh), np.float32)
    kc, vc = cp.zeros((g, pos0 + t, dh), np.uint16), cp.zeros((g, pos0 + t, dh), np.uint16)
    inv = cp.asarray(rope_inv_freq(dh, a.rope_theta))
    qk_norm_rope_kv(K, cp.asarray(qkv), t, (h, g, dh, dh), None, None, 1e-6, inv, pos0, q, kc,
                    vc, scaling=RopeScaling.of(cp, table))  # fmt: skip
    cos, sin = table.cos_sin(pos0, t)  # [T, Dh/2]
    x = qkv[:, : h * dh].reshape(t, h, dh)
    x0, x1 = x[..., : dh // 2], x[..., dh // 2 :]
    c, s = cos[:, None], sin[:, None]
    want = np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)
    assert table.mscale != 1 and table.ramp is not None
    assert rel(cp.asnumpy(q), want) < 2e-3  # q is rounded to f16
    k = cp.asnumpy(kc[:, pos0:]).view(np.float16).astype(np.float32).transpose(1, 0, 2)
    xk = qkv[:, h * dh : (h + g) * dh].reshape(t, g, dh)
    k0, k1 = xk[..., : dh // 2], xk[..., dh // 2 :]
    assert rel(k, np.concatenate([k0 * c - k1 * s, k0 * s + k1 * c], axis=-1)) < 2e-3


@pytest.mark.parametrize("window", [0, 8, 100])
def test_attention_with_sinks_and_window_matches_the_reference(K, window):
    """Prompt kernels (query chunks past the window) and decode (the split grid and the short
    one-launch kernel) against attention_ref with the same window and sinks."""
    h, g, dh, s_cap, t = 8, 2, 64, 160, 12
    rng = np.random.default_rng(window)
    k = rng.standard_normal((s_cap, g, dh)).astype(np.float16)
    v = rng.standard_normal((s_cap, g, dh)).astype(np.float16)
    sinks = rng.standard_normal(h).astype(np.float32) * 2
    kc = cp.asarray(np.ascontiguousarray(k.transpose(1, 0, 2)).view(np.uint16))
    vc = cp.asarray(np.ascontiguousarray(v.transpose(1, 0, 2)).view(np.uint16))
    ws = AttnWorkspace(cp, K, h, g, s_cap, dh, t)
    dims, scale, sk = (h, g, dh, dh), 0.125, cp.asarray(sinks)
    for pos0 in (0, 40):
        q = rng.standard_normal((t, h, dh)).astype(np.float16).astype(np.float32)
        out = cp.zeros((t, h * dh), np.float32)
        attention(K, ws, cp.asarray(q), kc, vc, t, pos0, dims, scale, out, window=window,
                  sinks=sk)  # fmt: skip
        s = pos0 + t
        want = attention_ref(q, k[:s], v[:s], pos0, scale, window, sinks)
        assert rel(cp.asnumpy(out), want) < 2e-3, pos0
    pos_dev = cp.zeros((1,), np.int32)
    for pos, grid in ((5, DEC_SHORT_GRID), (20, DEC_SHORT_GRID), (150, ws.dec_grids[-1])):
        ws.dec_nsplit = grid
        pos_dev[0] = pos
        q = rng.standard_normal((1, h, dh)).astype(np.float16).astype(np.float32)
        out = cp.zeros((1, h * dh), np.float32)
        attention_decode(K, ws, cp.asarray(q), kc, vc, pos_dev, dims, scale, out, window=window,
                         sinks=sk)  # fmt: skip
        want = attention_ref(q, k[: pos + 1], v[: pos + 1], pos, scale, window, sinks)
        assert rel(cp.asnumpy(out), want) < 2e-3, (pos, grid)


def test_tier_layers_match_the_host_tier(model, device):
    """Attention (a sliding and a full layer, a prompt past the window, then a decode step),
    router with its bias, and the experts (biases, clamped SwiGLU) at T = 1 and in the grouped
    prompt kernels: each against HostTier on the same inputs."""
    a = model.args
    host = make_host_tier(model, 64)
    budget = DeviceBudget(total_mib=2048, runtime_reserve_mib=512, slack_mib=256)
    dev = CupyTier(model, 64, budget, device=device)
    rng = np.random.default_rng(3)
    for layer in range(a.n_layer):
        x = rng.standard_normal((12, a.n_embd)).astype(np.float32)
        assert rel(dev.attention(layer, x, 0), host.attention(layer, x, 0)) < 1e-3, layer
        x1 = rng.standard_normal((1, a.n_embd)).astype(np.float32)
        assert rel(dev.attention(layer, x1, 12), host.attention(layer, x1, 12)) < 1e-3, layer
        hh, lh = host.router(layer, x)
        hd, ld = dev.router(layer, x)
        assert rel(ld, lh) < 1e-4 and rel(hd, hh) < 1e-5
        ids, w, _ = route_picks(lh, a.n_expert_used, a.norm_topk, a.gating)
        # the top-K of the logits and a softmax over those K, on the card (router_topk.cu),
        # against the host's rule on the card's own logits
        di, dw, _ = route_picks(ld, a.n_expert_used, a.norm_topk, a.gating)
        _, pid, pw = dev.router_picks(layer, x)
        assert np.array_equal(pid, di) and rel(pw, dw) < 1e-5
        # router, top-K and the grouped experts with nothing read back (moe_on_card)
        _, yc = dev.moe_on_card(layer, x)
        assert rel(yc, host.experts(layer, hh, di, dw)) < 1e-3
        for t in (1, 12):  # decode kernels, then the grouped ones (T > GROUPED_MIN_T)
            want = host.experts(layer, hh[:t], ids[:t], w[:t])
            got = dev.experts(layer, hh[:t], ids[:t], w[:t])
            assert rel(got, want) < 1e-3, (layer, t)


def lockstep_greedy(host: Engine, dev, prompt: list[int], steps: int) -> None:
    """Both engines fed the host's greedy tokens: every step within FLIP_BOUND, and the GPU's
    greedy token the host's except at a near-tie (the host's gap no more than twice the
    step's error)."""
    hl, dl = host.forward(prompt), dev.forward(prompt)
    for step in range(steps):
        err = position_errors(dl[None], hl[None])[0]
        assert err <= FLIP_BOUND, (step, err)
        tok, mine = int(np.argmax(hl)), int(np.argmax(dl))
        gap = (hl[tok] - hl[mine]) / np.abs(hl).max()
        assert tok == mine or gap <= 2 * err, (step, tok, mine)
        hl, dl = host.forward([tok]), dev.forward([tok])


def card_engine(model, cache: str, graphs: bool):
    flags = dict(device="gpu", n_ctx=64, adapt_swaps=0, threads=2, expert_cache=cache,
                 cuda_graphs=graphs)  # fmt: skip
    e = build_engine(model, resolve(flags, env={}))
    assert e.tier.name == "cupy" and (e.miss_runner is e.tier) == (cache == "all")
    return e


@pytest.mark.parametrize("cache", ["all", "8"])
def test_engine_greedy_tokens_match_the_host_tier(model, device, cache):
    """build_engine on the card with eager decode: every expert resident, or 8 of 16 with the
    rest in the CPU pool; the prompt (12 tokens) and 12 decode steps pass the window of 8."""
    dev = card_engine(model, cache, graphs=False)
    host = Engine(model, n_ctx=64)
    prompt = np.random.default_rng(11).integers(0, model.args.n_vocab, 12).tolist()
    lockstep_greedy(host, dev, prompt, 12)


@pytest.mark.parametrize("cache,kind", [("all", "all"), ("8", "hybrid")])
def test_graph_decode_steps_match_eager_decode(model, device, cache, kind):
    """The graph steps (all resident: top-K and the softmax over the picks on the card; hybrid:
    routed on the host, the pairs' experts uploaded with their slots) against eager decode.
    The emulator has no graphs: there the graph steps' launches run eagerly (`replay` off)."""
    g, e = card_engine(model, cache, graphs=True), card_engine(model, cache, graphs=False)
    assert g.graph_step is not None and g.graph_step.kind == kind and e.graph_step is None
    if getattr(cp, "__emulated__", False):
        g.tier.graph_decoder().replay = False
    prompt = np.random.default_rng(12).integers(0, model.args.n_vocab, 6).tolist()
    lg, le = g.forward(prompt), e.forward(prompt)
    assert np.array_equal(lg, le)  # prompts are eager on both
    for step in range(12):
        tok = int(np.argmax(le))
        lg, le = g.forward([tok]), e.forward([tok])
        assert position_errors(lg[None], le[None])[0] <= 1e-4, step
    assert g.stats.graph_steps == 12
