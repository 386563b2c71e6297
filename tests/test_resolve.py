"""`strata resolve`: release order, exact-quant shard selection in a fake hub cache, the offline
error, a check mode that writes nothing, the space gate, and the config the server reads back."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from strata import releases as R
from strata.cli.common import DEFAULT_MODEL
from strata.cli.main import build_parser, main
from strata.cli.serve import serve_options

QWEN = "mradermacher/Qwen3-30B-A3B-i1-GGUF"


def fake_hub(cache: Path, repo: str, names: list[str], rev: str = "abc123") -> Path:
    """huggingface_hub's layout: blobs, snapshots/<rev>/<name> symlinks, refs/main."""
    root = cache / ("models--" + repo.replace("/", "--"))
    snap = root / "snapshots" / rev
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(rev)
    for i, n in enumerate(names):
        blob = root / "blobs" / f"blob{i}"
        blob.write_bytes(b"GGUF" + n.encode())
        link = snap / n
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snap


@pytest.fixture
def env(tmp_path):
    return {"HF_HUB_CACHE": str(tmp_path / "hub"), "STRATA_PACKS_DIR": str(tmp_path / "packs")}


def test_release_order_flag_then_env_then_repo_then_quant_then_default(env):
    tab = R.table()
    assert R.choose_release(None, None, env, tab) == ("swift", "default")
    assert R.choose_release(None, "IQ1_M", env, tab)[0] == "coder"  # coder's default quant
    assert R.choose_release(None, "Q4_K_M", env, tab)[0] == "qwen"  # first release offering it
    e = env | {"STRATA_HF_REPO": "someone/Qwen3-Coder-30B-A3B-Instruct-GGUF"}
    assert R.choose_release(None, "IQ3_S", e, tab) == ("coder", "STRATA_HF_REPO")
    e = env | {"STRATA_RELEASE": "qwen"}
    assert R.choose_release(None, "IQ1_M", e, tab) == ("qwen", "STRATA_RELEASE")
    assert R.choose_release("swift", None, e, tab) == ("swift", "--release")


@pytest.mark.parametrize(
    "release, quant, extra, msg",
    [
        ("llama", None, {}, "'llama' is not a release"),
        (None, None, {"STRATA_RELEASE": "nope"}, "STRATA_RELEASE 'nope' is not a release"),
        ("coder", None, {"STRATA_HF_REPO": "x/Qwen3-30B-A3B-GGUF"}, "is a qwen repository"),
        ("swift", None, {"STRATA_HF_REPO": "x/Mistral-GGUF"}, "swift is embedded"),
        (None, None, {"STRATA_HF_REPO": "x/Mistral-GGUF"}, "cannot tell the release"),
        ("swift", "IQ3_S", {}, "release swift has no quant IQ3_S"),
        ("qwen", "UD-IQ3_XXS", {}, "release qwen has no quant UD-IQ3_XXS"),
        ("qwen", "fp8-ish", {}, "is not a GGUF quant name"),
        (None, "Q3_K_M", {}, "no release offers quant Q3_K_M"),
    ],
)
def test_bad_release_or_quant_is_refused_in_one_line(env, release, quant, extra, msg):
    with pytest.raises(R.ResolveError, match=msg) as e:
        R.resolve(release, quant, env | extra)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "name, quant, ok",
    [
        ("Qwen3-30B-A3B.i1-IQ3_S.gguf", "IQ3_S", True),
        ("Qwen3-30B-A3B.i1-IQ3_XXS.gguf", "IQ3_S", False),
        ("Qwen3-30B-A3B.i1-IQ3_S.gguf", "IQ3_XXS", False),
        ("Qwen3-30B-A3B-UD-IQ3_XXS.gguf", "IQ3_XXS", False),
        ("Qwen3-30B-A3B-UD-IQ3_XXS.gguf", "UD-IQ3_XXS", True),
        ("Qwen3-30B-A3B-IQ3_XXS.gguf", "UD-IQ3_XXS", False),
        ("Q8_0/Qwen3-30B-A3B-Q8_0-00001-of-00002.gguf", "Q8_0", True),
        ("Qwen3-30B-A3B-IQ3_S-00002-of-00003.gguf", "iq3_s", True),
        ("Qwen3-30B-A3B-Q4_K_M.gguf", "Q4_K", False),
        ("Qwen3-30B-A3B-IQ8_0.gguf", "Q8_0", False),
        ("Qwen3-30B-A3B.i1-IQ3_S.gguf.part", "IQ3_S", False),
    ],
)
def test_a_file_matches_only_its_exact_quant_token(name, quant, ok):
    assert R.quant_matches(name, quant) is ok


def test_cache_selects_the_exact_quant_among_cached_siblings(env):
    cache = Path(env["HF_HUB_CACHE"])
    snap = fake_hub(
        cache,
        QWEN,
        [
            "Qwen3-30B-A3B.i1-IQ3_XXS.gguf",
            "Qwen3-30B-A3B-UD-IQ3_S.gguf",
            "Qwen3-30B-A3B.i1-IQ3_S-00002-of-00002.gguf",
            "Qwen3-30B-A3B.i1-IQ3_S-00001-of-00002.gguf",
            "README.md",
        ],
    )
    res = R.resolve("qwen", "IQ3_S", env)
    assert res.files == [
        snap / "Qwen3-30B-A3B.i1-IQ3_S-00001-of-00002.gguf",
        snap / "Qwen3-30B-A3B.i1-IQ3_S-00002-of-00002.gguf",
    ]
    assert R.resolve("qwen", "IQ3_XXS", env).files == [snap / "Qwen3-30B-A3B.i1-IQ3_XXS.gguf"]


def test_a_cached_sibling_quant_is_never_reported_as_the_one_asked_for(env):
    fake_hub(Path(env["HF_HUB_CACHE"]), QWEN, ["Qwen3-30B-A3B.i1-IQ3_XXS.gguf"])
    res = R.resolve("qwen", "IQ3_S", env)  # the default quant, absent; its sibling is cached
    assert not res.present
    with pytest.raises(R.ResolveError, match="IQ3_S"):
        res.require_present()


def test_an_incomplete_shard_set_is_absent_and_names_the_missing_shard(env):
    fake_hub(Path(env["HF_HUB_CACHE"]), QWEN, ["Qwen3-30B-A3B.i1-IQ3_S-00001-of-00002.gguf"])
    res = R.resolve("qwen", "IQ3_S", env)
    assert not res.present
    with pytest.raises(R.ResolveError, match=r"missing shards: Qwen3-30B-A3B\.i1-IQ3_S-00002"):
        res.require_present()


def test_offline_and_absent_fails_with_the_exact_fetch_command(env, capsys):
    e = env | {"HF_HUB_OFFLINE": "1"}
    with pytest.raises(R.ResolveError) as err:
        R.fetch(R.resolve("qwen", None, e))
    msg = str(err.value)
    assert "offline (HF_HUB_OFFLINE=1)" in msg
    assert msg.endswith(f"fetch it with: hf download {QWEN} Qwen3-30B-A3B.i1-IQ3_S.gguf")
    custom = e | {"STRATA_HF_REPO": "unsloth/Qwen3-30B-A3B-GGUF"}
    cmd = R.resolve(None, "UD-IQ3_XXS", custom).fetch_command()
    assert cmd == (
        "hf download unsloth/Qwen3-30B-A3B-GGUF --include '*[-.]UD-IQ3_XXS.gguf' "
        "--include '*[-.]UD-IQ3_XXS-*-of-*.gguf'"
    )


def _tree(root: Path) -> dict:
    return {str(p): (p.is_dir(), p.lstat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def test_check_mode_writes_nothing(env, tmp_path, monkeypatch):
    fake_hub(Path(env["HF_HUB_CACHE"]), QWEN, ["Qwen3-30B-A3B.i1-IQ3_XXS.gguf"])
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    before = _tree(tmp_path)
    assert main(["resolve", "--release", "qwen", "--check"]) == 1  # IQ3_S is absent
    assert main(["resolve", "--release", "qwen", "--quant", "IQ3_XXS", "--check"]) == 0
    assert _tree(tmp_path) == before
    assert not (tmp_path / "packs").exists()


def test_the_space_gate_refuses_before_any_download(env, monkeypatch):
    import huggingface_hub

    res = R.resolve("qwen", None, env)
    monkeypatch.setattr(R, "remote_files", lambda r: [("Qwen3-30B-A3B.i1-IQ3_S.gguf", 13 * R.GB)])
    monkeypatch.setattr(R.shutil, "disk_usage", lambda p: type("U", (), {"free": 40 * R.GB})())
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, **k: pytest.fail("fetched"))
    with pytest.raises(R.ResolveError, match=r"40\.0 GB free.*needs 46\.0 GB there.*20 GB floor"):
        R.fetch(res)


def test_fetch_downloads_only_the_exact_quant_shards_after_the_gate(env, monkeypatch):
    import huggingface_hub

    listing = [
        "Qwen3-30B-A3B.i1-IQ3_XXS.gguf",
        "Qwen3-30B-A3B-UD-IQ3_S-00001-of-00002.gguf",
        "Qwen3-30B-A3B-UD-IQ3_S-00002-of-00002.gguf",
        "Qwen3-30B-A3B.i1-IQ3_S-00001-of-00002.gguf",
        "Qwen3-30B-A3B.i1-IQ3_S-00002-of-00002.gguf",
    ]

    class Api:
        def list_repo_files(self, repo):
            return listing

        def get_paths_info(self, repo, paths):
            return [type("F", (), {"path": p, "size": 7 * R.GB})() for p in paths]

    got = []

    def download(repo, name, cache_dir):
        got.append(name)
        path = Path(cache_dir) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"GGUF")
        return str(path)

    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    monkeypatch.setattr(R.shutil, "disk_usage", lambda p: type("U", (), {"free": 49 * R.GB})())
    # two 7 GB shards + a pack of as much + the floor: 48 GB fits in 49, 50 does not
    big_floor = env | {"STRATA_DISK_FLOOR_GB": "22"}
    with pytest.raises(R.ResolveError, match=r"49\.0 GB free; qwen IQ3_S needs 50\.0 GB"):
        R.fetch(R.resolve("qwen", None, big_floor))
    assert got == []
    files = R.fetch(R.resolve("qwen", None, env))
    assert got == listing[3:] and [p.name for p in files] == listing[3:]


def test_swift_is_embedded_and_names_its_pack_and_model_id(env, monkeypatch):
    res = R.resolve(None, None, env)
    assert (res.release, res.quant, res.model_id) == ("swift", "IQ3_XXS", "swift-iq3_xxs")
    assert res.files == [DEFAULT_MODEL]
    assert res.pack_dir == Path(env["STRATA_PACKS_DIR"]) / "swift-iq3_xxs"
    assert "Python Software Foundation" in res.license
    monkeypatch.setattr(R.shutil, "disk_usage", lambda p: type("U", (), {"free": 0})())
    R.disk_gate(res)  # nothing to download: no space needed


def _serve_cfg(lines: dict[str, str]):
    ns = build_parser().parse_args(["serve"])
    return serve_options(ns, lines)["config"]


def test_the_config_written_is_the_config_the_server_reads(env):
    res = R.resolve("swift", None, env)
    e = env | {"STRATA_ADAPT_SWAPS": "12", "STRATA_CAR_THRESHOLD": "0.5", "STRATA_MODEL": "/x"}
    flags = {"n_ctx": 2048, "vram_budget_mib": 8000, "device": "host", "adapt_swaps": None}
    lines, notes = R.engine_env(res, flags, e)
    assert any("STRATA_MODEL=/x ignored" in n for n in notes)
    cfg = _serve_cfg(lines)
    assert cfg.model == str(DEFAULT_MODEL)  # the release decides the model
    assert cfg.n_ctx == 2048 and cfg.vram_budget_mib == 8000 and cfg.device == "host"  # flags
    assert cfg.adapt_swaps == 12 and cfg.car_threshold == 0.5  # environment over tuning
    assert cfg.expert_cache == "auto"  # swift:IQ3_XXS tuning
    assert lines["STRATA_RELEASE"] == "swift" and "STRATA_PACK" not in lines  # no pack built
    assert cfg.model_id == "swift-iq3_xxs"  # the server answers to the release's model id


def test_unmeasured_combinations_get_conservative_tuning_and_a_warning(env, tmp_path):
    fake_hub(Path(env["HF_HUB_CACHE"]), QWEN, ["Qwen3-30B-A3B.i1-Q4_K_M.gguf"])
    lines, notes = R.engine_env(R.resolve("qwen", "Q4_K_M", env), {}, env)
    assert any("qwen:Q4_K_M is an unmeasured combination" in n for n in notes)
    assert lines["STRATA_EXPERT_CACHE"] == "680" and lines["STRATA_ADAPT_SWAPS"] == "768"


def test_a_built_pack_is_passed_and_an_absent_one_is_not(env):
    pack = Path(env["STRATA_PACKS_DIR"]) / "swift-iq3_xxs"
    assert "STRATA_PACK" not in R.engine_env(R.resolve("swift", None, env), {}, env)[0]
    pack.mkdir(parents=True)
    (pack / "experts.bin").write_bytes(b"x")
    assert R.engine_env(R.resolve("swift", None, env), {}, env)[0]["STRATA_PACK"] == str(pack)


@pytest.mark.parametrize(
    "flags, msg",
    [
        ({"vram_budget_mib": 1280}, "outside the contract's 1281..10240"),
        ({"vram_budget_mib": 10241}, "outside the contract's 1281..10240"),
        ({"n_ctx": 8192}, "--max-context 8192 is unsupported for swift"),
    ],
)
def test_engine_config_refusals(env, flags, msg):
    with pytest.raises(R.ResolveError, match=msg):
        R.engine_env(R.resolve("swift", None, env), flags, env)


def test_print_answers_one_value_for_shell_scripts(env, monkeypatch, capsys):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    for what, want in [("release", "qwen"), ("repo", QWEN), ("model-id", "qwen-iq3_s")]:
        assert main(["resolve", "--release", "qwen", "--print", what]) == 0
        assert capsys.readouterr().out.strip() == want
    assert main(["resolve", "--release", "qwen", "--print", "files"]) == 2
    assert "fetch it with: hf download" in capsys.readouterr().err


# ---- gpt-oss: ggml-org's GGUFs in their native MXFP4 -----------------------------------------

OSS_120B = "ggml-org/gpt-oss-120b-GGUF"
OSS_SHARDS = [f"gpt-oss-120b-mxfp4-{k:05d}-of-00003.gguf" for k in (1, 2, 3)]


def test_gpt_oss_releases_are_chosen_by_name_repo_and_quant(env):
    tab = R.table()
    assert R.choose_release("gpt-oss-120b", None, env, tab)[0] == "gpt-oss-120b"
    e = env | {"STRATA_HF_REPO": "unsloth/gpt-oss-120b-GGUF"}
    assert R.choose_release(None, None, e, tab) == ("gpt-oss-120b", "STRATA_HF_REPO")
    e = env | {"STRATA_HF_REPO": "bartowski/openai_gpt-oss-20b-GGUF"}
    assert R.choose_release(None, None, e, tab) == ("gpt-oss-20b", "STRATA_HF_REPO")
    assert R.choose_release(None, "mxfp4", env, tab) == ("gpt-oss-20b", "quant MXFP4")
    with pytest.raises(R.ResolveError, match="release gpt-oss-20b has no quant Q4_K_M"):
        R.resolve("gpt-oss-20b", "Q4_K_M", env)


@pytest.mark.parametrize(
    "name, ok",
    [
        ("gpt-oss-20b-mxfp4.gguf", True),
        ("gpt-oss-20b-MXFP4.gguf", True),
        ("gpt-oss-120b-mxfp4-00002-of-00003.gguf", True),
        ("gpt-oss-20b-Q4_K_M.gguf", False),
        ("gpt-oss-20bmxfp4.gguf", False),
    ],
)
def test_an_mxfp4_file_matches_only_the_mxfp4_token(name, ok):
    assert R.quant_matches(name, "MXFP4") is ok


def test_the_table_names_the_exact_files_of_each_gpt_oss_release():
    rel = R.table()["releases"]
    for name in ("gpt-oss-20b", "gpt-oss-120b"):
        r = rel[name]
        assert r["quants"] == [r["default_quant"]] == ["MXFP4"]
        complete, missing = R.shard_sets(r["files"], "MXFP4")
        assert complete == [r["files"]] and not missing  # one complete set, in shard order
    assert rel["gpt-oss-120b"]["files"] == OSS_SHARDS


def test_gpt_oss_120b_resolves_its_three_cached_shards_and_not_a_sibling(env):
    snap = fake_hub(
        Path(env["HF_HUB_CACHE"]), OSS_120B, ["gpt-oss-120b-Q8_0.gguf", *OSS_SHARDS[::-1]]
    )
    res = R.resolve("gpt-oss-120b", None, env)
    assert (res.quant, res.model_id, res.license) == ("MXFP4", "gpt-oss-120b-mxfp4", "Apache-2.0")
    assert res.files == [snap / n for n in OSS_SHARDS]
    assert res.pack_dir == Path(env["STRATA_PACKS_DIR"]) / "gpt-oss-120b-mxfp4"


def test_gpt_oss_offline_and_absent_names_every_shard_in_the_fetch_command(env):
    e = env | {"HF_HUB_OFFLINE": "1"}
    with pytest.raises(R.ResolveError) as err:
        R.fetch(R.resolve("gpt-oss-120b", None, e))
    assert str(err.value).endswith(f"fetch it with: hf download {OSS_120B} " + " ".join(OSS_SHARDS))
    res = R.resolve("gpt-oss-20b", None, e)
    assert res.fetch_command() == "hf download ggml-org/gpt-oss-20b-GGUF gpt-oss-20b-mxfp4.gguf"


def test_gpt_oss_engine_config_allows_its_long_context_and_warns_untuned(env):
    fake_hub(Path(env["HF_HUB_CACHE"]), "ggml-org/gpt-oss-20b-GGUF", ["gpt-oss-20b-mxfp4.gguf"])
    res = R.resolve("gpt-oss-20b", None, env)
    lines, notes = R.engine_env(res, {"n_ctx": 131072}, env)
    assert lines["STRATA_CTX"] == "131072" and lines["STRATA_RELEASE"] == "gpt-oss-20b"
    assert any("gpt-oss-20b:MXFP4 is an unmeasured combination" in n for n in notes)
    with pytest.raises(R.ResolveError, match="unsupported for gpt-oss-20b"):
        R.engine_env(res, {"n_ctx": 131073}, env)


def test_gpt_oss_size_estimate_counts_mxfp4_blocks(env):
    res = R.resolve("gpt-oss-120b", None, env)
    assert 60 * R.GB < R.estimate_bytes(res) < 66 * R.GB  # the three shards hold about 63 GB
