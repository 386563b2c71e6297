"""The one place that picks what decodes the server's batch: `make_runner`."""

from __future__ import annotations

import dataclasses

from strata.config import EngineConfig
from strata.engine.batch_api import BatchRunner
from strata.model.loader import Model


def make_runner(
    model: Model, cfg: EngineConfig | None, slots: int, n_ctx: int | None = None
) -> BatchRunner:
    """A runner of at most `slots` sequences at once for `model` built from `cfg` (None: a plain
    engine); `n_ctx` overrides `cfg.n_ctx`. Today one engine per slot (`EngineRunner`) on every
    tier; the batched engine takes its place where one can be built for `cfg`."""
    from strata.engine.runner import EngineRunner
    from strata.engine.session import Session

    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    if cfg is None:
        return EngineRunner([Session(model, n_ctx=n_ctx) for _ in range(slots)])
    from strata.build import build_engine

    if n_ctx is not None:
        cfg = dataclasses.replace(cfg, n_ctx=n_ctx)
    return EngineRunner([Session(model, engine=build_engine(model, cfg)) for _ in range(slots)])
