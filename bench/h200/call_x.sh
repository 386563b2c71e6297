#!/usr/bin/env bash
# Prepared for the next session's first call (not run: session 5's device time was spent).
# 1. IQ1_M's T2 layout with its AVX-512 kernel (STRATA_CPU_T2_AVX512=1): its tests, then
#    the pool against the AVX2 T2 kernel and the GGUF-bytes kernel.
# 2. The CPU pool's rows-ahead prefetch into L1 (default) against L2 (STRATA_POOL_PREFETCH_L2) and
#    further ahead, timed in one process, T = 1 and 8: session 5 found the pool's cores neither
#    compute- nor bandwidth-bound but short of overlapping the two
#    (bench/results/session5-h200-20261129.md).
. bench/h200/lib.sh
el "CPU tests: the AVX-512 T2 kernel (iq1_t2_avx512.py: not yet run on AVX-512 hardware)"
timeout 120 python3 -m pytest -q tests/test_cpu_iq1_t2_avx512.py tests/test_cpu_iq1_avx512.py -p no:cacheprovider \
  2>&1 | tee $OUT/cpu-avx512-tests.txt | tail -1
for T in 1 8; do
  for x in 0 1; do  # the AVX2 T2 kernel, then the AVX-512 one (its own process: the gguf arm
    el "IQ1_M T2 AVX-512 kernel $x, prefetch arms T=$T"  # is the reference both share)
    STRATA_CPU_T2_AVX512=$x timeout 120 python3 bench/cpu_pool_sweep.py --quant IQ1_M --threads 16 --tokens $T \
      --layout-ab repack,repack@l2,gguf,gguf@l2@pf=16384 --out $OUT/pool-prefetch-IQ1_M-t$T-x$x 2>&1 \
      | grep -A5 "^quant " | tail -5
  done
  el "IQ3_XXS prefetch arms T=$T"
  timeout 120 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS --threads 16 --tokens $T \
    --layout-ab repack,repack@l2,gguf,gguf@l2,gguf@l2@pf=16384 --out $OUT/pool-prefetch-IQ3_XXS-t$T 2>&1 \
    | grep -A6 "^quant " | tail -6
done
el "done"
