"""The batched CPU engine (strata/engine/batch.py): every sequence of a batch, joining and leaving
between steps at its own position, gets the tokens it gets alone from the single-sequence
`Engine` built the same way; prefix reuse changes no token; KvFull changes nothing; the paged
attention is the tier's bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from strata.config import ConfigError, resolve
from strata.cpu.paged_kv import PagedKv
from strata.cpu.runner import PoolMissRunner
from strata.cpu.tier import HostTier
from strata.engine.batch import BatchEngine, KvFull
from strata.engine.engine import Engine
from strata.engine.sampling import Sampler, SamplingParams
from strata.model.loader import load_model
from strata.routing.car import CarKnobs

N_CTX = 96
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def model():
    from strata.cli.common import DEFAULT_MODEL

    return load_model(DEFAULT_MODEL)


@pytest.fixture(scope="module")
def tiers(model):
    """kv type -> a HostTier (dense on the pool's kernels), shared by both engines."""
    return {kv: HostTier(model, n_ctx=N_CTX, kv_type=kv, dense="quant") for kv in ("f16", "int8")}


@pytest.fixture(scope="module")
def runner(model):
    return PoolMissRunner(model)


TEXTS = (
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea, there lived",
    "import numpy as np\nimport",
    "# Sort a list of numbers in Python\n",
)
SYSTEM = (
    "You are a careful assistant. Answer in one short sentence, cite no sources, and say so "
    "when you do not know the answer to a question.\n"
)


def _prompts(model, texts=TEXTS):
    return {s: model.tokenizer.encode(t) for s, t in enumerate(texts)}


def _alone(eng: Engine, prompt, n_new, chunk, params=GREEDY, logits=None):
    """`prompt` in chunks of `chunk` tokens (as the batch prefills it), then n_new - 1 decode
    steps on the single-sequence engine -> n_new tokens (their logits appended to `logits`)."""
    eng.reset()
    pick = Sampler(params)
    for c in range(0, len(prompt), chunk):
        out = eng.forward(prompt[c : c + chunk])
    toks = []
    while True:
        if logits is not None:
            logits.append(out)
        toks.append(pick(out))
        if len(toks) == n_new:
            return toks
        out = eng.forward([toks[-1]])


def _batched(be: BatchEngine, prompts, n_new, joins, chunk, params=None, logits=None):
    """Admit sequence s before decode step joins[s] (prefilled in chunks), decode every running
    sequence each step, release one once it has its n_new[s] tokens -> tokens by sequence
    (their logits appended to logits[s])."""
    params = params or {}
    picks = {s: Sampler(params.get(s, GREEDY)) for s in prompts}
    out: dict[int, list[int]] = {s: [] for s in prompts}

    def take(s, row):
        if logits is not None:
            logits.setdefault(s, []).append(row.copy())
        out[s].append(picks[s](row))

    running: list[int] = []
    step = 0
    while step <= max(joins.values()) or running:
        for s in [s for s, j in joins.items() if j == step]:
            be.admit(s, prompts[s])
            row = None
            while row is None:
                row = be.prefill(s, chunk)
            take(s, row)
            running.append(s)
        for s in [s for s in running if len(out[s]) >= n_new[s]]:
            be.release(s)
            running.remove(s)
        if running:
            rows = be.decode(running, [out[s][-1] for s in running])  # [B, V]
            for b, s in enumerate(running):
                take(s, rows[b])
        step += 1
    return out


# sequence 0 alone (B = 1), then 1 joins (B = 2), then 2 and 3 (B = 4); they leave unevenly
JOINS = {0: 0, 1: 2, 2: 4, 3: 4}
N_NEW = {0: 9, 1: 12, 2: 6, 3: 10}


def _pool_only(model):
    return np.zeros((model.args.n_layer, model.args.n_expert), bool)


def test_batch_rows_are_each_sequences_alone_bit_for_bit(model, tiers, runner):
    """Every expert in the CPU pool: the logits of every sequence at every step equal the
    single-sequence engine's eager path exactly (the rows never mix)."""
    res = _pool_only(model)
    eng = Engine(model, tiers["f16"], miss_runner=runner, resident=res)
    eng.host_step = None  # the layer-by-layer path: the same kernels, row by row
    prompts = _prompts(model)
    want: dict[int, list] = {s: [] for s in prompts}
    for s, p in prompts.items():
        _alone(eng, p, N_NEW[s], 5, logits=want[s])
    be = BatchEngine(
        model, tiers["f16"], n_ctx=N_CTX, max_batch=4, miss_runner=runner, resident=res
    )
    got: dict[int, list] = {}
    _batched(be, prompts, N_NEW, JOINS, 5, logits=got)
    for s in prompts:
        assert np.array_equal(np.stack(got[s]), np.stack(want[s])), s


@pytest.mark.parametrize("pool", [True, False], ids=["cpu-pool", "tier-experts"])
def test_batch_tokens_equal_each_sequence_alone(model, tiers, runner, pool):
    res = _pool_only(model) if pool else None
    kw = dict(miss_runner=runner if pool else None, resident=res)
    eng = Engine(model, tiers["f16"], **kw)
    assert (eng.host_step is not None) == pool  # the compiled step decodes alone there
    prompts = _prompts(model)
    want = {s: _alone(eng, p, N_NEW[s], 7) for s, p in prompts.items()}
    be = BatchEngine(model, tiers["f16"], n_ctx=N_CTX, max_batch=4, **kw)
    assert _batched(be, prompts, N_NEW, JOINS, 7) == want
    st = be.stats
    assert st.batch_steps > 0 and st.batch_rows > st.batch_steps and st.kv_blocks_used == 0


def test_int8_kv_batch_tokens_equal_alone(model, tiers, runner):
    res = _pool_only(model)
    eng = Engine(model, tiers["int8"], miss_runner=runner, resident=res)
    prompts = _prompts(model, TEXTS[:3])
    n_new = {0: 8, 1: 8, 2: 8}
    want: dict[int, list] = {s: [] for s in prompts}
    toks = {s: _alone(eng, p, 8, 4, logits=want[s]) for s, p in prompts.items()}
    be = BatchEngine(
        model, tiers["int8"], n_ctx=N_CTX, max_batch=3, miss_runner=runner, resident=res
    )
    assert be.kv.kv_type == "int8"
    got: dict[int, list] = {}
    assert _batched(be, prompts, n_new, {0: 0, 1: 0, 2: 1}, 4, logits=got) == toks
    for s in prompts:  # the int8 tier decodes eagerly alone: the same rows exactly
        assert np.array_equal(np.stack(got[s]), np.stack(want[s])), s


@pytest.mark.parametrize("threshold", [1.0, 0.35])
def test_car_batch_tokens_equal_alone(model, tiers, runner, threshold):
    """Half the experts on the tier, the rest in the pool; CAR off (1.0) and on (the ratio rule,
    which substitutes row by row alike in a batch)."""
    a = model.args
    res = _pool_only(model)
    res[:, : a.n_expert // 2] = True
    car = CarKnobs(threshold, mode="ratio")
    eng = Engine(model, tiers["f16"], miss_runner=runner, resident=res, car=car)
    prompts = _prompts(model, TEXTS[:3])
    n_new = {0: 8, 1: 8, 2: 8}
    want = {s: _alone(eng, p, 8, 7) for s, p in prompts.items()}
    be = BatchEngine(model, tiers["f16"], n_ctx=N_CTX, miss_runner=runner, resident=res, car=car)
    assert _batched(be, prompts, n_new, {0: 0, 1: 1, 2: 1}, 7) == want
    assert (be.engine_stats.substitutions > 0) == (threshold < 1.0)


def test_seeded_sampled_sequences_equal_alone(model, tiers, runner):
    res = _pool_only(model)
    eng = Engine(model, tiers["f16"], miss_runner=runner, resident=res)
    prompts = _prompts(model, TEXTS[:3])
    params = {s: SamplingParams(temperature=0.8, seed=100 + s) for s in prompts}
    n_new = {0: 10, 1: 10, 2: 10}
    want = {s: _alone(eng, p, 10, 7, params[s]) for s, p in prompts.items()}
    joins = {0: 0, 1: 0, 2: 3}
    be = BatchEngine(model, tiers["f16"], n_ctx=N_CTX, miss_runner=runner, resident=res)
    got = _batched(be, prompts, n_new, joins, 7, params=params)
    assert got == want
    assert got != _batched(be, prompts, n_new, joins, 7)  # the sampler did sample


def test_prefix_reuse_gives_the_tokens_of_no_reuse(model, tiers, runner):
    """Three questions after one system prompt (two full blocks of 16 and more): the later two
    reuse the blocks they share with an earlier one and prefill from there in the chunks of 16
    the first ran, so their logits are exactly those of a run without the cache."""
    res = _pool_only(model)
    tok = model.tokenizer
    system = tok.encode(SYSTEM)
    assert 32 < len(system) < 48
    questions = ("What is 2 + 2?", "Name a color.", "Why is the sky blue?")
    prompts = {s: system + tok.encode(q) for s, q in enumerate(questions)}
    assert prompts[0][:48] == prompts[2][:48] != prompts[1][:48]  # "What", "Why": 3 blocks
    n_new = {s: 6 for s in prompts}
    cold: dict[int, list] = {}
    for s, p in prompts.items():  # a fresh engine each: nothing to reuse
        be = BatchEngine(model, tiers["f16"], n_ctx=N_CTX, miss_runner=runner, resident=res)
        _batched(be, {s: p}, n_new, {s: 0}, 16, logits=cold)
        assert be.stats.prefix_hit_tokens == 0
    be = BatchEngine(model, tiers["f16"], n_ctx=N_CTX, miss_runner=runner, resident=res)
    warm: dict[int, list] = {}
    _batched(be, {0: prompts[0]}, n_new, {0: 0}, 16, logits=warm)  # its blocks stay cached
    _batched(be, {1: prompts[1], 2: prompts[2]}, n_new, {1: 0, 2: 1}, 16, logits=warm)
    assert be.stats.prefix_hit_tokens == 32 + 48
    for s in prompts:
        assert np.array_equal(np.stack(warm[s]), np.stack(cold[s])), s
    assert be.admit(9, prompts[0]) == 48  # its own prompt again: every full block
    assert be.stats.prefix_hit_tokens == 32 + 48 + 48


def test_kv_full_changes_nothing_and_the_batch_goes_on(model, tiers, runner):
    res = _pool_only(model)
    prompts = {0: list(range(10, 25)), 1: list(range(40, 48))}  # 15 and 8 tokens
    eng = Engine(model, tiers["f16"], miss_runner=runner, resident=res)
    want = {s: _alone(eng, p, 6, 32) for s, p in prompts.items()}
    be = BatchEngine(
        model, tiers["f16"], n_ctx=N_CTX, kv_blocks=3, block_size=16, miss_runner=runner,
        resident=res,
    )  # fmt: skip
    with pytest.raises(KvFull):  # 51 positions: 4 blocks
        be.admit(7, list(range(50)))
    assert be.stats.kv_blocks_used == 0 and not be.blocks.seqs
    out = {s: [] for s in prompts}
    for s, p in prompts.items():
        be.admit(s, p)
        out[s].append(int(np.argmax(be.prefill(s, 32))))
    be.admit(2, [5, 6, 7])  # takes the third block
    late = int(np.argmax(be.prefill(2, 8)))
    logits = be.decode([0, 1], [out[0][-1], out[1][-1]])  # 15 -> 16, 8 -> 9: no new block
    for b, s in enumerate((0, 1)):
        out[s].append(int(np.argmax(logits[b])))
    tables = {s: list(be.blocks.table(s)) for s in (0, 1, 2)}
    blocks, stats = be.kv.k.copy(), (be.stats.batch_steps, be.stats.kv_blocks_used)
    pos = {s: be.position(s) for s in (0, 1, 2)}
    with pytest.raises(KvFull):  # seq 0's position 16 needs a fourth block
        be.decode([0, 1, 2], [out[0][-1], out[1][-1], late])
    assert {s: list(be.blocks.table(s)) for s in (0, 1, 2)} == tables
    assert np.array_equal(be.kv.k, blocks)
    assert (be.stats.batch_steps, be.stats.kv_blocks_used) == stats
    assert {s: be.position(s) for s in (0, 1, 2)} == pos
    be.release(2)  # the scheduler preempts the newest; the others go on unchanged
    while len(out[0]) < 6:
        logits = be.decode([0, 1], [out[0][-1], out[1][-1]])
        for b, s in enumerate((0, 1)):
            out[s].append(int(np.argmax(logits[b])))
    assert out == want


@pytest.mark.parametrize("kv", ["f16", "int8"])
@pytest.mark.parametrize("arch", ["qwen3moe", "gpt-oss"])
def test_paged_attention_is_the_tiers_bit_for_bit(synth_model, kv, arch):
    """A shuffled block table, a prompt in two chunks then single tokens: the same x out as the
    tier's own cache (gpt-oss: sinks and a sliding window of 8 on odd layers)."""
    over = {"sliding_window": 8} if arch == "gpt-oss" else {}
    m = load_model(synth_model("tiny", "Q4_K", arch=arch, seed=7, **over))
    a = m.args
    tier = HostTier(m, n_ctx=40, kv_type=kv)
    bs = 4
    pool = PagedKv(a, 16, bs, kv)
    table = np.random.default_rng(8).permutation(16)[:10].astype(np.intp)
    rng = np.random.default_rng(9)
    for pos0, t in ((0, 13), (13, 9), (22, 1), (23, 1), (24, 1)):
        x = rng.standard_normal((t, a.n_embd)).astype(np.float32)
        for i in range(a.n_layer):
            assert np.array_equal(
                tier.attention(i, x, pos0), pool.attention(tier, i, x, pos0, table)
            )


def test_refusals(model, synth_model):
    from strata.build import build_batch_engine

    with pytest.raises(ConfigError, match="CPU-only"):
        build_batch_engine(model, resolve({"device": "gpu"}, env={}), 4)
    hybrid = load_model(synth_model("tiny-qwen3next", "Q4_K", arch="qwen3next"))
    with pytest.raises(ConfigError, match="DeltaNet"):
        build_batch_engine(hybrid, resolve({"device": "host"}, env={}), 4)
    with pytest.raises(ValueError, match="DeltaNet"):
        BatchEngine(hybrid)


def test_build_batch_engine_runs_every_expert_in_the_pool(model):
    from strata.build import build_batch_engine

    cfg = resolve({"device": "host", "n_ctx": 64, "kv_type": "int8"}, env={})
    be = build_batch_engine(model, cfg, 3)
    assert be.max_batch == 3 and be.n_ctx == 64 and be.kv.kv_type == "int8"
    assert isinstance(be.moe.miss_runner, PoolMissRunner) and not be.resident.any()
    assert be.stats.kv_blocks_total == 3 * 4
    with pytest.raises(ValueError, match="n_ctx"):
        be.admit(0, list(range(64)))


@pytest.mark.parametrize("arch", ["qwen2moe", "gpt-oss"])
def test_other_architectures_batch_bit_for_bit(synth_model, arch):
    """qwen2moe's shared expert and attention biases; gpt-oss's sinks, expert biases and a
    sliding window of 8 over blocks of 4 (its first keys start inside the table)."""
    over = {"sliding_window": 8} if arch == "gpt-oss" else {}
    m = load_model(synth_model("tiny", "Q4_K", arch=arch, seed=11, **over))
    a = m.args
    tier = HostTier(m, n_ctx=48, dense="quant")
    pool, res = PoolMissRunner(m), _pool_only(m)
    eng = Engine(m, tier, miss_runner=pool, resident=res)
    eng.host_step = None
    rng = np.random.default_rng(12)
    prompts = {s: rng.integers(0, a.n_vocab, 5 + 6 * s).tolist() for s in range(3)}
    n_new = {0: 14, 1: 9, 2: 12}
    want: dict[int, list] = {s: [] for s in prompts}
    for s, p in prompts.items():
        _alone(eng, p, n_new[s], 3, logits=want[s])
    be = BatchEngine(m, tier, n_ctx=48, max_batch=3, block_size=4, miss_runner=pool, resident=res)
    got: dict[int, list] = {}
    _batched(be, prompts, n_new, {0: 0, 1: 1, 2: 3}, 3, logits=got)
    for s in prompts:
        assert np.array_equal(np.stack(got[s]), np.stack(want[s])), s


def test_a_preempted_sequence_resumes_from_its_cached_blocks(model, tiers, runner):
    """Released mid-decode and admitted again with its prompt plus the tokens it made (the
    scheduler's preemption), a sequence reuses its own full blocks and goes on with the tokens
    it would have made (the resumed tail runs as a prompt chunk: equal to float noise)."""
    res = _pool_only(model)
    prompt = model.tokenizer.encode(TEXTS[1])  # 23 tokens
    be = BatchEngine(model, tiers["f16"], n_ctx=N_CTX, miss_runner=runner, resident=res)
    want = _batched(be, {0: prompt}, {0: 24}, {0: 0}, 8)[0]
    be = BatchEngine(model, tiers["f16"], n_ctx=N_CTX, miss_runner=runner, resident=res)
    made = _batched(be, {0: prompt}, {0: 12}, {0: 0}, 8)[0]  # released after 11 decode steps
    again = prompt + made[:-1]  # 34 tokens whose KV was written, then its last token
    rest = _batched(be, {1: again}, {1: 13}, {1: 0}, 8)[1]
    assert be.stats.prefix_hit_tokens == 32
    assert made + rest[1:] == want
