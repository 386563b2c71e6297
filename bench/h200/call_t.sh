#!/usr/bin/env bash
# Session 5, call T: the GEMV kernels' L2 weight prefetch ahead of the PDL wait (tests, then
# all-resident decode prefetch on / off, PDL on both), the gpu-kernels GEMV rows; then the CPU side
# on the AVX-512 host: the new IQ1_M kernel's tests and the pool's layouts timed against each
# other in one process (IQ1_M t2 repack vs the GGUF bytes; IQ3_XXS lut4 vs the VBMI kernel), T = 1.
. bench/h200/lib.sh
start_model
el "GPU tests (graphs, decode, GEMV kernels)"
timeout 150 python3 -m pytest -q -m gpu tests/test_gpu_graph.py tests/test_gpu_decode.py tests/test_gpu_kernels.py \
  -k "graph or decode or gemv" -p no:cacheprovider -x 2>&1 | tee $OUT/gpu-tests.txt | tail -2
wait_model
for arm in pre1 pre0 pre1b; do
  el "all-gpu $arm"
  pre=${arm#pre}; pre=${pre%b}
  STRATA_GPU_WEIGHT_PREFETCH=$pre timeout 80 python3 -m strata.bench --arm all-gpu --model $M --vram-budget-widen \
    --vram-budget-mib 40000 -p 512 -n 128 -r 3 --json $OUT/all-gpu-$arm.json 2>&1 | grep -E "^all-gpu|Error" | tail -2
done
el "CPU kernel tests (AVX-512)"
timeout 150 python3 -m pytest -q tests/test_cpu_iq1_avx512.py tests/test_cpu_iq3_vbmi.py -p no:cacheprovider 2>&1 \
  | tee $OUT/cpu-avx512-tests.txt | tail -2
STRATA_CPU_LAYOUT=IQ1_M=gguf timeout 100 python3 -m pytest -q tests/test_cpu_pool.py -p no:cacheprovider -x 2>&1 \
  | tee -a $OUT/cpu-avx512-tests.txt | tail -1
for q in IQ1_M IQ3_XXS; do
  el "pool layout A/B $q T=1"
  timeout 110 python3 bench/cpu_pool_sweep.py --quant $q --threads 16 --tokens 1 --layout-ab repack,gguf \
    --out $OUT/pool-layout-ab-$q-t1 2>&1 | grep -A3 "^quant " | tail -3
done
el "done"
