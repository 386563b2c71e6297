#!/usr/bin/env bash
# Session 10, call DA (fd9da80): the GPU MoE check changed in 94785ab (not yet run on the card);
# then the prefetch arms of the CPU pool on the fixed A/B harness (session 6 found @l2/@pf equal,
# but its arms shared cached experts): T = 1, 16 threads, IQ3_XXS (pm) and IQ1_M (t2), phase table.
. bench/h200/lib.sh
O=/tmp/daout; rm -rf $O && mkdir -p $O
el "gpu moe test"
timeout 200 python3 -m pytest -m gpu -q -x tests/test_gpu_kernels.py -k moe_experts_match_reference \
  2>&1 | tail -3 | tee $O/gpu-moe-test.txt
for q in IQ3_XXS IQ1_M; do
  el "pool T=1 $q prefetch arms"
  timeout 170 python3 bench/cpu_pool_sweep.py --quant $q --threads 16 --tokens 1 --repeats 40 \
    --layout-ab repack,repack@l2,repack@pf=8192,repack@pf=16384 \
    --out $O/pool-pf-$q-t1 2>&1 | sed -n '/^quant /,/^```/p;/^arm |/,$p'
done
el "fixed cost (overhead table), 16 threads"
timeout 120 python3 bench/cpu_pool_sweep.py --overhead-only --threads 16 --quant IQ3_XXS 2>&1 | tail -25
tar -cf $OUT/da.tar -C $O .
el "done"
