#!/usr/bin/env bash
# Session 12, call FF: where a T = 1 pool call's time goes on the 16 cores, on the team and on
# parallel regions (bench/pool_call_overhead.py: the slowest thread's phases at n = 0 and 8 tasks).
. bench/h200/lib.sh
O=/tmp/ffout; rm -rf $O && mkdir -p $O
for a in "IQ3_XXS 1" "Q4_K 1" "IQ3_XXS 0"; do
  set -- $a
  el "call overhead $1 team=$2"
  STRATA_POOL_TEAM=$2 timeout 150 python3 bench/pool_call_overhead.py --threads 16 --quant $1 2>&1 \
    | tee $O/overhead-$1-team$2.txt
done
tar -cf $OUT/ff.tar -C $O .
el "done"
