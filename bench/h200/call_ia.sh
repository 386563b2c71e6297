#!/usr/bin/env bash
# Session 15, call IA (9e0ddb2, session 14's final code): the whole GPU suite (the router's single
# read-back and the host tier's attention changed after the last card call); the prefill profile
# and car-on at 10240 MiB as this session's baseline.
. bench/h200/lib.sh
O=/tmp/iaout; rm -rf $O && mkdir -p $O
(setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &)
el "gpu tests (prep in the background)"
timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > $O/gpu-tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-tests.txt | tail -12
el "waiting for the model and pack"
for _ in $(seq 1 150); do grep -q PREP-DONE /tmp/prep.log && break; sleep 2; done; tail -1 /tmp/prep.log
el "prefill profile"
timeout 150 python3 bench/h200/prefill_profile.py $M 512 > $O/prefill-profile-t512.txt 2>&1
echo "rc=$?"; grep -A12 "^prefill T" $O/prefill-profile-t512.txt
for i in 1 2; do
  el "car-on $i"
  timeout 150 python3 -m strata.bench --arm car-on --model $M --pack /tmp/q30-pack --calibrate \
    -p 512 -n 128 -r 3 --json $O/car-on-$i.json > /dev/null 2>&1; echo "rc=$?"
done
python3 - $O <<'PY'
import glob, json, sys
for p in sorted(glob.glob(sys.argv[1] + "/car-on-*.json")):
    r = json.load(open(p))["results"][0]
    print(p.rsplit("/", 1)[1], {k: round(r[k], 4) for k in ("prefill_tps", "decode_tps", "hit_rate", "peak_device_mib")})
PY
tar -cf $OUT/ia.tar -C $O .
el "done"
