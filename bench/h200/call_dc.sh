#!/usr/bin/env bash
# Session 10, call DC (d9e9db1): the GPU suite after the Q4_K/Q5_K decoder refactor (k4_aligned,
# k4_scales) and one sweep of their kernels (session 9's figures to compare: GEMV attn_q Q4_K 3.99,
# Q5_K 4.28 us; MoE T = 4 41.1 / 50.5 us); then the CPU pool's expert-major down (@dx=1, the
# default) against runs of rows of every expert (@dx=0), T = 1 on 16 threads, interleaved.
. bench/h200/lib.sh
O=/tmp/dcout; rm -rf $O && mkdir -p $O
el "GPU suite"
timeout 330 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider > $O/gpu-tests.txt 2>&1
echo "rc=$?"; tail -2 $O/gpu-tests.txt
SW="--builds fast+smem --quants Q4_K,Q5_K --moe-variants st1+legacy --gemv-variants split --gemv-shapes attn_q"
el "sweep"
timeout 100 python3 bench/experts_decode_sweep.py $SW --json $O/sweep.json > $O/sweep.txt 2>&1; echo "rc=$?"
grep -E "^gemv1.*attn_q|st1\+legacy|rror" $O/sweep.txt | head -12
for q in IQ3_XXS IQ1_M Q4_K; do
  el "pool T=1 $q dx"
  timeout 100 python3 bench/cpu_pool_sweep.py --quant $q --threads 16 --tokens 1 --repeats 40 \
    --layout-ab repack@dx=0,repack --out $O/pool-dx-$q-t1 2>&1 | sed -n '/^quant /,/^```/p;/^arm |/,$p' | grep -v "^$"
done
el "pool T=4 IQ3_XXS dx"
timeout 80 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS --threads 16 --tokens 4 --repeats 30 \
  --layout-ab repack@dx=0,repack --out $O/pool-dx-IQ3_XXS-t4 2>&1 | sed -n '/^quant /,/^```/p'
tar -cf $OUT/dc.tar -C $O .
el "done"
