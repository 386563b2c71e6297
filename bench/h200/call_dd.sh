#!/usr/bin/env bash
# Session 10, call DD: Q5_K's aligned decode with the session-9 load order restored (header, qh,
# quants) after call DC's single sweep read Q5_K's attn_q GEMV at 4.58 us (session 9: 4.28):
# base (fd9da80) and new alternating, two runs each; the GPU tests of Q4_K/Q5_K; the issue's
# command for the three formats on the expert-major down.
. bench/h200/lib.sh
O=/tmp/ddout; rm -rf $O && mkdir -p $O
BASE=/tmp/wb; rm -rf $BASE && mkdir -p $BASE && tar -xzf .snap/base.tgz -C $BASE && ln -s $PWD/strata/data $BASE/strata/data
SW="--builds fast+smem --quants Q4_K,Q5_K --moe-variants st1+legacy --gemv-variants split --gemv-shapes attn_q,attn_o"
for r in 1 2; do
  for side in base new; do
    el "sweep $side run $r"
    if [ $side = base ]; then d=$BASE; else d=$PWD; fi
    (cd $d && PYTHONPATH=/tmp/site:$d timeout 100 python3 bench/experts_decode_sweep.py $SW \
      --json $O/sweep-$side-r$r.json > $O/sweep-$side-r$r.txt 2>&1; echo "rc=$?")
    grep -E "^gemv1.*(attn_q|attn_o)|st1\+legacy|rror" $O/sweep-$side-r$r.txt | head -8
  done
done
el "GPU tests Q4_K / Q5_K"
timeout 200 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider -k "Q4_K or Q5_K" > $O/gpu-tests-k.txt 2>&1
echo "rc=$?"; tail -1 $O/gpu-tests-k.txt
for q in IQ3_XXS IQ1_M Q4_K; do
  el "issue command $q T=1"
  timeout 60 python3 -m strata.bench --arm cpu-pool --shape qwen3-30b-a3b --quant $q -t 1 \
    --json $O/cpu-pool-arm-$q-t1.json 2>&1 | tail -2 | head -1
done
tar -cf $OUT/dd.tar -C $O .
el "done"
