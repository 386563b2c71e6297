#!/usr/bin/env bash
# Session 9, call CD: the schedule arms again with more repeats and each arm's slowest call
# traced (the dynamic arms' means sat far above their medians in call CC): T = 1 on 16 threads,
# the static split against the default (16 gate/up + 4 down units a thread, prefetch while
# waiting) and dynamic gate/up with the static down split; the cpu-pool command
# (now 20 repeats by default) for the three formats, and T = 512 for IQ3_XXS.
. bench/h200/lib.sh
O=/tmp/cdout; rm -rf $O && mkdir -p $O
for q in IQ3_XXS IQ1_M Q4_K; do
  el "pool T=1 $q"
  timeout 150 python3 bench/cpu_pool_sweep.py --quant $q --threads 16 --tokens 1 --repeats 60 \
    --layout-ab repack@u=0@d=0@wp=0,repack,repack@d=0 \
    --out $O/pool-sched-$q-t1 2>&1 | sed -n '/^quant /,/^```/p;/^arm |/,$p'
done
for q in IQ3_XXS IQ1_M Q4_K; do
  el "issue command $q T=1"
  timeout 100 python3 -m strata.bench --arm cpu-pool --shape qwen3-30b-a3b --quant $q -t 1 \
    --json $O/cpu-pool-arm-$q-t1.json 2>&1 | tail -2 | head -1
done
el "issue command IQ3_XXS T=512"
timeout 150 python3 -m strata.bench --arm cpu-pool --shape qwen3-30b-a3b --quant IQ3_XXS -t 512 \
  --json $O/cpu-pool-arm-IQ3_XXS-t512.json 2>&1 | tail -2 | head -1
tar -cf $OUT/cd.tar -C $O .
el "done"
