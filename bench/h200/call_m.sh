#!/usr/bin/env bash
# Session 4, call M: router_topk lanes, MoE unrolls, block_sum shuffle: GPU tests, all-gpu
# pairs, residual in moe_down): GPU tests, all-resident decode before (base.tar) and after, and
# the ncu per-kernel table after.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
M=/tmp/q30.gguf
[ -f $M ] || (setsid nohup python3 -m strata synth $M --shape qwen3-30b-a3b --quant IQ3_XXS --skew 1 \
  > /tmp/synth.log 2>&1 < /dev/null &)
el "GPU tests (kernels, graph, tier)"
timeout 250 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tee $OUT/gpu-tests.txt | tail -4
for i in $(seq 1 90); do [ -f $M ] && ! pgrep -f "strata synth" > /dev/null && break; sleep 2; done
mkdir -p /tmp/base && tar -xf .snap/base.tar -C /tmp/base
for side in after base; do
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

el "gpu-kernels arm"
timeout 150 python3 -m strata.bench --arm gpu-kernels --json $OUT/gpu-kernels.json 2>&1 | tail -40 > $OUT/gpu-kernels.txt
tail -40 $OUT/gpu-kernels.txt
el "done2"
