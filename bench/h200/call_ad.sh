#!/usr/bin/env bash
# Session 7, call AD (bench code only since call AC's suite): the gpu-kernels arm twice, now with
# each GEMV row's same-size copy (cudaMemcpyAsync moving the bytes the GEMV reads, L2-cold, as a
# graph); the CPU pool at T = 1 for IQ1_M and Q4_K (IQ3_XXS ran in call AC) and the pool's
# fixed cost with no experts at 16 threads.
. bench/h200/lib.sh
O=/tmp/adout; rm -rf $O && mkdir -p $O
for r in 1 2; do
  el "gpu-kernels run $r"
  timeout 150 python3 -m strata.bench --arm gpu-kernels --json $O/gpu-kernels-r$r.json > $O/gpu-kernels-r$r.txt 2>&1
  echo "rc=$?"; grep -E "rror|layer decode\+pdl" $O/gpu-kernels-r$r.txt | head -3
done
for q in "IQ1_M repack,gguf" "Q4_K gguf"; do
  set -- $q
  el "pool $1 ($2)"
  timeout 80 python3 bench/cpu_pool_sweep.py --quant $1 --threads 16 --tokens 1 --layout-ab $2 \
    --out $O/pool-$1 2>&1 | grep -A4 "^quant " | tail -3
done
el "pool overhead"
timeout 60 python3 bench/cpu_pool_sweep.py --threads 16 --overhead-only --out $O/pool-overhead 2>&1 | tail -8
tar -cf $OUT/ad.tar -C $O .
el "done"
