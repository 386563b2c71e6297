"""The expert pack (experts.bin + experts.bin.src.json), the pool reading it, resident RAM mode."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import sys

import numpy as np
import pytest
from gguf.constants import MODEL_TENSOR as MT

from strata.cpu.pack import (
    PACK_FILE,
    PAGE,
    SRC_FILE,
    PackError,
    PackWarning,
    build_pack,
    open_pack,
)
from strata.cpu.runner import PoolMissRunner
from strata.model.loader import load_model

QUANTS = ["IQ3_XXS", "IQ1_M", "Q4_K", "MXFP4"]
ROLES = (MT.FFN_GATE_EXP, MT.FFN_UP_EXP, MT.FFN_DOWN_EXP)


@pytest.fixture(scope="module")
def packed(synth_model, tmp_path_factory):
    """packed(quant) -> (model, pack dir) built once per quant (release "swift")."""
    cache = {}

    def make(quant):
        if quant not in cache:
            model = load_model(synth_model("tiny", quant))
            d = tmp_path_factory.mktemp(f"pack-{quant}")
            seen = []
            build_pack(model, d, release="swift", progress=lambda done, total: seen.append(done))
            assert seen and seen == sorted(seen)  # bytes written so far, after each chunk
            cache[quant] = (model, d)
        return cache[quant]

    return make


def _copy_pack(src, dst):
    shutil.copytree(src, dst)
    return dst


def _routes(model, t, seed):
    """ids [T, K] (some -1: picks another tier runs) and weights [T, K]."""
    a = model.args
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.choice(a.n_expert, a.n_expert_used, replace=False) for _ in range(t)])
    ids[rng.random(ids.shape) < 0.2] = -1
    w = rng.uniform(0.1, 1.0, ids.shape).astype(np.float32)
    h = rng.standard_normal((t, a.n_embd)).astype(np.float32)
    return h, ids, w


def _all_layers(runner, model, h, ids, w):
    return [runner.experts(i, h, ids, w).copy() for i in range(model.args.n_layer)]


@pytest.mark.parametrize("quant", QUANTS)
def test_every_packed_matrix_reads_back_as_the_gguf_bytes(packed, quant):
    model, d = packed(quant)
    pack = open_pack(d, model, release="swift")
    for i, lw in enumerate(pack.layers):
        for m, role in zip((lw.gate, lw.up, lw.down), ROLES, strict=True):
            t = model.tensor(role, i)
            assert not m.data.flags.writeable  # a view into the read-only mmap
            assert m.data.ctypes.data % PAGE == 0  # every region starts on a page
            assert np.array_equal(m.gguf_rows(), t.raw())
    src = json.loads((d / SRC_FILE).read_text())
    assert src["quant"] == quant and src["release"] == "swift"
    assert src["shards"] == [{"name": model.path.name, "size": model.path.stat().st_size}]


@pytest.mark.parametrize("quant", QUANTS)
def test_pool_results_with_the_pack_equal_those_from_the_gguf(packed, quant):
    model, d = packed(quant)
    h, ids, w = _routes(model, 5, seed=1)
    want = _all_layers(PoolMissRunner(model, 2), model, h, ids, w)
    runner = PoolMissRunner(model, 2, pack=d, release="swift")
    assert runner.source == "pack"
    got = _all_layers(runner, model, h, ids, w)
    for a, b in zip(got, want, strict=True):
        assert np.array_equal(a, b)


def _resident_pages(arr: np.ndarray) -> np.ndarray:
    """mincore(2) over the pages of arr: True where the page is backed by RAM."""
    libc = ctypes.CDLL(None, use_errno=True)
    addr, n = arr.ctypes.data, arr.nbytes
    assert addr % PAGE == 0
    pages = -(-n // PAGE)
    vec = (ctypes.c_ubyte * pages)()
    rc = libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(n), vec)
    assert rc == 0, os.strerror(ctypes.get_errno())
    return np.frombuffer(vec, np.uint8) & 1 == 1


@pytest.mark.parametrize("source", ["pack", "gguf"])
@pytest.mark.parametrize("quant", ["IQ3_XXS", "Q4_K"])
def test_resident_mode_copies_only_the_cpu_experts_and_computes_the_same(packed, quant, source):
    model, d = packed(quant)
    a = model.args
    skip = np.zeros((a.n_layer, a.n_expert), bool)  # [L, E]: experts the device holds
    skip[0, : a.n_expert // 2] = True
    skip[1, 1:] = True
    runner = PoolMissRunner(
        model, 2, pack=d if source == "pack" else None, resident_experts=True, skip=skip
    )
    assert runner.source == "ram"
    per_expert = [lw.expert_nbytes for lw in runner.layers]
    assert runner.ram_bytes == sum((~skip[i]).sum() * per_expert[i] for i in range(a.n_layer))
    if sys.platform == "linux":  # the left-out experts' pages hold no RAM
        for i, lw in enumerate(runner.layers):
            for m in (lw.gate, lw.up, lw.down):
                backed = _resident_pages(m.data)
                eb = m.expert_nbytes
                for e in np.flatnonzero(skip[i]):
                    first, last = -(-e * eb // PAGE), (e + 1) * eb // PAGE  # pages inside e
                    assert not backed[first:last].any(), (i, e)
    h, ids, w = _routes(model, 4, seed=2)
    ids[:, 0] = 0  # expert 0 of layer 0 was left out (device-resident): evicted since, say
    want = _all_layers(PoolMissRunner(model, 2), model, h, ids, w)
    before = runner.ram_bytes
    got = _all_layers(runner, model, h, ids, w)
    for x, y in zip(got, want, strict=True):
        assert np.array_equal(x, y)
    assert runner.ram_bytes > before  # the evicted expert was copied in on its first miss


def _edit_src(d, **changes):
    p = d / SRC_FILE
    src = json.loads(p.read_text())
    src.update(changes)
    p.write_text(json.dumps(src))


def test_a_pack_of_other_shards_is_refused(packed, tmp_path):
    model, d = packed("IQ3_XXS")
    other = tmp_path / "renamed.gguf"
    shutil.copyfile(model.path, other)
    with pytest.raises(PackError, match=r"names other source shards: .*renamed\.gguf"):
        open_pack(d, load_model(other))
    p = _copy_pack(d, tmp_path / "sized")
    _edit_src(p, shards=[{"name": model.path.name, "size": 12345}])
    with pytest.raises(PackError, match="other source shards"):
        open_pack(p, model)


def test_a_pack_of_another_quant_release_or_format_is_refused(packed, tmp_path):
    model, d = packed("IQ3_XXS")
    with pytest.raises(PackError, match="pack of release 'swift', this run is release 'qwen'"):
        open_pack(d, model, release="qwen")
    open_pack(d, model)  # no release asked: not checked
    q = _copy_pack(d, tmp_path / "quant")
    _edit_src(q, quant="IQ3_S")
    with pytest.raises(PackError, match="pack of IQ3_S experts, the model's are IQ3_XXS"):
        open_pack(q, model)
    f = _copy_pack(d, tmp_path / "format")
    _edit_src(f, format="strata-experts-0")
    with pytest.raises(PackError, match="format 'strata-experts-0'.*rebuild"):
        open_pack(f, model)
    b = _copy_pack(d, tmp_path / "magic")
    with open(b / PACK_FILE, "r+b") as fh:
        fh.write(b"GGUF")
    with pytest.raises(PackError, match="not a strata expert pack"):
        open_pack(b, model)
    other = load_model(packed("IQ1_M")[0].path)  # a pack of another model entirely
    with pytest.raises(PackError, match="other source shards"):
        open_pack(d, other)


def test_a_pack_built_with_simd_repacks_is_refused_on_a_host_without(packed):
    model, d = packed("IQ3_XXS")
    lay = json.loads((d / SRC_FILE).read_text())["layouts"]["IQ3_XXS"]  # lut4, or pm (AVX-512)
    if lay == "gguf":
        pytest.skip("this host packs IQ3_XXS in the GGUF layout (no SIMD)")
    with pytest.raises(PackError, match=rf"{lay} layout.*read gguf.*strata pack MODEL -o DIR"):
        open_pack(d, model, simd=False)


def test_a_pack_without_src_json_loads_with_a_warning_naming_it(packed, tmp_path):
    model, d = packed("Q4_K")
    p = _copy_pack(d, tmp_path / "nosrc")
    (p / SRC_FILE).unlink()
    with pytest.warns(PackWarning, match=r"experts\.bin\.src\.json: missing"):
        pack = open_pack(p, model, release="anything")
    assert pack.src is None and len(pack.layers) == model.args.n_layer


def test_strata_pack_refuses_a_non_empty_dir_without_force(synth_model, tmp_path, capsys):
    from strata.cli.main import main

    gguf = str(synth_model("tiny", "Q4_K"))
    out = tmp_path / "p"
    assert main(["pack", gguf, "-o", str(out), "--release", "swift"]) == 0
    first = (out / PACK_FILE).read_bytes()
    assert main(["pack", gguf, "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("strata: error:") and "--force" in err and "\n" not in err
    assert main(["pack", gguf, "-o", str(out), "--force", "--release", "qwen"]) == 0
    assert json.loads((out / SRC_FILE).read_text())["release"] == "qwen"
    assert len((out / PACK_FILE).read_bytes()) == len(first)


def test_a_failed_build_leaves_nothing_half_written(synth_model, tmp_path, monkeypatch, capsys):
    import strata.cpu.pack as pk
    from strata.cli.main import main

    gguf = str(synth_model("tiny", "Q4_K"))
    old = tmp_path / "old"
    assert main(["pack", gguf, "-o", str(old)]) == 0
    before = {p.name: p.read_bytes() for p in old.iterdir()}
    calls = []
    real = pk.expert_rows

    def failing(*a, **k):
        calls.append(1)
        if len(calls) > 2:
            raise OSError("No space left on device")
        return real(*a, **k)

    monkeypatch.setattr(pk, "expert_rows", failing)
    assert main(["pack", gguf, "-o", str(old), "--force"]) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in old.iterdir()} == before  # old pack intact, no temps
    calls.clear()
    new = tmp_path / "new"
    assert main(["pack", gguf, "-o", str(new)]) == 2
    assert not new.exists()


def test_pack_flags_reach_the_engine_config_and_beat_the_environment():
    from strata.cli.common import engine_config as _engine_config
    from strata.cli.main import build_parser
    from strata.config import resolve

    env = {"STRATA_PACK": "packs/env", "STRATA_RELEASE": "qwen", "STRATA_RESIDENT_EXPERTS": "1"}
    cfg = resolve({}, env)
    assert (cfg.pack, cfg.release, cfg.resident_experts) == ("packs/env", "qwen", True)
    assert resolve({}, {"STRATA_RESIDENT_EXPERTS": "0"}).resident_experts is False
    ns = build_parser().parse_args(
        ["generate", "x", "--pack", "packs/flag", "--release", "swift", "--resident-experts"]
    )
    cfg = _engine_config(ns)
    assert (cfg.pack, cfg.release, cfg.resident_experts) == ("packs/flag", "swift", True)
    ns = build_parser().parse_args(["serve", "--pack", "packs/s", "--resident-experts"])
    from strata.cli.serve import serve_options

    cfg = serve_options(ns, environ={"STRATA_RELEASE": "coder"})["config"]
    assert (cfg.pack, cfg.release, cfg.resident_experts) == ("packs/s", "coder", True)


def test_the_engine_builds_its_pool_on_the_pack(packed):
    from strata.build import build_engine
    from strata.config import resolve

    model, d = packed("IQ3_XXS")
    flags = dict(device="host", expert_cache="4", pack=str(d), release="swift")
    eng = build_engine(model, resolve(flags, {}))
    assert eng.miss_runner.source == "pack"
    with pytest.raises(PackError, match="release"):
        build_engine(model, resolve(dict(flags, release="qwen"), {}))
    cfg = resolve(dict(flags, resident_experts=True), {})
    runner = build_engine(model, cfg).miss_runner
    a = model.args
    assert runner.source == "ram"
    # the host tier holds 4 experts: they are left out of the RAM copy
    held = a.n_layer * a.n_expert - 4
    assert runner.ram_bytes == held * runner.layers[0].expert_nbytes


def test_importing_the_pack_pulls_in_no_gpu_engine_or_server():
    import subprocess

    code = (
        "import sys, strata.cpu.pack\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('cupy', 'starlette', 'uvicorn')\n"
        "       or m.startswith(('strata.engine', 'strata.gpu', 'strata.serve'))]\n"
        "sys.exit(str(bad) if bad else 0)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
