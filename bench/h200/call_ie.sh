#!/usr/bin/env bash
# Session 15, call IE: the tensor-core tile kernels' weights staged through shared memory by
# cp.async (experts_mma.cu MmaUnit): the mma tests, then a prompt chunk's dense GEMM (T = 512)
# timed with the staging (default) and without (-DSTRATA_MMA_STAGE=0), alternating.
. bench/h200/lib.sh
O=/tmp/ieout; rm -rf $O && mkdir -p $O
el "mma tests"
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_grouped.py \
  tests/test_gpu_kernels.py -k "mma" > $O/gpu-tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-tests.txt | tail -8
for r in 1 2; do
  for st in 1 0; do
    for shape in attn_q attn_o; do
      el "time stage=$st $shape run $r"
      STRATA_KERNEL_DEFINES="-DSTRATA_MMA_STAGE=$st" timeout 60 python3 scripts/profile_gemv.py \
        --quants Q8_0,IQ3_XXS,Q4_K,Q6_K --shape $shape --tokens 512 --time 50 2>&1 | tail -4
    done
  done
done
tar -cf $OUT/ie.tar -C $O .
el "done"
