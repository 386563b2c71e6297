#!/usr/bin/env bash
# Session 12, call FA: the CPU pool on its resident team (strata/cpu/team.py) against Numba's
# parallel regions (STRATA_POOL_TEAM=0): what starting a region costs on the 16 cores
# (bench/region_launch.py), then the issue-#3 command for IQ3_XXS alternating the two arms in
# separate processes, then Q4_K and IQ1_M on the team.
. bench/h200/lib.sh
O=/tmp/faout; rm -rf $O && mkdir -p $O
el "region launch"
timeout 60 python3 bench/region_launch.py --calls 20000 2>&1 | tee $O/region-launch.txt
for r in 1 2; do
  for tm in 1 0; do
    el "issue command IQ3_XXS T=1 team=$tm run $r"
    STRATA_POOL_TEAM=$tm timeout 200 python3 -m strata.bench --arm cpu-pool --shape qwen3-30b-a3b \
      --quant IQ3_XXS -t 1 --json $O/cpu-pool-IQ3_XXS-t1-team$tm-r$r.json 2>&1 | tail -2 | head -1
  done
done
for q in Q4_K IQ1_M; do
  el "issue command $q T=1 team=1"
  timeout 150 python3 -m strata.bench --arm cpu-pool --shape qwen3-30b-a3b --quant $q -t 1 \
    --json $O/cpu-pool-$q-t1-team1.json 2>&1 | tail -2 | head -1
done
tar -cf $OUT/fa.tar -C $O .
el "done"
