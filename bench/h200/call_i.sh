#!/usr/bin/env bash
# Session 3, call I: the model + pack (and meanwhile the sampling test that call H's run failed on
# a too-tight tolerance), CPU pool repack vs gather kernels on the 16 cores (GPU idle), then the
# car-on and all-cpu arms at 10240 MiB with prefill offload (the default).
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &
timeout 100 python3 -m pytest -q -m gpu tests/test_gpu_sample.py -p no:cacheprovider 2>&1 | tee $OUT/gpu-sample-tests.txt | tail -3
for i in $(seq 1 80); do grep -q -e PREP-DONE -e rror /tmp/prep.log && break; sleep 3; done; tail -1 /tmp/prep.log
el "pool: repack (default) vs gguf gather kernels"
timeout 120 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS,IQ2_XXS,IQ1_M,Q4_K --threads 16 --tokens 1 \
  --out $OUT/pool-repack 2>&1 | grep -A6 "^shape" | tail -5
timeout 100 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS,IQ2_XXS,IQ1_M --threads 16 --tokens 1 \
  --layout gguf --out $OUT/pool-gather 2>&1 | grep -A6 "^shape" | tail -4
el "car-on, all-cpu (prefill offload auto)"
timeout 200 python3 -m strata.bench --arm car-on --arm all-cpu --model /tmp/q30.gguf --pack /tmp/q30-pack \
  --calibrate -p 512 -n 128 -r 2 --json $OUT/arms.json 2>&1 | grep -v "it/s\]$" | tail -6
el "done"
