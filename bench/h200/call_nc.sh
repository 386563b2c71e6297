#!/usr/bin/env bash
# Session 20, call NC (the final build: STRATA_GEMV1_STEP's default narrowed to IQ3_XXS and
# IQ2_XXS after NB): the GEMV tests at this commit, the gpu-kernels arm's full table, one
# all-resident engine run, then the CPU pool on the 16-core guest (IQ3_XXS, Q4_K, IQ1_M; #3).
. bench/h200/lib.sh
O=/tmp/ncout; rm -rf $O && mkdir -p $O
start_model
el "gemv tests"
timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_kernels.py -k gemv \
  > $O/gpu-gemv-tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-gemv-tests.txt | tail -6
el "gpu-kernels arm"
timeout 150 python3 -m strata.bench --arm gpu-kernels --json $O/gpu-kernels.json > $O/gpu-kernels.txt 2>&1
echo "rc=$?"; grep -E "copy|IQ3_XXS|attention_decode |layer decode\+pdl" $O/gpu-kernels.txt | head -20
wait_model; el "model ready: $?"
timeout 80 python3 -m strata.bench --arm all-gpu --model $M --vram-budget-widen \
  --vram-budget-mib 40000 -p 512 -n 64 -r 3 --json $O/all-gpu.json > $O/all-gpu.txt 2>&1
echo "rc=$?"; tail -4 $O/all-gpu.txt
el "cpu pool"
timeout 140 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS,Q4_K,IQ1_M --threads 16 --tokens 1 \
  --repeats 30 --wait-quiet --out $O/cpu-pool-16core > $O/cpu-pool.txt 2>&1
echo "rc=$?"; tail -24 $O/cpu-pool.txt
cp $O/* $OUT/ 2>/dev/null
el "done"
