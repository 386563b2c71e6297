#!/usr/bin/env bash
# Session 13, call GC: the issue-#3 command (cpu-pool arm, T = 1, 16 threads) for IQ3_XXS, Q4_K
# and IQ1_M, two processes each, alternating: per call from Python (as before) and a step of
# every layer copy through the step server (served_*).
. bench/h200/lib.sh
O=/tmp/gcout; rm -rf $O && mkdir -p $O
for r in 1 2; do
  for q in IQ3_XXS Q4_K IQ1_M; do
    el "cpu-pool $q run $r"
    timeout 120 python3 -m strata.bench --arm cpu-pool --shape qwen3-30b-a3b --quant $q -t 1 \
      --json $O/cpu-pool-$q-t1-r$r.json > $O/cpu-pool-$q-t1-r$r.txt 2>&1; echo "rc=$?"
    grep -E "^qwen|served" $O/cpu-pool-$q-t1-r$r.txt
  done
done
tar -cf $OUT/gc.tar -C $O .
el "done"
