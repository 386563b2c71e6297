"""Hostile model files: every header value a reader divides by, allocates by or loops over is
checked before use; each bad file is one `strata: error:` line and exit 2, fast, never a hang."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace

import gguf
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as QT
from gguf.constants import Keys

from strata.cli.main import main
from strata.model.errors import (
    BadMetadata,
    CorruptFile,
    ModelError,
    NotGGUF,
    TensorTypeError,
)
from strata.model.loader import load_model
from strata.model.synth import SynthSpec, make_args, write_synthetic
from tests.gguf_edit import rewrite_gguf
from tests.gguf_mutate import nested_array_gguf, with_field
from tests.strata_cli import run_strata

REPO = Path(__file__).resolve().parents[1]
ARCH = "qwen3moe"


def _key(k: str) -> str:
    return k.format(arch=ARCH)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> SimpleNamespace:
    """A tiny model (2 layers, Q4_K experts) with an explicit general.alignment, as bytes."""
    root = tmp_path_factory.mktemp("hostile")
    spec = SynthSpec(make_args("tiny", n_vocab=512), expert_quant=QT.Q4_K)
    tiny = write_synthetic(root / "tiny.gguf", spec, progress=False)[0]
    aligned = rewrite_gguf(tiny, root / "aligned.gguf", meta={Keys.General.ALIGNMENT: 32})
    return SimpleNamespace(root=root, path=aligned, data=aligned.read_bytes())


def _file(base, name: str, data: bytes) -> Path:
    p = base.root / f"{name}.gguf"
    p.write_bytes(data)
    return p


def _norm_as_q8_0(base) -> bytes:
    """attn_norm stored as Q8_0: sizes consistent, the type one a norm never has."""
    nm = "blk.0.attn_norm.weight"
    w = np.ones(256, np.float32)
    q = gguf.quants.quantize(w, QT.Q8_0)
    out = rewrite_gguf(
        base.path, base.root / "q8norm.gguf", drop=[nm], extra_tensors={nm: (q, QT.Q8_0)}
    )
    return out.read_bytes()


# name -> (make the bytes from the base model's, error class, words the message names)
CASES = {
    "head_count_0": (
        lambda b: with_field(b.data, _key(Keys.Attention.HEAD_COUNT), "scalar", 0),
        BadMetadata,
        ("head_count",),
    ),
    "block_count_0": (
        lambda b: with_field(b.data, _key(Keys.LLM.BLOCK_COUNT), "scalar", 0),
        BadMetadata,
        ("block_count = 0",),
    ),
    "block_count_2^32-1": (
        lambda b: with_field(b.data, _key(Keys.LLM.BLOCK_COUNT), "scalar", 2**32 - 1),
        BadMetadata,
        ("block_count", "4294967295"),
    ),
    "block_count_one_short": (
        lambda b: with_field(b.data, _key(Keys.LLM.BLOCK_COUNT), "scalar", 1),
        BadMetadata,
        ("block_count is 1", "holds 2 layers"),
    ),
    "alignment_0": (
        lambda b: with_field(b.data, Keys.General.ALIGNMENT, "scalar", 0),
        CorruptFile,
        ("general.alignment = 0", "power of two"),
    ),
    "alignment_3": (
        lambda b: with_field(b.data, Keys.General.ALIGNMENT, "scalar", 3),
        CorruptFile,
        ("general.alignment = 3",),
    ),
    "arrays_nested_20000_deep": (lambda b: nested_array_gguf(20_000), CorruptFile, ("nested",)),
    "expert_tensor_typed_f32": (
        lambda b: with_field(b.data, "blk.0.ffn_gate_exps.weight", "ggml_type", int(QT.F32)),
        ModelError,
        ("blk.0.ffn_gate_exps", "F32"),
    ),
    "norm_typed_q8_0": (_norm_as_q8_0, TensorTypeError, ("blk.0.attn_norm", "Q8_0")),
    "rms_eps_nan": (
        lambda b: with_field(b.data, _key(Keys.Attention.LAYERNORM_RMS_EPS), "float", np.nan),
        BadMetadata,
        ("layer_norm_rms_epsilon = nan",),
    ),
    "rope_theta_inf": (
        lambda b: with_field(b.data, _key(Keys.Rope.FREQ_BASE), "float", np.inf),
        BadMetadata,
        ("freq_base = inf",),
    ),
    "offset_moved_one_byte": (
        lambda b: with_field(
            b.data, "blk.0.attn_q.weight", "offset", _offset(b.data, "blk.0.attn_q.weight") + 1
        ),
        CorruptFile,
        ("blk.0.attn_q.weight", "aligned to 32"),
    ),
    "context_length_0": (
        lambda b: with_field(b.data, _key(Keys.LLM.CONTEXT_LENGTH), "scalar", 0),
        BadMetadata,
        ("context_length = 0",),
    ),
    "n_kv_2^64-1": (
        lambda b: with_field(b.data, "", "n_kv", 2**64 - 1),
        ModelError,
        ("key-value pairs",),
    ),
    "token_list_2^63_long": (
        lambda b: with_field(b.data, Keys.Tokenizer.LIST, "arr_len", 2**63),
        ModelError,
        ("values in tokenizer.ggml.tokens",),
    ),
}


def _offset(data: bytes, tensor: str) -> int:
    from tests.gguf_mutate import header_fields

    f = next(f for f in header_fields(data)[0] if f.label == tensor and f.kind == "offset")
    return int.from_bytes(data[f.pos : f.pos + f.size], "little")


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_header_is_refused_at_load_in_one_line(base, case):
    make, err, words = CASES[case]
    path = _file(base, case, make(base))
    t0 = time.perf_counter()
    with pytest.raises(err) as e:
        load_model(path)
    assert time.perf_counter() - t0 < 2.0  # fails fast: nothing loops over a hostile count
    msg = str(e.value)
    assert "\n" not in msg and path.name in msg
    for w in words:
        assert w in msg, msg


@pytest.mark.parametrize("case", list(CASES))
def test_inspect_and_generate_of_a_hostile_file_exit_2_with_one_line(base, case, capsys):
    path = base.root / f"{case}.gguf"
    if not path.exists():
        path = _file(base, case, CASES[case][0](base))
    for argv in (["inspect", str(path)], ["generate", "x", "-n", "1", "--model", str(path)]):
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and len(err.splitlines()) == 1 and err.startswith("strata: error: ")


def test_context_length_0_names_the_key_not_a_ctx_flag_never_given(base, capsys):
    path = _file(base, "ctx0", CASES["context_length_0"][0](base))
    assert main(["generate", "x", "-n", "1", "--model", str(path)]) == 2
    err = capsys.readouterr().err
    assert "context_length" in err and "--ctx" not in err


def test_the_unchanged_base_loads(base):
    model = load_model(base.path)
    assert model.args.n_layer == 2


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_a_named_pipe_as_the_model_is_refused_not_waited_on(tmp_path):
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    with pytest.raises(NotGGUF, match="not a regular file"):
        load_model(fifo)
    for argv in (["inspect", str(fifo)], ["generate", "x", "-n", "1", "--model", str(fifo)]):
        r = run_strata(*argv, timeout=60)  # a hang would blow the timeout
        assert r.returncode == 2, r.stderr
        assert r.stderr.startswith("strata: error: ") and len(r.stderr.splitlines()) == 1
        assert "not a regular file" in r.stderr
