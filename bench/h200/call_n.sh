#!/usr/bin/env bash
# Session 4, call N: the AVX-512 VBMI IQ3_XXS kernel on the host that has it (tests, then the
# pool on the GGUF bytes vs the lut4 repack, 16 threads, T = 1 and 8), then the hybrid and
# all-CPU arms after the GPU decode-chain fixes.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &
el "VBMI kernel tests"
timeout 150 python3 -m pytest -q tests/test_cpu_iq3_vbmi.py tests/test_cpu_gather.py -p no:cacheprovider -rs 2>&1 \
  | tee $OUT/vbmi-tests.txt | tail -6
el "pool: IQ3_XXS lut4 repack vs GGUF bytes (VBMI), and Q4_K, IQ1_M"
for T in 1 8; do
  timeout 100 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS,Q4_K,IQ1_M --threads 16 --tokens $T \
    --out $OUT/pool-repack-t$T 2>&1 | grep -A6 "^shape" | tail -4
  timeout 100 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS --threads 16 --tokens $T \
    --layout gguf --out $OUT/pool-gguf-t$T 2>&1 | grep -A6 "^shape" | tail -2
done
for i in $(seq 1 80); do grep -q -e PREP-DONE -e rror /tmp/prep.log && break; sleep 3; done; tail -1 /tmp/prep.log
el "car-on, all-cpu"
timeout 200 python3 -m strata.bench --arm car-on --arm all-cpu --model /tmp/q30.gguf --pack /tmp/q30-pack \
  --calibrate -p 512 -n 128 -r 2 --json $OUT/arms.json 2>&1 | grep -v "it/s\]$" | tail -6
el "done"
