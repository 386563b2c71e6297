"""Opening GGUF models: ModelArgs from metadata, zero-copy tensors, shard sets, one-line errors."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.constants import GGMLQuantizationType as QT
from gguf.constants import Keys

from strata.model.errors import ModelError, ShardError
from strata.model.gguf_file import GGUFModel
from strata.model.loader import load_model
from strata.model.synth import SynthSpec, make_args, write_synthetic
from strata.quant import UnsupportedType, fmt
from tests.gguf_edit import BAD_MODEL_CASES, assemble_set, bad_models, rewrite_gguf, shard_name

STEM = "tiny"


def _write(dir_: Path, quant: QT = QT.IQ3_XXS, split: int = 0, arch: str = "qwen3moe") -> Path:
    spec = SynthSpec(make_args("tiny", arch), expert_quant=quant, split_max_tensors=split)
    dir_.mkdir(parents=True)
    return write_synthetic(dir_ / f"{STEM}.gguf", spec, progress=False)[0]


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> SimpleNamespace:
    """Tiny synthetic models, written once: one file, and shard sets of it and of other quants."""
    root = tmp_path_factory.mktemp("loading")
    ns = SimpleNamespace(root=root)
    ns.single = _write(root / "single")
    ns.qwen2 = _write(root / "qwen2", arch="qwen2moe")
    ns.split10 = _write(root / "split10", split=10)  # 27 tensors: 10 + 10 + 7
    ns.split9 = _write(root / "split9", split=9)  # same shard count, other tensors in each
    ns.q4k_split10 = _write(root / "q4k_split10", QT.Q4_K, split=10)
    ns.q4k_split7 = _write(root / "q4k_split7", QT.Q4_K, split=7)  # 4 shards
    ns.bad = bad_models(ns.single, root / "bad")
    return ns


def _shards(first: Path) -> list[Path]:
    return sorted(first.parent.glob(f"{STEM}-*-of-*.gguf"))


# ---- what a valid model gives ----


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen2moe"])
def test_model_args_match_the_synthetic_shape(models, arch):
    model = load_model(models.single if arch == "qwen3moe" else models.qwen2)
    want = make_args("tiny", arch)
    for f in dataclasses.fields(want):
        if f.name == "extra":
            continue
        got, exp = getattr(model.args, f.name), getattr(want, f.name)
        if isinstance(exp, float):
            assert got == pytest.approx(exp, rel=1e-6), f.name  # stored as float32
        else:
            assert got == exp, f.name
    assert model.args.shared_ff == (0 if arch == "qwen3moe" else 2 * want.expert_ff)


def test_every_tensor_has_the_shape_and_byte_size_its_type_implies(models):
    model = load_model(models.single)
    assert set(model.gguf.tensors) == set(model.expected)
    for tname, t in model.gguf.tensors.items():
        assert t.shape == model.expected[tname]
        assert t.nbytes == fmt(t.qtype).tensor_bytes(t.shape)
    assert model.tensor("blk.1.ffn_down_exps.weight").qtype == QT.IQ3_XXS


def _memmap_base(a: np.ndarray) -> np.memmap | None:
    while a is not None:
        if isinstance(a, np.memmap) and a.base is not None and not isinstance(a.base, np.ndarray):
            return a  # the array that owns the mmap itself
        a = a.base
    return None


def test_tensors_are_views_into_the_file_mapping_not_copies(models):
    model = load_model(models.single)
    mapping = model.gguf.readers[0].mm
    assert isinstance(mapping, np.memmap) and mapping.mode == "r"
    for tname, t in model.gguf.tensors.items():
        assert not t.data.flags.owndata, tname
        assert np.shares_memory(t.data, mapping), tname
        assert _memmap_base(t.data) is not None, tname
        assert not t.data.flags.writeable, tname


def test_tensor_views_hold_the_bytes_at_their_file_offset(models):
    model = load_model(models.single)
    raw = np.fromfile(models.single, dtype=np.uint8)
    for info in GGUFReader(models.single).tensors:
        t = model.gguf.tensors[info.name]
        start = int(info.data_offset)
        assert np.array_equal(t.raw().reshape(-1), raw[start : start + t.nbytes]), info.name


def test_fast_header_reader_agrees_with_gguf_reader(models):
    """Our header reader (fast on 151k-token vocabularies) reads what gguf.GGUFReader reads."""
    from strata.model.gguf_reader import GGUFHeader

    ours, theirs = GGUFHeader(models.single), GGUFReader(models.single)
    want = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
    assert ours.fields == want
    assert ours.data_offset == theirs.data_offset
    for mine, t in zip(ours.tensors, theirs.tensors, strict=True):
        assert (mine.name, mine.ggml_type, mine.ne) == (t.name, int(t.tensor_type), tuple(t.shape))
        assert ours.data_offset + mine.offset == t.data_offset


# ---- shard sets ----


def test_shard_set_loads_from_its_first_shard_with_the_single_file_tensors(models):
    shards = _shards(models.split10)
    assert [p.name for p in shards] == [shard_name(STEM, k, 3) for k in (1, 2, 3)]
    one, split = load_model(models.single), load_model(models.split10)
    assert split.gguf.paths == shards
    assert split.args == one.args
    assert set(split.gguf.tensors) == set(one.gguf.tensors)
    for tname, t in split.gguf.tensors.items():
        u = one.gguf.tensors[tname]
        assert (t.qtype, t.shape) == (u.qtype, u.shape), tname
        assert np.array_equal(t.raw(), u.raw()), tname
        assert np.shares_memory(t.data, split.gguf.readers[t.shard].mm), tname
    assert {t.shard for t in split.gguf.tensors.values()} == {0, 1, 2}


def test_any_shard_of_a_set_opens_the_whole_set(models):
    second = _shards(models.split10)[1]
    assert GGUFModel(second).paths == _shards(models.split10)


def test_a_missing_shard_is_an_error_naming_it(models, tmp_path):
    s = _shards(models.split10)
    first = assemble_set(tmp_path, STEM, [s[0], None, s[2]])
    with pytest.raises(ShardError) as e:
        load_model(first)
    assert shard_name(STEM, 2, 3) in str(e.value)
    assert shard_name(STEM, 3, 3) not in str(e.value)


def test_shards_of_two_differently_split_sets_are_refused(models, tmp_path):
    a, b = _shards(models.split10), _shards(models.split9)
    first = assemble_set(tmp_path, STEM, [a[0], b[1], a[2]])
    with pytest.raises(ModelError) as e:
        load_model(first)
    assert isinstance(e.value, ShardError)
    assert shard_name(STEM, 2, 3) in str(e.value)


def test_a_shard_from_a_set_of_another_size_and_quant_is_refused(models, tmp_path):
    a, b = _shards(models.split10), _shards(models.q4k_split7)
    first = assemble_set(tmp_path, STEM, [a[0], b[1], a[2]])
    with pytest.raises(ShardError, match="set of 4 shards") as e:
        load_model(first)
    assert shard_name(STEM, 2, 3) in str(e.value)


def test_a_shard_recording_another_file_type_is_refused(models, tmp_path):
    """Tools that copy the metadata into every shard record the quant there: it must agree."""
    a, b = _shards(models.split10), _shards(models.q4k_split10)
    fields = GGUFReader(b[1]).fields
    split_meta = {k: fields[k].contents() for k in fields if k.startswith("split.")}
    other = rewrite_gguf(
        b[1],
        tmp_path / "b2.gguf",
        arch="qwen3moe",
        meta={**split_meta, Keys.General.FILE_TYPE: int(QT.Q4_K)},
    )
    first = assemble_set(tmp_path / "set", STEM, [a[0], other, a[2]])
    with pytest.raises(ShardError, match="file type") as e:
        load_model(first)
    assert shard_name(STEM, 2, 3) in str(e.value)


@pytest.mark.xfail(
    strict=True,
    reason="shards after the first carry only split.* metadata: two "
    "sets split the same way differ in nothing but their tensor types",
)
def test_a_shard_of_another_quant_split_the_same_way_is_refused(models, tmp_path):
    a, b = _shards(models.split10), _shards(models.q4k_split10)
    first = assemble_set(tmp_path, STEM, [a[0], b[1], a[2]])
    with pytest.raises(ShardError):
        load_model(first)


def test_a_file_named_as_a_shard_needs_its_siblings(models, tmp_path):
    """A name NAME-00001-of-00002.gguf makes a file shard 1 of 2, whatever its metadata says."""
    lone = tmp_path / shard_name(STEM, 1, 2)
    shutil.copyfile(models.single, lone)
    with pytest.raises(ShardError, match=shard_name(STEM, 2, 2)):
        load_model(lone)


# ---- bad files: the right error, one line, naming the file or tensor ----

BAD = list(BAD_MODEL_CASES)  # every case tests/gguf_edit.py builds


@pytest.mark.parametrize("case", BAD)
def test_a_bad_model_is_refused_with_a_one_line_reason(models, case):
    bad = models.bad[case]
    with pytest.raises((ModelError, UnsupportedType)) as e:
        load_model(bad.path)
    assert type(e.value) is bad.error
    msg = str(e.value)
    assert "\n" not in msg and msg.strip() == msg
    for needle in bad.names:
        assert needle in msg


def test_the_catalogue_covers_every_bad_case(models):
    assert sorted(models.bad) == sorted(BAD)


def test_an_unchanged_rewrite_loads_like_its_source(models, tmp_path):
    """The test utility itself: a copy with no edits is the same model."""
    copy = rewrite_gguf(models.single, tmp_path / "copy.gguf")
    a, b = load_model(models.single), load_model(copy)
    assert a.args == b.args and a.metadata == b.metadata
    for tname, t in a.gguf.tensors.items():
        assert np.array_equal(t.raw(), b.gguf.tensors[tname].raw())


def test_each_architecture_is_one_registered_module_with_the_same_interface():
    from strata.model import arch

    assert list(arch.ARCHS) == ["qwen3moe", "qwen2moe", "qwen3next", "qwen35moe", "gpt-oss"]
    for key, mod in arch.ARCHS.items():
        assert mod.ARCH == key and mod.__name__ == f"strata.model.arch.{key.replace('-', '_')}"
        assert set(mod.TRAITS) >= {"qk_norm", "qkv_bias", "norm_topk", "shared_expert"}
        a = make_args("tiny" if key in ("qwen3moe", "qwen2moe") else f"tiny-{key}", key)
        assert mod.layer_tensors(a, 0) and mod.global_tensors(a) and mod.OPTIONAL
    with pytest.raises(
        ModelError,
        match="unsupported architecture 'llama'.*qwen3moe, qwen2moe, qwen3next, qwen35moe, gpt-oss",
    ):
        arch.get("llama")
