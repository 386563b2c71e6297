#!/usr/bin/env bash
# Session 9, call CA: (1) the GPU suite on the wide-load decoders (Q4_K/Q5_K 16-byte, IQ4_XS
# 8-byte loads on aligned blocks); (2) the T = 1 GEMV at the attention shapes and the decode MoE
# kernels at the expert shape, base (51e5630, in $BASE) against this tree, alternating twice;
# (3) the CPU pool's per-thread phase trace at T = 1 on 16 threads (IQ3_XXS pm, IQ1_M t2, Q4_K),
# then IQ1_M again with threads pinned (OMP_PROC_BIND=close OMP_PLACES=cores).
. bench/h200/lib.sh
O=/tmp/caout; rm -rf $O && mkdir -p $O
el "GPU suite"
timeout 330 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider > $O/gpu-tests.txt 2>&1
echo "rc=$?"; tail -2 $O/gpu-tests.txt
SW="--builds fast+smem --quants Q4_K,Q5_K,IQ4_XS,IQ3_XXS --moe-variants st1+legacy --gemv-variants split --gemv-shapes attn_q,attn_kv,attn_o"
for r in 1 2; do
  for side in base new; do
    el "sweep $side run $r"
    if [ $side = base ]; then d=$BASE; else d=$PWD; fi
    (cd $d && PYTHONPATH=/tmp/site:$d timeout 150 python3 bench/experts_decode_sweep.py $SW \
      --json $O/sweep-$side-r$r.json > $O/sweep-$side-r$r.txt 2>&1; echo "rc=$?")
    grep -E "^gemv1.*(attn_q|attn_kv|attn_o)|st1\+legacy|rror" $O/sweep-$side-r$r.txt | head -24
  done
done
el "CPU pool phases"
timeout 300 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS,IQ1_M,Q4_K --threads 16 --tokens 1 \
  --layout-ab repack --out $O/pool-phases 2>&1 | sed -n '/^## Layouts/,$p'
el "IQ1_M pinned"
OMP_PROC_BIND=close OMP_PLACES=cores timeout 150 python3 bench/cpu_pool_sweep.py --quant IQ1_M \
  --threads 16 --tokens 1 --layout-ab repack --out $O/pool-phases-iq1-pinned 2>&1 | sed -n '/^## Layouts/,$p'
tar -cf $OUT/ca.tar -C $O .
el "done"
