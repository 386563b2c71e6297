#!/usr/bin/env bash
# Session 4, call L: after the decode-chain fixes (gemv1f router, norm_quant, router_topk +
# pairs, residual in moe_down): GPU tests, all-resident decode before (base.tar) and after, and
# the ncu per-kernel table after (SIDES: the order of the all-gpu runs).
. bench/h200/lib.sh
start_model
el "GPU tests (kernels, graph, tier)"
timeout 250 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tee $OUT/gpu-tests.txt | tail -4
wait_model
mkdir -p /tmp/base && tar -xf .snap/base.tar -C /tmp/base
for side in ${SIDES:-after base after}; do
  d=$PWD; [ $side = base ] && d=/tmp/base
  el "all-gpu $side"
  (cd $d && PYTHONPATH=/tmp/site:$d timeout 100 python3 -m strata.bench --arm all-gpu --model $M \
    --vram-budget-widen --vram-budget-mib 40000 -p 512 -n 128 -r 3 --json $OUT/all-gpu-$side.json 2>&1 \
    | grep -E "^all-gpu" | tail -1)
done
el "ncu"
timeout 200 ncu --clock-control none --cache-control none --profile-from-start off --metrics gpu__time_duration.sum \
  --csv --log-file $OUT/ncu-decode.csv python3 scripts/profile_decode.py run --model $M --tokens 2 2>&1 | tail -1
S=$(python3 -c "import json; print(1000/json.load(open('$OUT/all-gpu-after.json'))['results'][0]['decode_tps'])" 2>/dev/null)
python3 scripts/profile_decode.py report $OUT/ncu-decode.csv --tokens 2 --step-ms ${S:-0} | tee $OUT/ncu-report.txt | head -30
el "done"
