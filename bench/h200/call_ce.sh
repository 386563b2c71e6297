#!/usr/bin/env bash
# Session 9, call CE: call CD's arms after fixing the A/B harness (arms of one layout shared a layer
# copy within a round, so all but the first read experts the call before had just pulled into
# the caches; each call now takes the next copy, and T = 1 routings walk a permutation of the
# experts so none comes back within 16 calls): T = 1 on 16 threads,
# the static split against the default (16 gate/up + 4 down units a thread, prefetch while
# waiting) and dynamic gate/up with the static down split; the cpu-pool command
# (20 repeats) for the three formats.
. bench/h200/lib.sh
O=/tmp/ceout; rm -rf $O && mkdir -p $O
for q in IQ3_XXS IQ1_M Q4_K; do
  el "pool T=1 $q"
  timeout 150 python3 bench/cpu_pool_sweep.py --quant $q --threads 16 --tokens 1 --repeats 40 \
    --layout-ab repack@u=0@d=0@wp=0,repack,repack@d=0 \
    --out $O/pool-sched-$q-t1 2>&1 | sed -n '/^quant /,/^```/p;/^arm |/,$p'
done
for q in IQ3_XXS IQ1_M Q4_K; do
  el "issue command $q T=1"
  timeout 100 python3 -m strata.bench --arm cpu-pool --shape qwen3-30b-a3b --quant $q -t 1 \
    --json $O/cpu-pool-arm-$q-t1.json 2>&1 | tail -2 | head -1
done
tar -cf $OUT/ce.tar -C $O .
el "done"
