#!/usr/bin/env bash
# Session 10, call DB: the pool's guided units (smaller at a phase's end) and the intermediate
# quantized inside gate/up (no phase 3 and barrier 3), each alone and together, against the
# session-9 schedule (@g=0@iq=0), T = 1 on 16 threads, interleaved, phase table; T = 8 for
# IQ3_XXS; the fixed cost with 0-8 experts; the command for the three formats.
. bench/h200/lib.sh
O=/tmp/dbout; rm -rf $O && mkdir -p $O
for q in IQ3_XXS IQ1_M Q4_K; do
  el "pool T=1 $q"
  timeout 150 python3 bench/cpu_pool_sweep.py --quant $q --threads 16 --tokens 1 --repeats 40 \
    --layout-ab repack@g=0@iq=0,repack@g=0,repack@iq=0,repack \
    --out $O/pool-giq-$q-t1 2>&1 | sed -n '/^quant /,/^```/p;/^arm |/,$p' | grep -v "^$"
done
el "pool T=8 IQ3_XXS"
timeout 100 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS --threads 16 --tokens 8 --repeats 30 \
  --layout-ab repack@g=0@iq=0,repack --out $O/pool-giq-IQ3_XXS-t8 2>&1 | sed -n '/^quant /,/^```/p'
el "fixed cost (overhead table), 16 threads"
timeout 90 python3 bench/cpu_pool_sweep.py --overhead-only --threads 16 --quant IQ3_XXS 2>&1 \
  | grep "qwen3-30b-a3b\|empty"
for q in IQ3_XXS IQ1_M Q4_K; do
  el "issue command $q T=1"
  timeout 60 python3 -m strata.bench --arm cpu-pool --shape qwen3-30b-a3b --quant $q -t 1 \
    --json $O/cpu-pool-arm-$q-t1.json 2>&1 | tail -2 | head -1
done
tar -cf $OUT/db.tar -C $O .
el "done"
