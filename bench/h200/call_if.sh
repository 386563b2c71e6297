#!/usr/bin/env bash
# Session 15, call IF (the final code): the llama.cpp build started in the background (for the
# side-by-side, call II), the model and pack too; the whole GPU suite; the prefill profile with the weights' cp.async
# staging and without (-DSTRATA_MMA_STAGE=0); car-on at 10240 MiB.
. bench/h200/lib.sh
O=/tmp/ifout; rm -rf $O && mkdir -p $O
python3 scripts/llama_side_by_side.py build --background --jobs 10 2>&1 | tail -2
(setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &)
el "gpu tests (prep and the llama.cpp build in the background)"
timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > $O/gpu-tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-tests.txt | tail -12
el "waiting for the model and pack"
for _ in $(seq 1 150); do grep -q PREP-DONE /tmp/prep.log && break; sleep 2; done; tail -1 /tmp/prep.log
for st in 1 0; do
  el "prefill profile stage=$st"
  STRATA_KERNEL_DEFINES="-DSTRATA_MMA_STAGE=$st" timeout 150 python3 bench/h200/prefill_profile.py \
    $M 512 > $O/prefill-profile-t512-stage$st.txt 2>&1
  echo "rc=$?"; grep -A14 "^prefill T" $O/prefill-profile-t512-stage$st.txt
done
el "car-on"
timeout 150 python3 -m strata.bench --arm car-on --model $M --pack /tmp/q30-pack --calibrate \
  -p 512 -n 128 -r 3 --json $O/car-on-1.json > /dev/null 2>&1; echo "rc=$?"
python3 - $O <<'PY'
import glob, json, sys
for p in sorted(glob.glob(sys.argv[1] + "/car-on-*.json")):
    r = json.load(open(p))["results"][0]
    print(p.rsplit("/", 1)[1], {k: round(r[k], 4) for k in ("prefill_tps", "decode_tps", "hit_rate", "peak_device_mib")})
PY
python3 scripts/llama_side_by_side.py wait --timeout 1 2>&1 | tail -2
tar -cf $OUT/if.tar -C $O .
el "done"
