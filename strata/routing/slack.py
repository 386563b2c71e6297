"""The cost of a miss, measured: how many missed-expert jobs the CPU pool finishes inside the
card's share of a layer window (the slack `--car-mode slack` decides by).

In a hybrid decode step the card runs a layer's resident experts while the pool computes its
misses; the card needs the pool's sum at the next layer's front. From the host stamps each step
already takes (waiting for layer i's plan, routing it, the pool on it) the meter keeps, per layer
and row count, running figures of:

- `cycle`: the card's whole cycle from a plan to the next plan, on layers where the pool had
  nothing to do (route + wait for the next layer: the card alone);
- `post`: the part of the cycle the card spends after the pool's sum joins (the next layer's
  front): the wait for the next plan on layers where the pool ran (an upper bound, exact when
  the pool was the slower: the meter keeps a running low, which drifts up slowly);
- `job`: the pool's time per missed expert (its call over the jobs it ran).

The window the pool may fill is `cycle - post` (the resident experts and whatever else the card
does before the join); slack = window / job. Once windows are observed, a layer whose pool time is
not measured yet has room for one job (`PROBE`): with none, the rule would substitute every miss
it may and the pool would never be timed. Nothing is allocated per observation. Where a card
cannot be timed (the CPU-only tier, the emulator), `assume` sets the figures from measurements
taken elsewhere and the running figures are left alone.

L = layers, B = row-count buckets (1, 2, 3-4, 5+ tokens in the step).
"""

from __future__ import annotations

import numpy as np

N_BUCKETS = 4
RATE = 1.0 / 16  # running mean's step
UP = RATE / 4  # `post` (a running low) drifts up slowly and takes a lower sample at once
PROBE = 1.0  # jobs of room a layer has until the pool's time a job is measured there


def bucket(rows: int) -> int:
    return 0 if rows <= 1 else 1 if rows == 2 else 2 if rows <= 4 else 3


class SlackMeter:
    def __init__(self, n_layer: int):
        self.n_layer = n_layer
        self.cycle = np.zeros((n_layer, N_BUCKETS))  # [L, B] us, 0 = not seen
        self.post = np.zeros((n_layer, N_BUCKETS))  # [L, B] us
        self.job = np.zeros((n_layer, N_BUCKETS))  # [L, B] us per missed expert
        self.slack = np.zeros((n_layer, N_BUCKETS))  # [L, B] jobs, kept current
        self.fixed = False  # figures set by `assume`: observations are ignored
        self._prev = -1  # the last observed layer (its route + pool seconds and jobs below)
        self._prev_s = 0.0
        self._prev_jobs = 0

    def assume(self, window_us: float, job_us: float) -> None:
        """Fixed figures for every layer: the card's window and the pool's time per job (us)."""
        self.fixed = True
        self.cycle[:] = window_us
        self.post[:] = 0.0
        self.job[:] = job_us
        self.slack[:] = window_us / job_us if job_us > 0 else 0.0

    def observe(
        self, layer: int, wait_s: float, route_s: float, pool_s: float, jobs: int, rows: int = 1
    ) -> None:
        """One layer window of a decode step (seconds; jobs: missed experts the pool ran)."""
        if self.fixed:
            return
        b = bucket(rows)
        us = 1e6
        prev = self._prev
        if prev >= 0 and layer == prev + 1:  # the card's cycle of layer `prev` ends here
            if self._prev_jobs == 0:
                _mean(self.cycle, prev, b, (self._prev_s + wait_s) * us)
            else:
                sample, p = wait_s * us, self.post[prev, b]
                low = p == 0.0 or sample < p
                self.post[prev, b] = sample if low else p + UP * (sample - p)
            self._update(prev, b)
        if jobs > 0:
            _mean(self.job, layer, b, pool_s * us / jobs)
        elif self.job[layer, b] == 0.0:
            self.slack[layer, b] = PROBE  # windows observed, the pool not timed here yet
        self._prev, self._prev_s, self._prev_jobs = layer, route_s + pool_s, jobs
        if layer == self.n_layer - 1:
            self._prev = -1  # a step ends: the next step's first wait includes the logits

    def observe_rows(self, first: int, w: np.ndarray, jobs: np.ndarray) -> None:
        """Layers first.. of one step at once: w [n, 3] seconds (wait, route, pool), jobs [n]."""
        for j in range(w.shape[0]):
            self.observe(first + j, w[j, 0], w[j, 1], w[j, 2], int(jobs[j]))

    def _update(self, layer: int, b: int) -> None:
        c, j = self.cycle[layer, b], self.job[layer, b]
        if j == 0.0:
            self.slack[layer, b] = PROBE  # the pool not timed here yet
        else:
            self.slack[layer, b] = max(0.0, c - self.post[layer, b]) / j if c > 0 else 0.0

    def jobs(self, layer: int, rows: int = 1) -> float:
        """Missed-expert jobs the pool finishes inside the card's window at `layer` (0: none or
        nothing observed; PROBE while windows are observed and the pool is not timed there)."""
        return float(self.slack[layer, bucket(rows)])

    def summary(self) -> dict[str, float]:
        """Means over the layers measured (one-token steps): window and job us, slack in jobs."""
        win = np.maximum(self.cycle[:, 0] - self.post[:, 0], 0.0)
        seen = (self.cycle[:, 0] > 0) & (self.job[:, 0] > 0)
        if not seen.any():
            return {"window_us": 0.0, "job_us": 0.0, "slack_jobs": 0.0}
        return {
            "window_us": float(win[seen].mean()),
            "job_us": float(self.job[seen, 0].mean()),
            "slack_jobs": float(self.slack[seen, 0].mean()),
        }


def _mean(a: np.ndarray, layer: int, b: int, sample: float) -> None:
    v = a[layer, b]
    a[layer, b] = sample if v == 0.0 else v + RATE * (sample - v)
