#!/usr/bin/env bash
# Session 4, call N: the AVX-512 VBMI IQ3_XXS kernel on the host that has it (tests, then the
# pool on the GGUF bytes vs the lut4 repack, 16 threads, T = 1 and 8).
. bench/h200/lib.sh
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
el "done"
