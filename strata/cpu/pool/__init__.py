"""The CPU expert pool: one layer's missed experts, all three matrices, in one jitted call.

    # T = tokens, D = hidden dim, F = expert FFN dim, E = experts, N = (token, expert) tasks
    out[t] = sum_{tasks j of token t, by expert} weight[j] * down_e(silu(gate_e(x_t)) * up_e(x_t))

(gpt-oss: gate, up and down each plus the expert's bias, and its clamped SwiGLU in silu's place:
LayerWeights.extras.)

with the roundings of llama.cpp's CPU matmul: x quantized once to the gate/up weights' vec_dot
type, the intermediate quantized to the down weights' vec_dot type. Phases of one call:

    0. tasks grouped by expert (counting sort, ascending expert ids)       serial, tiny
       (schedule.py)
    1. quantize x [T, D]: (row, Q8_K block) units split over threads       parallel (quant.py)
    2. gate + up + SiLU.up: the F rows of every active expert, cut into    parallel (phases.py)
       units of about equal work that threads take from a shared counter
       (one thread: its contiguous run)
    3. quantize the intermediate [N, F]: (task, block) units               parallel
    4. down + weighted sum: for decode batches expert-major (4a: each      parallel
       expert's D rows in units like phase 2's into yb [N, D]; a barrier;
       4b: out summed from yb by expert), else runs of D rows of every
       active expert from a second counter

The fused mode (default) runs phases 1-4 as one parallel region, one iteration per thread, with
a spin barrier between phases (region.py): a Numba region costs ~3 us to launch and a decode
layer with 1-3 missed experts has only tens of us of work. One thread runs everything without a
region; a threading layer that may run two iterations on one thread (or the first call, before
the layer is known) gets one region per phase. From TEAM_MIN_THREADS threads, where futexes
exist, the fused phases run on a resident team of threads instead (team_job.py, ../team.py).

Each output element is summed by exactly one thread, in ascending expert order from zero, so
results are deterministic and do not depend on the thread count or schedule. Rows are prefetched
a few rows ahead (`PREFETCH_ROWS`): the hardware prefetcher alone left the kernels at ~60% of the
single-core read bandwidth. Workspaces are allocated on the first call and when a larger shape
arrives; nothing else is allocated per call.
"""

from strata.cpu.pool.expert_pool import TRACE_STAMPS, ExpertPool
from strata.cpu.pool.weights import (
    GLU_SILU,
    GLU_SWIGLU_OAI,
    LayerWeights,
    prepare_layer,
    with_extras,
)

__all__ = [
    "GLU_SILU",
    "GLU_SWIGLU_OAI",
    "TRACE_STAMPS",
    "ExpertPool",
    "LayerWeights",
    "prepare_layer",
    "with_extras",
]
