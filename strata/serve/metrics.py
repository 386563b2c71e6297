"""Server metrics in Prometheus text format (exposition 0.0.4), no client library needed.

Counters and gauges are kept under one lock; `render` is called by `GET /metrics`. Engine-side
figures (expert-cache hit rate, CAR substitution rate, cache swaps) are read from the engines'
`stats` (`EngineStats.hit_rate`, `.substitution_rate`, `.swaps`) through `engine_rates`; an
engine whose stats lack one gives 0 and a comment saying so. Batch figures (batch size, KV blocks,
prefix-cache hits) come from the runner's `BatchStats`, preemptions from the scheduler.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def _rate(stats: Any, attr: str) -> float | None:
    v = getattr(stats, attr, None)
    if v is None:
        return None
    return float(v() if callable(v) else v)


def engine_rates(stats_list: Iterable[Any]) -> dict[str, float | None]:
    """Mean cache-hit and CAR substitution rates over engines (None where none reports one)."""
    out: dict[str, float | None] = {}
    stats_list = list(stats_list)
    for key, attr in (
        ("cache_hit_rate", "hit_rate"),
        ("car_substitution_rate", "substitution_rate"),
    ):
        vals = [r for s in stats_list if (r := _rate(s, attr)) is not None]
        out[key] = sum(vals) / len(vals) if vals else None
    swaps = [getattr(s, "swaps", None) for s in stats_list]
    out["swaps"] = sum(swaps) if swaps and None not in swaps else None
    return out


def tier_figures(stats_list: Iterable[Any]) -> tuple[float, list[int]]:
    """Mean CPU-pool experts a decode layer-window over engines, and each helper card's picks
    summed over engines (helper i at index i; empty without helper cards)."""
    cpu, hits = [], []
    for s in stats_list:
        if callable(getattr(s, "cpu_experts_per_window", None)) and s.decode_steps:
            cpu.append(float(s.cpu_experts_per_window()))
        for i, n in enumerate(getattr(s, "helper_hits", None) or []):
            hits.extend([0] * (i + 1 - len(hits)))
            hits[i] += int(n)
    return (sum(cpu) / len(cpu) if cpu else 0.0), hits


# speculative decoding (--spec): acceptance = accepted / drafted, tokens a verify step =
# tokens / verify steps
SPEC_COUNTERS = (
    ("spec_drafted", "strata_spec_drafted_total", "NextN drafts verified (--spec)."),
    ("spec_accepted", "strata_spec_accepted_total", "NextN drafts the trunk accepted."),
    ("spec_steps", "strata_spec_verify_steps_total", "Speculative decode forwards of the trunk."),
    ("spec_tokens", "strata_spec_tokens_total", "Tokens the speculative decode forwards yielded."),
)


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = defaultdict(int)  # (endpoint, status) -> n
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cancelled = 0
        self.rejected = 0  # 503 queue full
        self.gen_seconds = 0.0  # wall time spent decoding
        self.last_decode_tps = 0.0
        self._ttft = [0] * (len(TTFT_BUCKETS) + 1)
        self._ttft_sum = 0.0

    def request(self, endpoint: str, status: int) -> None:
        with self._lock:
            self.requests[(endpoint, status)] += 1

    def generation(
        self, prompt_tokens: int, completion_tokens: int, decode_s: float, decode_tps: float
    ) -> None:
        with self._lock:
            self.prompt_tokens += prompt_tokens
            self.completion_tokens += completion_tokens
            self.gen_seconds += decode_s
            if decode_tps > 0:
                self.last_decode_tps = decode_tps

    def ttft(self, seconds: float) -> None:
        with self._lock:
            i = next((i for i, b in enumerate(TTFT_BUCKETS) if seconds <= b), len(TTFT_BUCKETS))
            self._ttft[i] += 1
            self._ttft_sum += seconds

    def cancel(self) -> None:
        with self._lock:
            self.cancelled += 1

    def reject(self) -> None:
        with self._lock:
            self.rejected += 1

    def render(
        self,
        *,
        queued: int,
        active: int,
        slots: int,
        engine_stats: Iterable[Any],
        batch: Any = None,
        preemptions: int = 0,
    ) -> str:
        lines: list[str] = []

        def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP {name} {help_}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(f"{name}{labels} {_num(v)}" for labels, v in samples)

        with self._lock:
            reqs = sorted(self.requests.items())
            metric(
                "strata_requests_total",
                "counter",
                "HTTP requests by endpoint and status.",
                [(f'{{endpoint="{_esc(e)}",status="{s}"}}', n) for (e, s), n in reqs],
            )
            metric(
                "strata_prompt_tokens_total",
                "counter",
                "Prompt tokens processed.",
                [("", self.prompt_tokens)],
            )
            metric(
                "strata_completion_tokens_total",
                "counter",
                "Tokens generated.",
                [("", self.completion_tokens)],
            )
            metric(
                "strata_requests_cancelled_total",
                "counter",
                "Generations cancelled because the client went away.",
                [("", self.cancelled)],
            )
            metric(
                "strata_requests_rejected_total",
                "counter",
                "Requests refused with 503 because the queue was full.",
                [("", self.rejected)],
            )
            tps = self.completion_tokens / self.gen_seconds if self.gen_seconds > 0 else 0.0
            metric(
                "strata_tokens_per_second",
                "gauge",
                "Generated tokens per second of decoding, over the server's life.",
                [("", tps)],
            )
            metric(
                "strata_last_decode_tokens_per_second",
                "gauge",
                "Decode speed of the last finished generation.",
                [("", self.last_decode_tps)],
            )
            cum, buckets = 0, []
            for b, n in zip((*TTFT_BUCKETS, float("inf")), self._ttft, strict=True):
                cum += n
                buckets.append((f'{{le="{"+Inf" if b == float("inf") else b}"}}', cum))
            lines.append("# HELP strata_time_to_first_token_seconds From request to first token.")
            lines.append("# TYPE strata_time_to_first_token_seconds histogram")
            lines.extend(f"strata_time_to_first_token_seconds_bucket{lb} {v}" for lb, v in buckets)
            lines.append(f"strata_time_to_first_token_seconds_sum {_num(self._ttft_sum)}")
            lines.append(f"strata_time_to_first_token_seconds_count {cum}")
        metric(
            "strata_queue_depth", "gauge", "Requests waiting for a generation slot.", [("", queued)]
        )
        metric("strata_active_generations", "gauge", "Requests generating now.", [("", active)])
        metric("strata_generation_slots", "gauge", "Most requests in one batch.", [("", slots)])
        if batch is not None:
            _batch_metrics(metric, active, batch, preemptions)
        rates = engine_rates(engine_stats)
        for key, kind, help_ in (
            ("cache_hit_rate", "gauge", "Share of expert picks served by resident experts."),
            (
                "car_substitution_rate",
                "gauge",
                "Share of decode-time cache misses that cache-aware routing substituted.",
            ),
            ("swaps", "counter", "Experts swapped into the cache (adaptive placement)."),
        ):
            name = f"strata_{key}" if key != "swaps" else "strata_expert_cache_swaps_total"
            if rates[key] is None:
                lines.append(f"# {name}: the engine does not report it; 0 until it does")
            metric(name, kind, help_, [("", rates[key] or 0)])
        cpu, hits = tier_figures(engine_stats)
        metric(
            "strata_cpu_experts_per_window",
            "gauge",
            "Mean distinct experts the CPU pool computed a decode layer-window.",
            [("", cpu)],
        )
        for attr, name, help_ in SPEC_COUNTERS:
            n = sum(int(getattr(s, attr, 0) or 0) for s in engine_stats)
            metric(name, "counter", help_, [("", n)])
        if hits:
            metric(
                "strata_helper_card_picks_total",
                "counter",
                "Expert picks computed on each helper card (--helper-cache).",
                [(f'{{card="{i + 1}"}}', n) for i, n in enumerate(hits)],
            )
        return "\n".join(lines) + "\n"


def _batch_metrics(metric: Callable, active: int, b: Any, preemptions: int) -> None:
    mean = b.batch_rows / b.batch_steps if b.batch_steps else 0.0
    metric("strata_batch_size", "gauge", "Sequences in the running batch.", [("", active)])
    metric("strata_batch_size_mean", "gauge", "Mean sequences a decode step.", [("", mean)])
    metric("strata_batch_steps_total", "counter", "Decode steps run.", [("", b.batch_steps)])
    metric(
        "strata_kv_blocks_used",
        "gauge",
        "KV blocks held by running sequences.",
        [("", b.kv_blocks_used)],
    )
    metric("strata_kv_blocks_total", "gauge", "KV blocks in the pool.", [("", b.kv_blocks_total)])
    metric(
        "strata_prefix_hit_tokens_total",
        "counter",
        "Prompt tokens served from cached KV.",
        [("", b.prefix_hit_tokens)],
    )
    metric(
        "strata_preemptions_total",
        "counter",
        "Sequences preempted (KV full) and resumed later.",
        [("", preemptions)],
    )


def _num(v: float) -> str:
    if isinstance(v, int):
        return str(v)
    return repr(float(v))
