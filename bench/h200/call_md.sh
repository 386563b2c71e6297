#!/usr/bin/env bash
# Session 19, call MD: the whole GPU suite at the final kernel code (grid codes for IQ1_M, the
# sign spread, dense_mma's weight staging for Q8_0/Q4_K/Q6_K/IQ1_M), then the all-resident
# engine (512-token prompts) at the default build (the A/B of the staging ran in call MC).
. bench/h200/lib.sh
O=/tmp/mdout; rm -rf $O && mkdir -p $O
(setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &)
el "gpu suite"
timeout 250 python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > $O/gpu-tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-tests.txt | tail -12
for _ in $(seq 1 20); do grep -q MODEL-DONE /tmp/prep.log 2>/dev/null && break; sleep 3; done
el "model: $(tail -1 /tmp/prep.log)"
run() {  # tag, env...
  local tag=$1; shift
  el "all-gpu $tag"
  env "$@" timeout 60 python3 -m strata.bench --arm all-gpu --model $M --vram-budget-widen \
    --vram-budget-mib 40000 -p 512 -n 64 -r 3 --json $O/all-gpu-$tag-$SECONDS.json > /dev/null 2>&1
  echo "rc=$?"
}
run default
python3 - $O > $O/engine-ab.txt <<'PY'
import glob, json, os, sys
for p in sorted(glob.glob(sys.argv[1] + "/all-gpu-*.json"), key=os.path.getmtime):
    r = json.load(open(p))["results"][0]
    print(p.rsplit("/", 1)[1], {k: round(r[k], 3) for k in ("prefill_tps", "decode_tps") if k in r})
PY
cat $O/engine-ab.txt
cp $O/*.txt $O/*.json $OUT/ 2>/dev/null
el "done"
