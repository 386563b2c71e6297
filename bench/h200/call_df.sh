#!/usr/bin/env bash
# Session 10, call DF: the pool's fixed cost with few experts (the mostly-resident decode) with
# the expert-major down (one more barrier and the sum) against down by runs of rows, interleaved
# in one process: `--overhead-only` at 16 threads (0, 1, 2, 8 experts).
. bench/h200/lib.sh
el "overhead"
timeout 150 python3 bench/cpu_pool_sweep.py --overhead-only --threads 16 --quant IQ3_XXS 2>&1 \
  | grep "qwen3-30b-a3b\|empty\|arm"
el "done"
