#!/usr/bin/env bash
# Session 27, call UF: the pool's tail split (STRATA_POOL_TAIL_SPLIT: the units that run last, one
# a thread's worth, N times smaller) as arms against the uniform units, calls interleaved in one
# process, 16 threads: IQ1_M T2 and IQ3_XXS pm at T = 1 and 8, Q4_K at T = 1.
. bench/h200/lib.sh
O=/tmp/ufout; rm -rf $O && mkdir -p $O
for c in IQ1_M:1 IQ3_XXS:1 Q4_K:1 IQ1_M:8 IQ3_XXS:8; do
  q=${c%:*}; t=${c#*:}
  el "$q T=$t"
  timeout 110 python3 bench/cpu_pool_sweep.py --quant $q --threads 16 --tokens $t --repeats 40 \
    --layout-ab auto,auto@ts=2,auto@ts=4 --out $O/ts-$q-t$t > $O/ts-$q-t$t.txt 2>&1
  echo "rc=$?"; grep -A4 "calls interleaved" $O/ts-$q-t$t.txt | grep -E "^$q "
done
tar czf $OUT/uf.tgz -C $O .
el "done"
