#!/usr/bin/env bash
# Session 12, call FC: the pool on its resident team against parallel regions inside one process
# (bench/pool_team_ab.py: blocks of calls alternating, the process's memory the same for both;
# call FA/FB showed whole processes of one arm differing by 10-25%), for IQ3_XXS, Q4_K and IQ1_M;
# then the issue-#3 command for each (the team is the default).
. bench/h200/lib.sh
O=/tmp/fcout; rm -rf $O && mkdir -p $O
for q in IQ3_XXS Q4_K IQ1_M; do
  el "team vs regions $q"
  timeout 150 python3 bench/pool_team_ab.py --quant $q --json $O/team-ab-$q.json 2>&1 | tail -3
done
for q in IQ3_XXS Q4_K IQ1_M; do
  el "issue command $q T=1"
  timeout 60 python3 -m strata.bench --arm cpu-pool --shape qwen3-30b-a3b --quant $q -t 1 \
    --json $O/cpu-pool-$q-t1.json 2>&1 | tail -2 | head -1
done
tar -cf $OUT/fc.tar -C $O .
el "done"
