"""Bounded load test of the chat server: N concurrent streaming clients x M requests each.

    python scripts/load_test.py                       # starts `python -m strata.serve` itself
    python scripts/load_test.py --url http://127.0.0.1:8000 --api-key KEY

Every client sends its requests one after another (streaming, `include_usage`). A 503 (queue
full) is counted and retried after its Retry-After (jittered) until `--timeout`, so every request
completes. Reports p50/p99 time to first token (accepted request sent -> first generated text,
queueing included), aggregate generated tokens/s over the wall time, per-request decode tokens/s,
and HTTP status counts. Exit status 1 when a request
failed or any 5xx other than 503 came back.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import socket
import subprocess
import sys
import time

import httpx


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))]


class Stats:
    def __init__(self) -> None:
        self.status: collections.Counter[int] = collections.Counter()
        self.ttft: list[float] = []
        self.decode_tps: list[float] = []
        self.tokens = 0
        self.completed = 0
        self.failed: list[str] = []


async def one_request(
    http: httpx.AsyncClient, url: str, body: dict, st: Stats, patience: float
) -> None:
    deadline = time.perf_counter() + patience
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        first = last = None
        usage = None
        async with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
            st.status[r.status_code] += 1
            if r.status_code == 503:
                await r.aread()
                # the server's hint, jittered so rejected clients do not come back in step
                await asyncio.sleep(float(r.headers.get("retry-after", "1")) * random.uniform(1, 2))
                continue
            if r.status_code != 200:
                st.failed.append(f"{r.status_code}: {(await r.aread())[:200]!r}")
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    st.failed.append(f"stream error: {chunk['error']}")
                    return
                for c in chunk.get("choices", []):
                    d = c.get("delta", {})
                    if d.get("content") or d.get("reasoning_content") or d.get("tool_calls"):
                        last = time.perf_counter()
                        first = first or last
                if chunk.get("usage"):
                    usage = chunk["usage"]
        if usage is None:
            st.failed.append("stream ended without usage")
            return
        n = usage["completion_tokens"]
        st.tokens += n
        st.completed += 1
        if first is not None:
            st.ttft.append(first - t0)
            if n > 1 and last > first:
                st.decode_tps.append((n - 1) / (last - first))
        return
    st.failed.append(f"still 503 after {patience:.0f} s")


async def client(
    http: httpx.AsyncClient, url: str, i: int, body: dict, st: Stats, args: argparse.Namespace
) -> None:
    for j in range(args.requests):
        await one_request(http, url, {**body, "seed": i * 1000 + j}, st, args.timeout)


async def run(url: str, args: argparse.Namespace) -> Stats:
    st = Stats()
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    body = {  # no "model": the server's one model, whatever its id
        "max_tokens": args.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.8,
        "messages": [{"role": "user", "content": args.prompt}],
    }
    limits = httpx.Limits(max_connections=args.clients + 4, max_keepalive_connections=args.clients)
    async with httpx.AsyncClient(timeout=args.timeout, headers=headers, limits=limits) as http:
        await asyncio.gather(*(client(http, url, i, body, st, args) for i in range(args.clients)))
    return st


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [
        sys.executable,
        "-m",
        "strata.serve",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--max-queue",
        str(args.max_queue),
        "--slots",
        str(args.slots),
    ]
    if args.model:
        cmd += ["--model", args.model]
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.terminate()
    raise SystemExit("server did not come up in 120 s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", help="a running server (default: start one on a free port)")
    ap.add_argument("--api-key", default=os.environ.get("STRATA_API_KEY"))
    ap.add_argument("--model", help="model for the server this script starts")
    ap.add_argument("--max-queue", type=int, default=64, help="for the server this script starts")
    ap.add_argument("--slots", type=int, default=1, help="for the server this script starts")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--requests", type=int, default=4, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--prompt", default="Write a short poem about the sea.")
    ap.add_argument("--timeout", type=float, default=600.0, help="per request, retries included")
    args = ap.parse_args()

    proc = None
    url = args.url
    if url is None:
        proc, url = _start_server(args)
    try:
        t0 = time.perf_counter()
        st = asyncio.run(run(url.rstrip("/"), args))
        wall = time.perf_counter() - t0
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)

    total = args.clients * args.requests
    done = st.completed
    print(
        f"load test: {args.clients} clients x {args.requests} requests = {total}, "
        f"max_tokens {args.max_tokens}, {os.cpu_count()} CPUs, {url}"
    )
    print(f"  completed        {done}/{total} in {wall:.1f} s")
    print(f"  HTTP status      {dict(sorted(st.status.items()))}")
    print(f"  TTFT p50 / p99   {_pct(st.ttft, 50):.2f} s / {_pct(st.ttft, 99):.2f} s")
    print(f"  generated        {st.tokens} tokens, {st.tokens / wall:.1f} tok/s aggregate")
    print(f"  decode per req   p50 {_pct(st.decode_tps, 50):.1f} tok/s")
    for f in st.failed[:10]:
        print(f"  FAILED {f}")
    bad_5xx = sum(n for s, n in st.status.items() if s >= 500 and s != 503)
    return 1 if st.failed or bad_5xx or done != total else 0


if __name__ == "__main__":
    sys.exit(main())
