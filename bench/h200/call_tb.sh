#!/usr/bin/env bash
# Session 26, call TB (TA again after the decode became one vpermi2b + masks, with the float-lane
# row kernels as arms t7@k=48, t2@k=49): IQ1_M's T7 layout (7-bit ternary quads, 1.21x the GGUF
# bytes) on the card's 16-core host: its AVX-512 kernel's tests on real hardware, the one-core and 16-busy-core kernel
# ceilings against T2 and the GGUF bytes, the pool's decode layer (T = 1, 8) with the three
# layouts interleaved, and the cpu-pool arm on T7. Outputs tarred into one file (the device
# returns at most 8 files a call).
. bench/h200/lib.sh
O=/tmp/tbout; rm -rf $O && mkdir -p $O
el "t7 + t2 kernel tests"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_cpu_iq1_t7.py \
  tests/test_cpu_iq1_t2_avx512.py > $O/tests.txt 2>&1
echo "rc=$?"; tail -3 $O/tests.txt
el "ceilings"
timeout 100 python3 bench/cpu_pool_sweep.py --quant IQ1_M --ceiling-only --ceiling-threads 16 \
  --layout-ab t7,t7@k=48,t2,t2@k=49,gguf --out $O/ceil > $O/ceil.txt 2>&1
echo "rc=$?"; grep -E "IQ1_M" $O/ceil.txt | head -12
for t in 1 8; do
  el "layout A/B T=$t"
  timeout 110 python3 bench/cpu_pool_sweep.py --quant IQ1_M --threads 16 --tokens $t --repeats 30 \
    --layout-ab t7,t7@k=48,t2,t2@k=49,gguf --out $O/ab-t$t > $O/ab-t$t.txt 2>&1
  echo "rc=$?"; grep -A6 "calls interleaved" $O/ab-t$t.txt | grep -E "^IQ1_M "
done
el "IQ3_XXS, Q4_K at the defaults, T=1 (this lease's context)"
timeout 90 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS,Q4_K --threads 16 --tokens 1 --repeats 30 \
  --layout-ab auto --out $O/ctx-t1 > $O/ctx-t1.txt 2>&1
echo "rc=$?"; grep -A5 "calls interleaved" $O/ctx-t1.txt | grep -E "^(IQ|Q)"
el "cpu-pool arm, T7"
STRATA_CPU_LAYOUT=IQ1_M=t7 timeout 60 python3 -m strata.bench --arm cpu-pool --shape qwen3-30b-a3b \
  --quant IQ1_M -t 1 --json $O/arm-t7-t1.json > $O/arm-t7-t1.txt 2> $O/arm-t7-t1.err
echo "rc=$?"; tail -c 600 $O/arm-t7-t1.json
tar czf $OUT/tb.tgz -C $O .
el "done"
