#!/usr/bin/env bash
# Session 3, call G: the GPU pytest-benchmark gates' baseline (saved under $OUT/benchmarks), then
# the CPU pool sweep on the 16 cores (GPU idle) for issue #3.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
el "gpu gates"
timeout 200 python3 -m pytest -q -m gpu bench/test_gates_gpu.py -p no:cacheprovider \
  --benchmark-storage=$OUT/benchmarks --benchmark-save=gpu 2>&1 | tee $OUT/gates-gpu.txt | tail -20
el "cpu pool sweep"
timeout 300 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS,Q4_K,IQ1_M,IQ2_XXS,IQ3_S,IQ2_S \
  --threads 1,8,16 --tokens 1 --ab --overhead --out $OUT/pool-h200 2>&1 | tee $OUT/pool.txt | tail -40
el "done"
