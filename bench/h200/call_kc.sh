#!/usr/bin/env bash
# Session 17, call KC: a prompt's resident experts launched before its staged misses (the
# default) against after them (STRATA_PREFILL_RESIDENT_FIRST=0), car-on at the 10240 MiB
# budget on the 48-layer Qwen3-30B-A3B-shaped IQ3_XXS model and its pack (prepared in KA),
# A B B A, one process a run.
. bench/h200/lib.sh
O=/tmp/kcout; rm -rf $O && mkdir -p $O
for _ in $(seq 1 60); do grep -q PREP-DONE /tmp/prep.log 2>/dev/null && break; sleep 3; done
el "prep: $(tail -1 /tmp/prep.log)"
for a in 1 0 0 1; do
  el "car-on resident-first=$a"
  STRATA_PREFILL_RESIDENT_FIRST=$a timeout 140 python3 -m strata.bench --arm car-on \
    --model /tmp/q30.gguf --pack /tmp/q30-pack --calibrate -p 512 -n 128 -r 3 \
    --json $O/car-on-rf$a-$SECONDS.json > $O/car-on-rf$a-$SECONDS.log 2>&1; echo "rc=$?"
done
python3 - $O <<'PY'
import glob, json, sys
for p in sorted(glob.glob(sys.argv[1] + "/car-on-*.json")):
    r = json.load(open(p))["results"][0]
    keys = ("prefill_tps", "decode_tps", "hit_rate", "prefill_offloaded_picks", "resident_experts")
    print(p.rsplit("/", 1)[1], {k: round(r[k], 3) for k in keys if k in r})
PY
cp $O/* $OUT/
el "done"
