"""The `strata` command: generate, chat, synth, car-estimate, profile, and the subcommands of
`strata.cli` (serve, pack, inspect, resolve)."""

from __future__ import annotations

import argparse
import glob
import os
import sys
from pathlib import Path

from strata.cli import inspect, pack, resolve, serve
from strata.cli.common import (
    EXIT_USAGE,
    UserError,
    add_engine,
    add_model,
    build_engine,
    engine_config,
    load,
    one_line,
)
from strata.config import ConfigError
from strata.gpu.budget import BudgetExceeded
from strata.gpu.device import DeviceError
from strata.model.arch import ARCHS
from strata.model.errors import ModelError
from strata.quant import UnsupportedType
from strata.routing.car import DEFAULT_MAX_WEIGHT, DEFAULT_MODE, MODES


def _add_sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--max-tokens", type=int, default=128, help="tokens to generate")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument(
        "--ctx", type=int, default=None, help="context length (default min(train, 4096))"
    )
    p.add_argument("--stats", action="store_true", help="print prefill/decode speed to stderr")
    add_engine(p)


def _sampling(ns):
    from strata.engine.sampling import SamplingParams

    try:
        return SamplingParams(ns.temperature, ns.top_k, ns.top_p, ns.min_p, ns.seed)
    except ValueError as e:
        raise UserError(str(e)) from None


def _stream(ns, prompt) -> int:
    from strata.engine.session import Generation, Session

    if ns.max_tokens < 1:
        raise UserError(f"--max-tokens must be >= 1, got {ns.max_tokens}")
    cfg = engine_config(ns)
    model = load(cfg.model)
    from strata.serve.harmony import uses_harmony

    chat = callable(prompt)
    if chat:  # the prompt is rendered with the model's own template
        prompt = prompt(model)
    session = Session(model, engine=build_engine(model, cfg))
    res = Generation()
    if isinstance(prompt, str):
        sys.stdout.write(prompt)
    harmony = chat and uses_harmony(model.chat_template, model.args.arch)
    out = _HarmonyPrinter() if harmony else None
    for piece in session.generate(prompt, ns.max_tokens, _sampling(ns), ns.stop, res):
        if out:
            out.feed(piece)
        else:
            sys.stdout.write(piece)
            sys.stdout.flush()
    if out:
        out.finish()
    sys.stdout.write("\n")
    session.engine.close()
    if ns.stats:
        st = session.engine.stats
        print(
            f"prompt {res.prompt_tokens} tok, {res.prefill_tps:.1f} tok/s | "
            f"generated {len(res.tokens)} tok, {res.decode_tps:.1f} tok/s | {res.finish_reason} | "
            f"cache hit {st.hit_rate:.1%}, CAR substituted {st.substitution_rate:.1%} of "
            f"decode misses, {st.swaps} swaps | CPU experts a decode layer-window "
            f"{st.cpu_experts_per_window():.2f}"
            + "".join(f", helper {d + 1} hits {n}" for d, n in enumerate(st.helper_hits))
            + (
                f" | host to card {st.link_gbps:.1f} GB/s (gather {st.gather_gbps:.1f} GB/s)"
                if st.link_gbps
                else ""
            )
            + (
                f" | spec: accepted {res.accepted} of {res.drafted} drafts "
                f"({res.acceptance:.1%}), {res.tokens_per_verify:.2f} tok a verify step"
                if res.verify_steps
                else ""
            ),
            file=sys.stderr,
        )
    return 0


class _HarmonyPrinter:
    """A harmony model's chat answer: its reasoning to stderr, its final answer to stdout."""

    def __init__(self) -> None:
        from strata.serve.harmony import HarmonyParser

        self.parser = HarmonyParser(tools=False)

    def feed(self, piece: str) -> None:
        self._show(self.parser.feed(piece))

    def finish(self) -> None:
        self._show(self.parser.finish())

    @staticmethod
    def _show(events) -> None:
        for kind, text in events:  # no tools were offered: no tool calls come out
            (sys.stderr if kind == "reasoning" else sys.stdout).write(text)
        sys.stdout.flush()


def cmd_generate(ns) -> int:
    return _stream(ns, ns.prompt)


def cmd_chat(ns) -> int:
    from strata.serve.harmony import uses_harmony
    from strata.serve.prompt import render_prompt

    msgs = ([{"role": "system", "content": ns.system}] if ns.system else []) + [
        {"role": "user", "content": ns.prompt}
    ]

    def prompt_ids(model) -> list[int]:
        tok = model.tokenizer
        try:
            text = render_prompt(
                msgs,
                model.chat_template,
                bos_token=tok.token_text(tok.bos_id),
                eos_token=tok.token_text(tok.eos_id),
                harmony=uses_harmony(model.chat_template, model.args.arch),
            )
        except ValueError as e:
            raise UserError(str(e)) from None
        return tok.encode(text)

    return _stream(ns, prompt_ids)


def cmd_synth(ns) -> int:
    from strata.engine.synth_routing import write_routed
    from strata.model.synth import SHAPES, SynthSpec, make_args
    from strata.quant import MODEL_TYPES, fmt

    if ns.shape not in SHAPES:
        raise UserError(f"unknown --shape {ns.shape!r} (known: {', '.join(SHAPES)})")
    quant = ns.quant or ("MXFP4" if "gpt-oss" in ns.shape else "Q4_K")  # each model's own
    try:
        qs = [fmt(q).qtype for q in (quant, ns.dense_quant, ns.embd_quant)]
    except UnsupportedType as e:
        raise UserError(str(e)) from None
    for flag, q in zip(("--quant", "--dense-quant", "--embd-quant"), qs, strict=True):
        if q not in MODEL_TYPES:
            raise UserError(f"{flag} {q.name}: an activation-only format, not stored in models")
    args = make_args(ns.shape, ns.arch, n_layer=ns.layers, n_vocab=ns.vocab, n_expert=ns.experts)
    spec = SynthSpec(
        args,
        expert_quant=qs[0],
        dense_quant=qs[1],
        embd_quant=qs[2],
        skew=ns.skew,
        seed=ns.seed,
        split_max_tensors=ns.split_max_tensors,
        routing_entropy=ns.routing_entropy,
    )
    if ns.routing_entropy is not None and not (0 < ns.routing_entropy <= 1 and ns.skew == 0):
        raise UserError("--routing-entropy must be in (0, 1] and goes without --skew")
    out = Path(ns.out)
    existing = [out] if out.exists() else []
    if ns.split_max_tensors > 0:  # shards are named NAME-0000k-of-0000n.gguf
        existing += sorted(out.parent.glob(f"{glob.escape(out.stem)}-*-of-*.gguf"))
    if existing and not ns.force:
        raise UserError(f"{existing[0]}: exists (use --force to overwrite)")
    paths, entropies = write_routed(out, spec, progress=True)
    for p in paths:
        print(f"wrote {p} ({p.stat().st_size / 2**20:.1f} MiB)")
    if entropies:
        print(
            f"routing: usage entropy per layer {min(entropies):.3f}..{max(entropies):.3f} "
            f"(target {ns.routing_entropy}) on the calibration prompt"
        )
    return 0


def cmd_car_estimate(ns) -> int:
    import numpy as np

    from strata.routing.car import CarKnobs
    from strata.routing.estimate import check_golden, format_table, replay
    from strata.routing.profile import UsageProfile, place
    from strata.routing.trace import read_trace

    n = check_golden()
    try:
        thresholds = [float(t) for t in ns.threshold.split(",") if t]
    except ValueError:
        raise UserError(
            f"--threshold must be a comma-separated list, got {ns.threshold!r}"
        ) from None
    h, _ = read_trace(ns.trace)
    if ns.resident:
        resident = np.load(ns.resident).astype(bool)
    elif ns.cache_profile:
        if ns.slots is None:
            raise UserError("--cache-profile needs --slots N")
        prof = UsageProfile.load(ns.cache_profile, h.n_layer, h.n_expert)
        resident = place(prof.counts, ns.slots)
    else:
        raise UserError(
            "give the resident experts: --resident MASK.npy or --cache-profile P --slots N"
        )
    try:
        knobs = [
            CarKnobs(t, ns.warmup, ns.budget, ns.free_ratio, ns.mode, ns.max_weight)
            for t in thresholds
        ]
    except ValueError as e:
        raise UserError(str(e)) from None
    ests = [replay(ns.trace, resident, k, ns.slack) for k in knobs]
    print(f"rule checked against {n} golden cases; {resident.sum()} resident experts")
    print(format_table(ests))
    return 0


def cmd_profile(ns) -> int:
    from strata.engine.engine import Engine
    from strata.routing.profile import UsageProfile

    model = load(ns.model)
    prompts = [line for line in Path(ns.prompts).read_text().splitlines() if line.strip()]
    if not prompts:
        raise UserError(f"{ns.prompts}: no prompts (one per line)")
    engine = Engine(model, n_ctx=ns.ctx)
    tok = model.tokenizer
    n = 0
    for p in prompts:
        ids = tok.encode(p)[: ns.ctx]
        engine.reset()
        engine.forward(ids)
        n += len(ids)
    prof = UsageProfile(engine.stats.expert_hist.copy(), str(model.path.name), n)
    prof.save(ns.out)
    print(f"wrote {ns.out}: {n} tokens, {len(prompts)} prompts")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from strata import __version__

    ap = argparse.ArgumentParser(prog="strata", description="Run MoE LLMs larger than the GPU.")
    ap.add_argument("--version", action="version", version=f"strata {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True)

    g = sub.add_parser("generate", help="complete a prompt, streaming tokens")
    g.add_argument("prompt")
    add_model(g)
    _add_sampling(g)
    g.set_defaults(fn=cmd_generate)

    c = sub.add_parser("chat", help="answer one user message through the chat template")
    c.add_argument("prompt")
    c.add_argument("--system", default=None, help="system message")
    add_model(c)
    _add_sampling(c)
    c.set_defaults(fn=cmd_chat)

    inspect.add_parser(sub)

    s = sub.add_parser("synth", help="write a random but valid MoE GGUF of a given shape and quant")
    s.add_argument("out", help="output .gguf path")
    s.add_argument(
        "--shape",
        default="tiny",
        help="tiny | small | qwen3-30b-a3b | qwen2-57b-a14b | tiny-qwen3next | "
        "qwen3-next-80b-a3b | tiny-gpt-oss | gpt-oss-20b | gpt-oss-120b",
    )
    s.add_argument("--arch", default=None, choices=list(ARCHS))
    s.add_argument(
        "--quant", default=None, help="expert tensor type (default Q4_K; gpt-oss shapes: MXFP4)"
    )
    s.add_argument("--dense-quant", default="Q8_0", help="attention and output tensor type")
    s.add_argument("--embd-quant", default="Q8_0", help="token embedding type")
    s.add_argument("--layers", type=int, default=None, help="override the shape's layer count")
    s.add_argument("--experts", type=int, default=None, help="override the shape's expert count")
    s.add_argument("--vocab", type=int, default=None, help="override the shape's vocab size")
    s.add_argument("--skew", type=float, default=0.0, help="expert popularity skew (0 = uniform)")
    s.add_argument(
        "--routing-entropy",
        type=float,
        default=None,
        metavar="H",
        help="solve the routers for this normalized per-layer expert usage entropy over random "
        "tokens (trained models: 0.905-0.960); two halves of the vocabulary route differently",
    )
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--split-max-tensors", type=int, default=0, help="write shards of N tensors")
    s.add_argument("--force", action="store_true", help="overwrite OUT")
    s.set_defaults(fn=cmd_synth)
    ce = sub.add_parser("car-estimate", help="replay a router-score trace with CAR offline")
    ce.add_argument("trace", help="STRCS1 file written with --dump-router-scores")
    ce.add_argument("--threshold", default="0.25,0.35,0.5,0.7", help="comma-separated list")
    ce.add_argument("--resident", default=None, help="resident mask [L, E] as a .npy file")
    ce.add_argument("--cache-profile", default=None, help="usage profile to place the cache by")
    ce.add_argument("--slots", type=int, default=None, help="cache slots (with --cache-profile)")
    ce.add_argument("--warmup", type=int, default=0)
    ce.add_argument("--budget", type=int, default=0)
    ce.add_argument("--free-ratio", type=float, default=1.0)
    ce.add_argument("--mode", default=DEFAULT_MODE, choices=MODES, help="the CAR rule (slack)")
    ce.add_argument("--max-weight", type=float, default=DEFAULT_MAX_WEIGHT, help="slack mode")
    ce.add_argument(
        "--slack",
        type=float,
        default=None,
        metavar="JOBS",
        help="missed-expert jobs of room in every window (default: each record's slack field)",
    )
    ce.set_defaults(fn=cmd_car_estimate)

    pr = sub.add_parser("profile", help="count expert use over prompts into a usage profile")
    pr.add_argument("model", nargs="?", default=None)
    pr.add_argument("--prompts", required=True, help="text file, one prompt per line")
    pr.add_argument("-o", "--out", default="profile.json")
    pr.add_argument("--ctx", type=int, default=2048)
    pr.set_defaults(fn=cmd_profile)

    serve.add_parser(sub)
    resolve.add_parser(sub)
    pack.add_parser(sub)
    return ap


EXIT_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a writer whose reader went away


def _stdout_closed() -> int:
    """The reader of stdout went away (`strata inspect | head -1`): end quietly as a piped
    command does, and point stdout at /dev/null so the interpreter's exit flush stays quiet."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError, AttributeError):  # stdout is no file: nothing to silence
        pass
    return EXIT_PIPE


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        rc = ns.fn(ns)
        sys.stdout.flush()  # a closed pipe shows here, not as a complaint at interpreter exit
        return rc
    except BrokenPipeError:  # before OSError: a closed stdout is no error of the user's
        return _stdout_closed()
    except (
        UserError,
        ModelError,
        UnsupportedType,
        OSError,
        ValueError,
        ConfigError,
        DeviceError,
        BudgetExceeded,
    ) as e:
        print(one_line(e), file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
