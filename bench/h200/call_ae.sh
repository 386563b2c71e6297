#!/usr/bin/env bash
# Session 7, call AE (ran at d6b2989; the barrier arms went out again after call AF): the CPU
# pool's fused-region barrier, per-thread flags against the shared atomic counter: the pool's determinism test at 16 threads, the fixed cost per call
# with no experts (both barriers), and one Qwen3-30B-A3B layer at T = 1 for IQ3_XXS, both layouts,
# the barrier arms interleaved call by call in one process.
. bench/h200/lib.sh
O=/tmp/aeout; rm -rf $O && mkdir -p $O
el "pool tests (16 threads)"
timeout 130 python3 -m pytest -q -p no:cacheprovider tests/test_cpu_pool.py -k "deterministic or knobs" \
  > $O/pytest-pool.txt 2>&1; echo "rc=$?"; tail -1 $O/pytest-pool.txt
for b in counter flags; do
  el "overhead $b"
  STRATA_POOL_BARRIER=$b timeout 60 python3 bench/cpu_pool_sweep.py --threads 16 --overhead-only \
    --out $O/pool-overhead-$b 2>&1 | grep -E "qwen3-30b-a3b \| 16 \| [0-9] \| fused|empty"
done
el "layout-ab IQ3_XXS barriers"
timeout 110 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS --threads 16 --tokens 1 \
  --layout-ab repack@counter,repack,gguf@counter,gguf --out $O/pool-IQ3_XXS-barrier 2>&1 \
  | grep -A6 "^quant " | tail -5
tar -cf $OUT/ae.tar -C $O .
el "done"
