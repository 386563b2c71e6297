#!/usr/bin/env bash
# Session 13, call GF (GD again without the llama.cpp build, whose compile load disturbed GD): the issue-#3
# command two more processes a format (with GC: four), and the serve A/B once more.
. bench/h200/lib.sh
O=/tmp/gfout; rm -rf $O && mkdir -p $O
for r in 3 4; do
  for q in IQ3_XXS Q4_K IQ1_M; do
    el "cpu-pool $q run $r"
    timeout 120 python3 -m strata.bench --arm cpu-pool --shape qwen3-30b-a3b --quant $q -t 1 \
      --json $O/cpu-pool-$q-t1-r$r.json > $O/cpu-pool-$q-t1-r$r.txt 2>&1; echo "rc=$?"
    grep -E "^qwen|served" $O/cpu-pool-$q-t1-r$r.txt
  done
done
for cfg in "all-cpu|--expert-cache 0" "6144|--expert-cache auto --vram-budget-mib 6144 --car-threshold 0.35"; do
  name=${cfg%%|*}; args=${cfg#*|}
  el "serve A/B $name (second process)"
  timeout 200 python3 bench/serve_ab.py --model $M --pack /tmp/q30-pack $args \
    --blocks 8 --steps 32 > $O/serve-ab-$name-r2.json 2> $O/serve-ab-$name-r2.err; echo "rc=$?"
  python3 -c "import json; r=json.load(open('$O/serve-ab-$name-r2.json')); print(r['compiled']['tps_median'], r['python']['tps_median'], r['compiled_over_python'])"
done
tar -cf $OUT/gf.tar -C $O .
el "done"
