#!/usr/bin/env bash
# Session 29, call WB: the AVX-512 VNNI Q4_K / Q5_K / Q6_K kernels (kquants_avx512.py, codes 53-55)
# on the lease's Xeon host: their tests, the pool's layer with each against the AVX2 kernel
# (codes 20 / 25 / 26) in one process, calls interleaved (T = 1 with per-core ceilings alone and with
# 16 busy), then the cpu-pool arm for Q4_K with each.
. bench/h200/lib.sh
O=/tmp/wbout; rm -rf $O && mkdir -p $O
el "K-quant kernel tests"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_cpu_kquants_avx512.py > $O/kq-tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/kq-tests.txt | tail -4
for t in 1; do
  el "Q4_K layer T=$t: avx512 against avx2, interleaved"
  extra=""; [ $t = 1 ] && extra="--ceiling-threads 16"
  timeout 150 python3 bench/cpu_pool_sweep.py --quant Q4_K --threads 16 --tokens $t --repeats 40 \
    --layout-ab gguf,gguf@k=20 $extra --out $O/q4k-t$t > $O/q4k-t$t.txt 2>&1
  echo "rc=$?"; grep -B2 -A6 "Kernel compute" $O/q4k-t$t.txt | grep -E "^\| Q4_K"
  grep -A4 "calls interleaved" $O/q4k-t$t.txt | grep -E "^Q4_K "
done
for qk in Q5_K:25 Q6_K:26; do q=${qk%:*}; k=${qk#*:}
  el "$q layer T=1: avx512 against avx2 (code $k), interleaved"
  timeout 150 python3 bench/cpu_pool_sweep.py --quant $q --threads 16 --tokens 1 --repeats 40 \
    --layout-ab gguf,gguf@k=$k --ceiling-threads 16 --out $O/$q-t1 > $O/$q-t1.txt 2>&1
  echo "rc=$?"; grep -A6 "Kernel compute" $O/$q-t1.txt | grep -E "^\| $q"
  grep -A4 "calls interleaved" $O/$q-t1.txt | grep -E "^$q "
done
arm() {  # tag quant tokens [env]
  el "cpu-pool arm $1"
  env ${4:-STRATA_X=0} timeout 100 python3 -m strata.bench --arm cpu-pool --shape qwen3-30b-a3b \
    --quant $2 -t $3 --json $O/arm-$1.json > $O/arm-$1.txt 2> $O/arm-$1.err
  echo "rc=$?"; grep -E "^qwen3|served" $O/arm-$1.txt | cut -c1-220
}
arm q4k-avx512 Q4_K 1
arm q4k-avx2 Q4_K 1 STRATA_CPU_SIMD=avx2
tar czf $OUT/wb.tgz -C $O .
el "done"
