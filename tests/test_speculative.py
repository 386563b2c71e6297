"""MTP speculative decoding (strata/engine/speculative.py) on the CPU-only tier: greedy tokens
byte-identical to plain decoding, the DeltaNet states and both KV caches rolled back right, the
NextN block's rows rebuilt from the trunk's true rows, counts in the stats, refusals."""

from __future__ import annotations

import numpy as np
import pytest

from strata.build import build_engine
from strata.config import CAR_OFF_NOTICE, ConfigError, resolve
from strata.engine.session import Generation, Session
from strata.engine.speculative import Speculator
from strata.model.loader import load_model

SHAPES = ("tiny-qwen3next", "tiny-qwen35moe")


@pytest.fixture(scope="module", params=SHAPES)
def model(request, synth_model):
    return load_model(synth_model(request.param, "Q4_K", seed=5))


def engine(model, spec: int = 0, min_p: float = 0.0, cache: str | None = None):
    """The CPU-only engine: every expert in the CPU pool, or (cache "all") on the tier."""
    flags = {"device": "host", "n_ctx": 96, "spec": spec, "spec_min_p": min_p}
    return build_engine(model, resolve({**flags, "expert_cache": cache}, {}))


def prompts(model, n: int = 3, seed: int = 50) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, model.args.n_vocab, size=int(rng.integers(3, 12))).tolist()
            for _ in range(n)]  # fmt: skip


def run(session: Session, prompt: list[int], n: int = 24) -> Generation:
    res = Generation()
    for _ in session.generate(prompt, n, result=res):
        pass
    return res


@pytest.fixture(scope="module")
def plain(model):
    """Plain greedy tokens of each prompt, one session (prefix reuse between prompts)."""
    s = Session(model, engine=engine(model))
    return [run(s, p).tokens for p in prompts(model)]


@pytest.mark.parametrize("n", [1, 2, 4])
def test_spec_greedy_tokens_equal_plain_decoding(model, plain, n):
    s = Session(model, engine=engine(model, n))
    got = [run(s, p) for p in prompts(model)]
    assert [g.tokens for g in got] == plain
    st = s.engine.stats
    assert st.spec_steps and st.spec_drafted > 0 and 0 <= st.acceptance <= 1
    assert st.spec_tokens == st.spec_steps + st.spec_accepted
    assert sum(g.drafted for g in got) == st.spec_drafted
    for g in got:
        assert g.tokens_per_verify == pytest.approx((len(g.tokens) - 1) / g.verify_steps)


class Oracle:
    """A drafter that knows the greedy continuation: step j drafts its first `right[j]` tokens
    right and then one wrong token (or all right where right[j] >= n)."""

    def __init__(self, spec: Speculator, want: list[int], right: list[int]):
        self.spec, self.want, self.right, self.j = spec, want, right, 0
        self.base = spec.engine.pos  # the prompt's length: want[0] is the token at base
        self.real = spec._draft

    def __call__(self, p: int, n: int) -> list[int]:
        self.real(p, 1)  # the catch-up of the NextN block runs as ever
        k = self.right[self.j % len(self.right)]
        self.j += 1
        truth = self.want[p - self.base + 1 : p - self.base + 1 + n]
        out = list(truth[: min(k, n)])
        if len(out) < n and len(out) < len(truth):
            out.append((truth[len(out)] + 1) % self.spec.engine.args.n_vocab)
        return out


def test_accepted_and_rejected_drafts_roll_back_to_plain_decoding(model, plain):
    """Every mix of accepted and rejected drafts (none, some, all) leaves the same tokens: the
    KV rows and the DeltaNet states after a partial accept are those of the kept tokens."""
    p0 = prompts(model)[0]
    s = Session(model, engine=engine(model, 4))
    spec = s.engine.spec
    orig_prefill = spec.prefill

    def prefill(tokens, keep):
        out = orig_prefill(tokens, keep)
        spec._draft = Oracle(spec, plain[0], [2, 0, 4, 1, 3])
        return out

    spec.prefill = prefill
    res = run(s, p0)
    assert res.tokens == plain[0]
    assert res.accepted > res.drafted // 2 and res.tokens_per_verify > 2


def test_nextn_rows_come_from_the_trunks_rows_not_the_drafts(model):
    """After speculative decoding, the NextN block's KV rows of the positions it has caught up
    equal a fresh block's rows over the trunk's rows of the same tokens: no row of a chained
    draft (its own hidden row, a draft token) is left behind."""
    from strata.cpu.hybrid_tier import make_host_tier

    s = Session(model, engine=engine(model, 3))
    run(s, prompts(model)[1], 20)
    spec, tier = s.engine.spec, s.engine.tier
    m = spec.nextn_n
    assert m > 8
    fresh = make_host_tier(model, 96, dense="quant")
    fresh.nextn_hidden(spec.h[:m], spec.toks[1 : m + 1], 0)
    row = tier.kv_row[model.args.n_layer]
    np.testing.assert_array_equal(tier.k_cache[row, :m], fresh.k_cache[row, :m])
    np.testing.assert_array_equal(tier.v_cache[row, :m], fresh.v_cache[row, :m])
    # the trunk's rows kept by the decoder are the sequence's, as one prompt computes them
    e2 = engine(model)
    _, h = e2.forward_hidden(spec.toks[: spec.h_n].tolist())
    np.testing.assert_allclose(spec.h[: spec.h_n], h, rtol=0, atol=1e-4)


def test_min_p_stops_drafting(model):
    s = Session(model, engine=engine(model, 4, min_p=1.0))
    run(s, prompts(model)[0], 8)
    assert s.engine.stats.spec_drafted == 0  # no draft is certain


def test_sampled_requests_decode_without_drafts_and_reuse_stays_right(model, plain):
    from strata.engine.sampling import SamplingParams

    s = Session(model, engine=engine(model, 2))
    assert run(s, prompts(model)[0]).tokens == plain[0]
    for _ in s.generate(prompts(model)[0], 6, SamplingParams(temperature=0.8, seed=1)):
        pass
    assert s.engine.stats.spec_steps == len(plain[0]) - 1 - s.engine.stats.spec_accepted
    go_on = [*s.history, *prompts(model)[1]]  # a continuation of the sampled request
    want = run(Session(model, engine=engine(model)), go_on).tokens
    assert run(s, go_on).tokens == want


def test_spec_on_a_model_without_nextn_is_refused_in_one_line(synth_model):
    m = load_model(synth_model("tiny", "Q4_K"))
    with pytest.raises(ConfigError, match="no NextN") as e:
        build_engine(m, resolve({"device": "host", "spec": 2}, {}))
    assert "\n" not in str(e.value)


def test_spec_turns_car_off_and_says_why(model):
    cfg = resolve({"device": "host", "n_ctx": 32}, {"STRATA_SPEC": "2"})
    build_engine(model, cfg)
    assert cfg.car_threshold == 1.0
    assert any(CAR_OFF_NOTICE in n and "--spec" in n for n in cfg.notices)
    with pytest.raises(ConfigError, match="--car-threshold 0.35 cannot apply: --spec"):
        build_engine(model, resolve({"device": "host", "spec": 2, "car_threshold": 0.35}, {}))


def test_spec_settings_are_checked():
    assert resolve({}, {"STRATA_SPEC": "4", "STRATA_SPEC_MIN_P": "0.6"}).spec_min_p == 0.6
    with pytest.raises(ConfigError, match="--spec must be >= 0"):
        resolve({"spec": -1}, {})
    with pytest.raises(ConfigError, match="--spec-min-p must be in"):
        resolve({"spec_min_p": 1.5}, {})


@pytest.mark.parametrize("cache", [None, "all"])
def test_a_verify_forward_gives_each_row_the_bits_of_a_decode_step(model, cache):
    """The trunk's rows of a verify forward equal the logits of the same tokens decoded one by
    one, bit for bit, at lengths either side of the attention sums' blocks of 8, with the
    experts in the CPU pool or on the tier; after `verify_keep(n)` the sequence goes on as if
    only n of them had run."""
    e = engine(model, cache=cache)
    rng = np.random.default_rng(1)
    for n_prompt in (5, 13, 14, 20, 29, 30, 45):
        prompt = rng.integers(0, model.args.n_vocab, n_prompt).tolist()
        more = rng.integers(0, model.args.n_vocab, 5).tolist()
        e.reset()
        e.forward_hidden(prompt)
        snap = e.tier.snapshot()
        one = np.array([e.forward_hidden([t])[0] for t in more])  # [5, V]
        e.reset(keep=e.tier.restore(snap))
        e.tier.verify_begin()
        many, _ = e.forward_hidden(more, all_logits=True)  # [5, V]
        np.testing.assert_array_equal(many, one)
        e.reset(keep=n_prompt + 2)
        e.tier.verify_keep(2)
        nxt, _ = e.forward_hidden(more[2:3])
        np.testing.assert_array_equal(nxt, one[2])


def test_cli_refuses_spec_without_nextn_and_reports_acceptance_with_it(synth_model, capsys):
    from strata.cli.main import main

    plain = str(synth_model("tiny", "Q4_K"))
    assert main(["generate", "def f", "-m", plain, "-n", "4", "--spec", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("strata: error: --spec 2:") and "no NextN" in err and "\n" not in err
    mtp = str(synth_model("tiny-qwen3next", "Q4_K", seed=5))
    argv = ["generate", "x", "-m", mtp, "-n", "12", "--ctx", "64", "--device", "host", "--stats"]
    assert main([*argv, "--spec", "3", "--spec-min-p", "0.1"]) == 0
    err = capsys.readouterr().err
    assert "spec: accepted" in err and "tok a verify step" in err
    assert CAR_OFF_NOTICE in err and "--spec" in err


def test_the_shared_expert_gives_each_row_the_bits_of_its_own_step(model):
    """The sigmoid gate of the shared expert sums each row on its own: in a matrix-vector
    product the sums of a row change with T, and a router near a tie turns that into another
    expert (measured: a different greedy token 91 tokens into a run of --spec 2)."""
    tier = engine(model).tier
    h = np.random.default_rng(7).standard_normal((5, model.args.n_embd)).astype(np.float32)
    for layer in range(model.args.n_layer):
        many = tier.shared_expert(layer, h)  # [5, D]
        one = np.concatenate([tier.shared_expert(layer, h[t : t + 1]) for t in range(5)])
        np.testing.assert_array_equal(many, one)


def test_metrics_count_drafts_and_verify_steps():
    from strata.engine.stats import EngineStats
    from strata.serve.metrics import Metrics

    st = EngineStats(spec_steps=4, spec_tokens=7, spec_drafted=8, spec_accepted=3)
    assert st.acceptance == 3 / 8 and st.tokens_per_verify == 7 / 4
    text = Metrics().render(queued=0, active=0, slots=1, engine_stats=[st, None])
    for line in ("strata_spec_drafted_total 8", "strata_spec_accepted_total 3",
                 "strata_spec_verify_steps_total 4", "strata_spec_tokens_total 7"):  # fmt: skip
        assert line in text.splitlines()
