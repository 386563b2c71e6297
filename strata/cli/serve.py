"""`strata serve`: the OpenAI-compatible server on uvicorn.

`add_parser(subparsers)` adds the subcommand to the main `strata` parser;
`python -m strata.serve` runs it on its own. Flags beat `STRATA_*` environment variables.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from collections.abc import Mapping

from strata.cli.common import DEFAULT_MODEL, add_engine, engine_config, one_line
from strata.config import ConfigError, resolve_serve
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


def add_parser(subparsers) -> None:
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
        help="requests that may wait for a place in the batch before 503 (default 64)",
    )
    p.add_argument(
        "--slots",
        type=_int("--slots", 1),
        default=1,
        help="the most requests generating at once, in one batch (default 1)",
    )
    p.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    add_engine(p)
    p.set_defaults(fn=cmd_serve)


def serve_options(ns: argparse.Namespace, environ: Mapping[str, str] | None = None) -> dict:
    """`create_app` arguments: flags, then `STRATA_*` variables, then defaults."""
    cfg = engine_config(ns, environ)
    if cfg.model is None:
        cfg.model = str(DEFAULT_MODEL)
    if not os.path.exists(cfg.model):
        raise ValueError(f"{cfg.model}: no such file")
    if cfg.spec > 0:  # the batch scheduler's steps are one token a sequence
        raise ValueError(f"--spec {cfg.spec}: the server does not draft yet (generate and chat do)")
    flags = {"api_key": ns.api_key, "reasoning_effort": ns.reasoning_effort}
    try:
        server = resolve_serve(flags, environ)
    except ConfigError as e:
        raise ValueError(str(e)) from None
    return dict(
        model=cfg.model,
        model_id=cfg.model_id,
        config=cfg,
        api_key=server.api_key,
        reasoning_effort=server.reasoning_effort,
        max_queue=ns.max_queue,
        slots=ns.slots,
    )


SERVE_MODULES = ("starlette", "uvicorn")  # what the `serve` extra installs for the server


def missing_serve_extra() -> str | None:
    """A one-line refusal naming the extra to install where the server's packages are missing,
    else None."""
    import importlib.util

    missing = [m for m in SERVE_MODULES if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    return (
        f"strata serve needs {' and '.join(missing)}: install the serve extra "
        "(pip install -e '.[serve]' in the clone)"
    )


def cmd_serve(ns: argparse.Namespace) -> int:
    refusal = missing_serve_extra()
    if refusal:
        print(f"strata: {refusal}", file=sys.stderr)
        return 2
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
    add_parser(sub)
    ns = ap.parse_args(["serve", *(sys.argv[1:] if argv is None else argv)])
    try:
        return ns.fn(ns)
    # ModelError, ConfigError and UnsupportedType are ValueErrors
    except (ValueError, OSError, DeviceError, BudgetExceeded) as e:
        print(one_line(e), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
