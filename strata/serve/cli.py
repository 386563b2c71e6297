"""`strata serve`: the OpenAI-compatible server on uvicorn.

`add_serve_parser(subparsers)` adds the subcommand to the main `strata` parser;
`python -m strata.serve` runs it on its own. Flags beat `STRATA_*` environment variables.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from collections.abc import Mapping

from strata.serve.reasoning import EFFORTS


def _int(name: str, lo: int, hi: int | None = None):
    def parse(v: str) -> int:
        try:
            n = int(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {v!r}") from None
        if n < lo or (hi is not None and n > hi):
            bound = f"in {lo}..{hi}" if hi is not None else f">= {lo}"
            raise argparse.ArgumentTypeError(f"{name} must be {bound}, got {n}")
        return n

    return parse


def add_serve_parser(subparsers) -> None:
    p = subparsers.add_parser("serve", help="OpenAI-compatible chat server (uvicorn)")
    p.add_argument(
        "-m",
        "--model",
        default=None,
        help="GGUF file or first shard (default: env STRATA_MODEL, then the embedded model)",
    )
    p.add_argument(
        "--model-id",
        default=None,
        help="the model id the API answers to (env STRATA_MODEL_ID; default: the file's stem)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    p.add_argument("--port", type=_int("--port", 0, 65535), default=8000)
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' (default: env STRATA_API_KEY)",
    )
    p.add_argument(
        "--reasoning-effort",
        choices=EFFORTS,
        default=None,
        help="default reasoning effort (env STRATA_REASONING_EFFORT); none/minimal "
        "turn thinking off, a request's reasoning_effort overrides it",
    )
    p.add_argument(
        "--ctx",
        type=_int("--ctx", 1),
        default=None,
        help="context length (default min(train, 4096))",
    )
    p.add_argument(
        "--max-queue",
        type=_int("--max-queue", 0),
        default=64,
        help="requests that may wait for a slot before 503 (default 64)",
    )
    p.add_argument(
        "--slots",
        type=_int("--slots", 1),
        default=1,
        help="generation slots, each with its own engine and KV cache (default 1)",
    )
    p.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    from strata.cli import _add_engine  # the engine knobs `generate` and `chat` take

    _add_engine(p)
    p.set_defaults(fn=cmd_serve)


def serve_options(ns: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> dict:
    """`create_app` arguments: flags, then `STRATA_*` variables, then defaults."""
    from strata.config import ENV, resolve
    from strata.serve.reasoning import check_effort

    flags = {name: getattr(ns, name, None) for name in ENV}
    flags["n_ctx"] = ns.ctx
    flags["model_id"] = getattr(ns, "model_id", None)
    cfg = resolve(flags, environ)
    if cfg.model is None:
        from strata.cli import DEFAULT_MODEL

        cfg.model = str(DEFAULT_MODEL)
    if not os.path.exists(cfg.model):
        raise ValueError(f"{cfg.model}: no such file")
    api_key = ns.api_key if ns.api_key is not None else environ.get("STRATA_API_KEY")
    effort = ns.reasoning_effort or environ.get("STRATA_REASONING_EFFORT") or None
    try:
        check_effort(effort)
    except ValueError as e:
        raise ValueError(f"STRATA_REASONING_EFFORT: {e}") from None
    return dict(
        model=cfg.model,
        model_id=cfg.model_id,
        config=cfg,
        api_key=api_key or None,
        reasoning_effort=effort,
        max_queue=ns.max_queue,
        slots=ns.slots,
    )


def cmd_serve(ns: argparse.Namespace) -> int:
    import uvicorn

    from strata.serve.app import create_app

    opts = serve_options(ns)
    app = create_app(opts.pop("model"), **opts)
    for note in dict.fromkeys(opts["config"].notices):  # each once, however many slots
        print(f"strata: {note}", file=sys.stderr)
    st = app.state.strata
    if not st.api_key and not _is_loopback(ns.host):
        print(
            f"strata: warning: serving on {ns.host} without an API key (set --api-key or "
            "STRATA_API_KEY)",
            file=sys.stderr,
        )
    print(
        f"strata: serving {st.model_id} ({st.n_ctx} tokens of context, {ns.slots} slot(s), "
        f"queue {ns.max_queue}) on http://{ns.host}:{ns.port}/v1"
        f"{' (API key required)' if st.api_key else ''}",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(app, host=ns.host, port=ns.port, log_level=ns.log_level)
    return 0


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> int:
    from strata.gpu.budget import BudgetExceeded
    from strata.gpu.device import DeviceError

    ap = argparse.ArgumentParser(prog="python -m strata")
    sub = ap.add_subparsers(dest="cmd")
    add_serve_parser(sub)
    ns = ap.parse_args(["serve", *(sys.argv[1:] if argv is None else argv)])
    try:
        return ns.fn(ns)
    except (ValueError, OSError, DeviceError, BudgetExceeded) as e:  # ModelError, ConfigError,
        # UnsupportedType included
        print(f"strata: error: {' '.join(str(e).split()) or type(e).__name__}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
