#!/usr/bin/env bash
# Session 27, call UG: UF again on another lease (UF's host read 60-76 GB/s, calls stalled ms):
# the tail split 4 against uniform units, T = 1, IQ3_XXS / IQ1_M / Q4_K, 60 calls a run.
. bench/h200/lib.sh
O=/tmp/ugout; rm -rf $O && mkdir -p $O
for q in IQ3_XXS IQ1_M Q4_K; do
  el "$q T=1"
  timeout 100 python3 bench/cpu_pool_sweep.py --quant $q --threads 16 --tokens 1 --repeats 60 \
    --layout-ab auto,auto@ts=4 --out $O/ts-$q-t1 > $O/ts-$q-t1.txt 2>&1
  echo "rc=$?"; grep -A4 "calls interleaved" $O/ts-$q-t1.txt | grep -E "^$q "
done
tar czf $OUT/ug.tgz -C $O .
el "done"
