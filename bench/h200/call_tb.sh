#!/usr/bin/env bash
# Session 26, call TB: TA again after T7's decode became one vpermi2b + masks, and the
# float-lane row kernels (no per-block horizontal sum) as arms: IQ1_M t7 / t7@k=48 / t2 /
# t2@k=49 / gguf, IQ3_XXS pm / pm@k=50; the kernels' tests on real AVX-512 hardware, one-core
# and 16-busy-core ceilings, the pool's decode layer (T = 1, 8) with arms interleaved, Q4_K at
# the defaults for this lease's context, the cpu-pool arm on T7. Outputs tarred into one file.
. bench/h200/lib.sh
O=/tmp/tbout; rm -rf $O && mkdir -p $O
el "kernel tests (T7, T2, pm)"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_cpu_iq1_t7.py \
  tests/test_cpu_iq1_t2_avx512.py tests/test_cpu_iq3_pm.py > $O/tests.txt 2>&1
echo "rc=$?"; tail -3 $O/tests.txt
ab() {  # quant arms tag: ceilings, then T = 1 and 8
  el "$1 ceilings"
  timeout 100 python3 bench/cpu_pool_sweep.py --quant $1 --ceiling-only --ceiling-threads 16 \
    --layout-ab $2 --out $O/ceil-$3 > $O/ceil-$3.txt 2>&1
  echo "rc=$?"; grep -E "^\| $1" $O/ceil-$3.txt
  for t in 1 8; do
    el "$1 A/B T=$t"
    timeout 120 python3 bench/cpu_pool_sweep.py --quant $1 --threads 16 --tokens $t --repeats 30 \
      --layout-ab $2 --out $O/ab-$3-t$t > $O/ab-$3-t$t.txt 2>&1
    echo "rc=$?"; grep -A8 "calls interleaved" $O/ab-$3-t$t.txt | grep -E "^$1 "
  done
}
ab IQ1_M t7,t7@k=48,t2,t2@k=49,gguf iq1m
ab IQ3_XXS pm,pm@k=50 iq3
el "Q4_K at the defaults, T=1 (this lease's context)"
timeout 90 python3 bench/cpu_pool_sweep.py --quant Q4_K --threads 16 --tokens 1 --repeats 30 \
  --layout-ab auto --out $O/ctx-t1 > $O/ctx-t1.txt 2>&1
echo "rc=$?"; grep -A5 "calls interleaved" $O/ctx-t1.txt | grep -E "^Q4_K "
el "cpu-pool arm, T7"
STRATA_CPU_LAYOUT=IQ1_M=t7 timeout 60 python3 -m strata.bench --arm cpu-pool --shape qwen3-30b-a3b \
  --quant IQ1_M -t 1 --json $O/arm-t7-t1.json > $O/arm-t7-t1.txt 2> $O/arm-t7-t1.err
echo "rc=$?"; tail -c 400 $O/arm-t7-t1.txt
tar czf $OUT/tb.tgz -C $O .
el "done"
