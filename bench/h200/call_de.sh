#!/usr/bin/env bash
# Session 10, call DE (the expert-major down, the default since d9e9db1): the command for
# IQ3_XXS (call DD's 60 s limit ran out in its first compile), then a second interleaved sample of
# @dx=0 against the default for IQ3_XXS and IQ1_M at T = 1 on 16 threads.
. bench/h200/lib.sh
O=/tmp/deout; rm -rf $O && mkdir -p $O
el "issue command IQ3_XXS T=1"
timeout 200 python3 -m strata.bench --arm cpu-pool --shape qwen3-30b-a3b --quant IQ3_XXS -t 1 \
  --json $O/cpu-pool-arm-IQ3_XXS-t1.json 2>&1 | tail -2 | head -1
for q in IQ3_XXS IQ1_M; do
  el "pool T=1 $q dx, second sample"
  timeout 100 python3 bench/cpu_pool_sweep.py --quant $q --threads 16 --tokens 1 --repeats 40 \
    --layout-ab repack,repack@dx=0 --out $O/pool-dx2-$q-t1 2>&1 | sed -n '/^quant /,/^```/p'
done
tar -cf $OUT/de.tar -C $O .
el "done"
