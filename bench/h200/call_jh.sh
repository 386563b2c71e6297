#!/usr/bin/env bash
# Session 16, call JH: a prompt at a budget that leaves half the experts off the card (12-layer
# Qwen3-30B-A3B-shaped IQ3_XXS, 2048 MiB), its resident experts launched before its staged
# misses (the default) against after them (STRATA_PREFILL_RESIDENT_FIRST=0), A B B A. Results
# go straight to $OUT (the session's device time is nearly spent).
. bench/h200/lib.sh
M12=/tmp/q12.gguf
el "synth"
timeout 90 python3 -m strata synth $M12 --shape qwen3-30b-a3b --quant IQ3_XXS --skew 1 \
  --layers 12 --vocab 32000 > $OUT/synth.txt 2>&1; echo "rc=$?"
for a in 1 0 0 1; do
  el "car-on resident-first=$a"
  STRATA_PREFILL_RESIDENT_FIRST=$a timeout 60 python3 -m strata.bench --arm car-on --model $M12 \
    --vram-budget-widen --vram-budget-mib 2048 -p 512 -n 16 -r 3 \
    --json $OUT/car-on-rf$a-$SECONDS.json > /dev/null 2>&1; echo "rc=$?"
done
python3 - $OUT <<'PY'
import glob, json, sys
for p in sorted(glob.glob(sys.argv[1] + "/car-on-*.json")):
    r = json.load(open(p))["results"][0]
    print(p.rsplit("/", 1)[1], {k: round(r[k], 3) for k in ("prefill_tps", "decode_tps", "hit_rate", "prefill_offloaded_picks", "resident_experts")})
PY
el "done"
