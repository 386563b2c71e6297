#!/usr/bin/env bash
# Session 18, call LC: the all-resident engine (every expert on the card, 512-token prompts)
# with its prompt's pairs grouped on the card (no read-back a layer) against the host grouping
# (STRATA_PREFILL_GROUP_ON_CARD=0), A B B A; then Q8_0's word loads in the same engine
# (STRATA_KERNEL_DEFINES=-DSTRATA_WORD_LOADS=0 against the default), A B B A; then where a
# 512-token prefill's device time goes now (bench/h200/prefill_profile.py).
. bench/h200/lib.sh
O=/tmp/lcout; rm -rf $O && mkdir -p $O
(setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &)
for _ in $(seq 1 60); do grep -q MODEL-DONE /tmp/prep.log 2>/dev/null && break; sleep 3; done
el "model: $(tail -1 /tmp/prep.log)"
run() {  # tag, env...
  local tag=$1; shift
  el "all-gpu $tag"
  env "$@" timeout 60 python3 -m strata.bench --arm all-gpu --model $M --vram-budget-widen \
    --vram-budget-mib 40000 -p 512 -n 32 -r 3 --json $O/all-gpu-$tag-$SECONDS.json > /dev/null 2>&1
  echo "rc=$?"
}
for x in 1 0 0 1; do run group$x STRATA_PREFILL_GROUP_ON_CARD=$x; done
for x in 1 0 0 1; do run words$x STRATA_KERNEL_DEFINES="-DSTRATA_WORD_LOADS=$x"; done
python3 - $O > $O/engine-ab.txt <<'PY'
import glob, json, os, sys
for p in sorted(glob.glob(sys.argv[1] + "/all-gpu-*.json"), key=os.path.getmtime):
    r = json.load(open(p))["results"][0]
    print(p.rsplit("/", 1)[1], {k: round(r[k], 3) for k in ("prefill_tps", "decode_tps") if k in r})
PY
cat $O/engine-ab.txt
el "prefill profile"
timeout 60 python3 bench/h200/prefill_profile.py $M 512 > $O/prefill-profile.txt 2>&1; echo "rc=$?"
head -24 $O/prefill-profile.txt
cp $O/*.txt $OUT/
el "done"
