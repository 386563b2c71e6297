"""A fixed-seed mutation fuzzer of GGUF headers: thousands of mutants of small models, each
through `strata inspect`'s code path (load, report) and the tokenizer, in this process.

Every mutant must load or be refused with the product's own one-line error (ModelError or
UnsupportedType): no other exception, no hang past 20 s, no signal (a crash would end pytest).
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from gguf.constants import GGMLQuantizationType as QT

from strata.cli.common import DEFAULT_MODEL, load
from strata.cli.inspect import report
from strata.model.errors import ModelError
from strata.model.synth import SynthSpec, make_args, write_synthetic
from strata.quant import UnsupportedType
from tests.gguf_mutate import header_fields, mutants

HANG_S = 20
SEED = 48


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang(f"no answer in {HANG_S} s")


def fuzz(src: Path, work: Path, n: int, seed: int) -> tuple[Counter, list[str], float]:
    """Run n mutants of src's header through load + report + tokenizer. Returns the outcome
    counts (by error class, or "loads"), the unexpected ones and the slowest mutant's seconds."""
    data = src.read_bytes()
    _, end = header_fields(data)
    work.write_bytes(data)
    outcomes: Counter = Counter()
    bad: list[str] = []
    slowest = 0.0
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        for i, (what, buf) in enumerate(mutants(data, n, seed)):
            with open(work, "r+b") as f:  # only the header changes: rewrite it in place
                f.write(buf[:end])
            t0 = time.perf_counter()
            signal.alarm(HANG_S)
            try:
                model = load(str(work))
                report(model)
                model.tokenizer  # noqa: B018 (built on first use)
                outcomes["loads"] += 1
            except (ModelError, UnsupportedType) as e:
                outcomes[type(e).__name__] += 1
                if "\n" in str(e):
                    bad.append(f"#{i} {what}: a message of several lines")
            except Exception as e:  # noqa: BLE001 (what the fuzzer is looking for)
                outcomes[f"unexpected {type(e).__name__}"] += 1
                bad.append(f"#{i} {what}: {type(e).__name__}: {e}"[:300])
            finally:
                signal.alarm(0)
            slowest = max(slowest, time.perf_counter() - t0)
    finally:
        signal.signal(signal.SIGALRM, old)
    return outcomes, bad, slowest


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fuzz")
    out = {"default.gguf": DEFAULT_MODEL}
    for arch, quant in (("qwen3moe", QT.Q4_K), ("qwen2moe", QT.IQ3_XXS)):
        spec = SynthSpec(make_args("tiny", arch, n_vocab=512), expert_quant=quant)
        out[arch] = write_synthetic(root / f"{arch}.gguf", spec, progress=False)[0]
    return out


# mutants per base model: 2,400 in all
PLAN = {"qwen3moe": 1200, "qwen2moe": 800, "default.gguf": 400}


@pytest.mark.skipif(not hasattr(signal, "SIGALRM"), reason="needs SIGALRM for the hang guard")
def test_mutated_headers_load_or_fail_in_one_line_never_crash_or_hang(bases, tmp_path):
    total: Counter = Counter()
    problems: list[str] = []
    t0 = time.perf_counter()
    slowest = 0.0
    for k, (name, n) in enumerate(PLAN.items()):
        outcomes, bad, slow = fuzz(bases[name], tmp_path / f"{name}.mut", n, SEED + k)
        total += outcomes
        problems += [f"{name} {b}" for b in bad]
        slowest = max(slowest, slow)
    took = time.perf_counter() - t0
    summary = f"{sum(total.values())} mutants in {took:.1f} s (slowest {slowest:.2f} s): " + (
        ", ".join(f"{k} {v}" for k, v in total.most_common())
    )
    print(summary)
    assert not problems, summary + "\n" + "\n".join(problems[:30])
    assert sum(total.values()) == sum(PLAN.values()) >= 2000
    assert slowest < HANG_S
    # the mutants reach past the header parser: metadata, tensor and type checks all fire
    for kind in ("TruncatedFile", "CorruptFile", "BadMetadata", "UnsupportedType", "loads"):
        assert total[kind] > 0, summary
