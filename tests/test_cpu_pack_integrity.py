"""A pack is what its model's experts prepare into, or it is refused: content hashes in src.json,
checked at load and by `strata pack --verify`; a killed build leaves nothing that loads wrong."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from gguf.constants import MODEL_TENSOR as MT

from strata.cli.main import main
from strata.cpu.pack import (
    PACK_FILE,
    SRC_FILE,
    PackError,
    PackWarning,
    build_pack,
    open_pack,
    temporaries,
)
from strata.cpu.pack_check import BLOCK, root
from strata.model.loader import load_model

REPO = Path(__file__).resolve().parents[1]
ROLES = (MT.FFN_GATE_EXP, MT.FFN_UP_EXP, MT.FFN_DOWN_EXP)


@pytest.fixture(scope="module")
def built(synth_model, tmp_path_factory):
    model = load_model(synth_model("tiny", "Q4_K"))
    d = tmp_path_factory.mktemp("pack")
    build_pack(model, d)
    return model, d


def _copy(d: Path, dst: Path) -> Path:
    shutil.copytree(d, dst)  # copy2: sizes and mtimes kept, as a plain `cp -a` would
    return dst


def _same_bytes_as_the_model(pack, model) -> bool:
    return all(
        np.array_equal(m.gguf_rows(), model.tensor(role, i).raw())
        for i, lw in enumerate(pack.layers)
        for m, role in zip((lw.gate, lw.up, lw.down), ROLES, strict=True)
    )


def test_src_json_records_the_source_and_block_hashes(built):
    model, d = built
    src = json.loads((d / SRC_FILE).read_text())
    assert src["hash"] == "blake2b-128"
    (shard,) = src["source"]
    assert shard["size"] == model.path.stat().st_size and len(shard["experts"]) == 32
    rec = src["experts_bin"]
    assert rec["size"] == (d / PACK_FILE).stat().st_size and rec["block_bytes"] == BLOCK
    assert rec["blake2b"] == root(rec["blocks"])
    pack = open_pack(d, model, verify=True)
    assert _same_bytes_as_the_model(pack, model)


def _write_ff(path: Path, at: int, keep_mtime: bool) -> None:
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(b"\xff" * 65536)
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_64_kib_of_0xff_in_experts_bin_is_refused_naming_the_experts(built, tmp_path, capsys):
    model, d = built
    pack = open_pack(d, model)
    last = pack.index["regions"][-1]  # inside the last region, past its first rows (which
    # open_pack compares with the GGUF anyway)
    at = pack.layers[-1].down.data.ctypes.data - pack.mm.ctypes.data + 4096
    assert at + 65536 <= len(pack.mm) and last["nbytes"] > 4096 + 65536
    del pack
    p = _copy(d, tmp_path / "ff")
    _write_ff(p / PACK_FILE, at, keep_mtime=False)
    with pytest.raises(PackError, match=r"changed since the pack was built \(blk\.\d\.ffn_"):
        open_pack(p, model)
    q = _copy(d, tmp_path / "ff_same_mtime")  # a write that even kept the mtime:
    _write_ff(q / PACK_FILE, at, keep_mtime=True)
    with pytest.raises(PackError, match="changed since the pack was built"):
        open_pack(q, model, verify=True)  # --verify hashes every block
    for pack_dir in (p, q):
        assert main(["pack", str(model.path), "-o", str(pack_dir), "--verify"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("strata: error: ") and err.count("\n") == 1


def _flip_one_expert(src: Path, dst: Path, tensor: str, expert: int) -> None:
    """dst: src with one expert's bytes (past its first row) of `tensor` changed."""
    from gguf import GGUFReader

    t = load_model(src).tensor(tensor)
    per = t.nbytes // t.shape[0]
    start = int({x.name: x for x in GGUFReader(src).tensors}[tensor].data_offset)
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as f:
        f.seek(start + expert * per + per // 2)
        f.write(b"\x55" * 64)


def test_a_pack_of_another_file_with_the_same_name_and_size_is_refused(synth_model, tmp_path):
    a = synth_model("tiny", "Q4_K")
    (tmp_path / "m").mkdir()
    path = tmp_path / "m" / "model.gguf"
    shutil.copy2(a, path)
    build_pack(load_model(path), tmp_path / "pack")
    st = path.stat()
    _flip_one_expert(a, tmp_path / "b.gguf", "blk.1.ffn_up_exps.weight", 5)
    os.replace(tmp_path / "b.gguf", path)  # same name, same size, one expert differs
    assert path.stat().st_size == st.st_size
    other = load_model(path)
    with pytest.raises(PackError, match="other expert bytes than model.gguf"):
        open_pack(tmp_path / "pack", other)  # the mtime moved: every expert byte hashed
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # even with the old mtime,
    with pytest.raises(PackError, match="other expert bytes than model.gguf"):
        open_pack(tmp_path / "pack", other, verify=True)  # which `strata pack --verify` asks


def test_a_stale_temporary_is_no_content_and_the_next_build_removes_it(synth_model, tmp_path):
    gguf = str(synth_model("tiny", "Q4_K"))
    out = tmp_path / "p"
    out.mkdir()
    stale = out / f".{PACK_FILE}.{'ab' * 16}.tmp"
    stale.write_bytes(b"\0" * 4096)
    assert main(["pack", gguf, "-o", str(out)]) == 0  # not "directory is not empty"
    assert temporaries(out) == [] and sorted(q.name for q in out.iterdir()) == [PACK_FILE, SRC_FILE]
    stale.write_bytes(b"\0" * 4096)
    (out / f".{SRC_FILE}.{'cd' * 16}.tmp").write_text("{")
    assert main(["pack", gguf, "-o", str(out), "--force"]) == 0
    assert temporaries(out) == []


def test_pack_verify_passes_a_good_pack_and_writes_nothing(built, capsys):
    model, d = built
    before = {q.name: q.stat().st_mtime_ns for q in d.iterdir()}
    assert main(["pack", str(model.path), "-o", str(d), "--verify"]) == 0
    assert ": ok," in capsys.readouterr().out
    assert {q.name: q.stat().st_mtime_ns for q in d.iterdir()} == before


# ---- SIGKILL at random points of `strata pack` ----

KILLS = 10


def _pack_cmd(model: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "strata", "pack", str(model), "-o", str(out), "--force"]


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _loads_with_right_bytes_or_is_refused(out: Path, model) -> str:
    if not (out / PACK_FILE).exists():
        return "no pack"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PackWarning)
            pack = open_pack(out, model)
    except PackError:
        return "refused"
    assert _same_bytes_as_the_model(pack, model), "a killed build left a pack of wrong bytes"
    return "loads"


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_sigkill_at_random_points_never_leaves_a_wrong_pack_and_the_next_run_cleans(tmp_path):
    from strata.cli.common import DEFAULT_MODEL

    model = load_model(DEFAULT_MODEL)  # IQ3_XXS experts: a build long enough to land kills in
    out = tmp_path / "pack"
    rng = np.random.default_rng(48)
    seen = []
    for _ in range(KILLS):
        proc = subprocess.Popen(
            _pack_cmd(DEFAULT_MODEL, out),
            env=_env(),
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        t0 = time.monotonic()
        if rng.random() < 0.6:  # once the build writes: somewhere in the write or the renames
            while proc.poll() is None and not temporaries(out) and time.monotonic() - t0 < 60:
                time.sleep(0.005)
            time.sleep(float(rng.uniform(0, 0.6)))
        else:  # anywhere from the start
            time.sleep(float(rng.uniform(0, 3.0)))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        seen.append(
            (
                proc.returncode,
                bool(temporaries(out)),
                _loads_with_right_bytes_or_is_refused(out, model),
            )
        )
    print("kills (rc, temporaries left, the pack then):", seen)
    assert sum(rc == -signal.SIGKILL for rc, _, _ in seen) >= KILLS // 2, seen  # most were killed
    assert any(tmp for _, tmp, _ in seen), seen  # some kills landed while the build wrote
    r = subprocess.run(
        _pack_cmd(DEFAULT_MODEL, out), env=_env(), cwd=REPO, capture_output=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    assert temporaries(out) == []
    assert sorted(q.name for q in out.iterdir()) == [PACK_FILE, SRC_FILE]
    assert _same_bytes_as_the_model(open_pack(out, model, verify=True), model)
