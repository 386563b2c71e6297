#!/usr/bin/env bash
# Prepared for the next session's first call (not run: session 5's device time was spent).
# 1. moe_gate_up_lb (STRATA_MOE_VARIANT=lb+legacy: the gate/up kernel held to 40 registers so a
#    decode layer's blocks fit the card in one wave; it spills 100-280 bytes a thread): its GPU
#    tests, then all-resident decode against the default, interleaved.
# 2. IQ1_M's T2 layout with its AVX-512 kernel (STRATA_CPU_T2_AVX512=1; arm "@x512"): its tests, then
#    the pool against the AVX2 T2 kernel and the GGUF-bytes kernel.
# 3. The CPU pool's rows-ahead prefetch into L1 (default) against L2 (STRATA_POOL_PREFETCH_L2) and
#    further ahead, timed in one process, T = 1 and 8: session 5 found the pool's cores neither
#    compute- nor bandwidth-bound but short of overlapping the two
#    (bench/results/session5-h200-20261129.md).
. bench/h200/lib.sh
start_model
el "GPU tests: MoE decode variants"
timeout 150 python3 -m pytest -q -m gpu tests/test_gpu_kernels.py -k "moe" -p no:cacheprovider 2>&1 \
  | tee $OUT/gpu-tests-moe.txt | tail -1
wait_model
for v in legacy lb legacy lb; do
  el "all-gpu $v"
  STRATA_MOE_VARIANT=$v+legacy timeout 60 python3 -m strata.bench --arm all-gpu --model $M --vram-budget-widen \
    --vram-budget-mib 40000 -p 512 -n 128 -r 3 --json $OUT/all-gpu-$v-$RANDOM.json 2>&1 | grep -E "^all-gpu|Error" | tail -1
done
el "CPU tests: the AVX-512 T2 kernel (iq1_t2_avx512.py: not yet run on AVX-512 hardware)"
timeout 120 python3 -m pytest -q tests/test_cpu_iq1_t2_avx512.py tests/test_cpu_iq1_avx512.py -p no:cacheprovider \
  2>&1 | tee $OUT/cpu-avx512-tests.txt | tail -1
for T in 1 8; do
  el "IQ1_M kernel + prefetch arms T=$T"
  timeout 150 python3 bench/cpu_pool_sweep.py --quant IQ1_M --threads 16 --tokens $T \
    --layout-ab repack,repack@x512,repack@x512@l2,gguf,gguf@l2@pf=16384 --out $OUT/pool-prefetch-IQ1_M-t$T 2>&1 \
    | grep -A6 "^quant " | tail -6
  el "IQ3_XXS prefetch arms T=$T"
  timeout 120 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS --threads 16 --tokens $T \
    --layout-ab repack,repack@l2,gguf,gguf@l2,gguf@l2@pf=16384 --out $OUT/pool-prefetch-IQ3_XXS-t$T 2>&1 \
    | grep -A6 "^quant " | tail -6
done
el "done"
