#!/usr/bin/env bash
# Session 4, call O: the pool with IQ3_XXS on its GGUF bytes by default (VBMI host), down rows in
# one run at T = 1, prefetch a byte distance ahead (A/B: STRATA_POOL_PREFETCH_BYTES); then the
# hybrid and all-CPU arms after this session's GPU and pool changes.
. bench/h200/lib.sh
setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &
for pf in 4096 0 16384; do
  el "pool T=1, prefetch bytes $pf"
  STRATA_POOL_PREFETCH_BYTES=$pf timeout 100 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS,Q4_K,IQ1_M \
    --threads 16 --tokens 1 --out $OUT/pool-t1-pf$pf 2>&1 | grep -A6 "^shape" | tail -4
done
el "pool T=8 (default prefetch)"
timeout 100 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS,Q4_K,IQ1_M --threads 16 --tokens 8 \
  --out $OUT/pool-t8 2>&1 | grep -A6 "^shape" | tail -4
for i in $(seq 1 100); do grep -q -e PREP-DONE -e rror /tmp/prep.log && break; sleep 3; done; tail -1 /tmp/prep.log
el "car-on, all-cpu"
timeout 240 python3 -m strata.bench --arm car-on --arm all-cpu --model /tmp/q30.gguf --pack /tmp/q30-pack \
  --calibrate -p 512 -n 128 -r 2 --json $OUT/arms.json 2>&1 | grep -v "it/s\]$" | tail -6
el "done"
