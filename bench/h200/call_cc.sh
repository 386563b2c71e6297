#!/usr/bin/env bash
# Session 9, call CC: the pool's schedule arms interleaved in one process, T = 1 on 16 threads,
# IQ3_XXS (pm), IQ1_M (t2), Q4_K: the static split (session 8's pool), dynamic units without and
# with prefetching while barriers wait, other unit counts; T = 8 IQ3_XXS static vs default; the
# issue's cpu-pool command (T = 1 for the three, T = 512 IQ3_XXS); the CPU pool tests here.
. bench/h200/lib.sh
O=/tmp/ccout; rm -rf $O && mkdir -p $O
for q in IQ3_XXS IQ1_M Q4_K; do
  el "pool T=1 $q"
  timeout 170 python3 bench/cpu_pool_sweep.py --quant $q --threads 16 --tokens 1 \
    --layout-ab repack@u=0@d=0@wp=0,repack@wp=0,repack,repack@u=16@d=2,repack@u=32@d=4 \
    --out $O/pool-sched-$q-t1 2>&1 | sed -n '/^quant /,/^```/p;/^arm |/,$p'
done
el "pool T=8 IQ3_XXS"
timeout 150 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS --threads 16 --tokens 8 \
  --layout-ab repack@u=0@d=0@wp=0,repack --out $O/pool-sched-IQ3_XXS-t8 2>&1 | sed -n '/^quant /,/^```/p;/^arm |/,$p'
for q in IQ3_XXS IQ1_M Q4_K; do
  el "issue command $q T=1"
  timeout 100 python3 -m strata.bench --arm cpu-pool --shape qwen3-30b-a3b --quant $q -t 1 \
    --json $O/cpu-pool-arm-$q-t1.json 2>&1 | tail -2
done
el "issue command IQ3_XXS T=512"
timeout 150 python3 -m strata.bench --arm cpu-pool --shape qwen3-30b-a3b --quant IQ3_XXS -t 512 \
  --json $O/cpu-pool-arm-IQ3_XXS-t512.json 2>&1 | tail -2
el "CPU pool tests"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_cpu_pool.py > $O/cpu-pool-tests.txt 2>&1
echo "rc=$?"; tail -2 $O/cpu-pool-tests.txt
tar -cf $OUT/cc.tar -C $O .
el "done"
