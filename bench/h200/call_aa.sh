#!/usr/bin/env bash
# Prepared for the next session's first call (not run: session 6's device time was spent).
# 1. The gpu-kernels arm three times: one run of it hit an illegal address in sessions 5 and 6;
#    ae4679d made it wait for its default-stream uploads before timing on its non-blocking
#    stream (the likely cause). 2. The CPU pool at T = 1 on the final code (call Z2's pool runs
#    came on a disturbed host). Outputs go to one tarball (the run returns 8 files).
. bench/h200/lib.sh
O=/tmp/aaout; rm -rf $O && mkdir -p $O
for r in 1 2 3; do
  el "gpu-kernels run $r"
  timeout 150 python3 -m strata.bench --arm gpu-kernels --json $O/gpu-kernels-r$r.json > $O/gpu-kernels-r$r.txt 2>&1
  echo "rc=$?"; grep -E "error|layer decode\+pdl" $O/gpu-kernels-r$r.txt | head -3
done
for q in "IQ3_XXS repack,gguf" "IQ1_M repack,gguf" "Q4_K gguf"; do
  set -- $q
  el "pool $1 ($2)"
  timeout 100 python3 bench/cpu_pool_sweep.py --quant $1 --threads 16 --tokens 1 --layout-ab $2 \
    --out $O/pool-$1 2>&1 | grep -A4 "^quant " | tail -3
done
tar -cf $OUT/aa.tar -C $O .
el "done"
