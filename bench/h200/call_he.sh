#!/usr/bin/env bash
# Session 14, call HE (the final code): the whole GPU suite; the prefill profile with the MoE tiles
# on the tensor cores at chunks of 128 (default) and 512 tokens (STRATA_GPU_MOE_TMAX), and on dp4a
# (STRATA_GPU_MOE_MMA=0); car-on at 10240 MiB at both chunk sizes.
. bench/h200/lib.sh
O=/tmp/heout; rm -rf $O && mkdir -p $O
(setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &)
el "gpu tests (prep in the background)"
timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > $O/gpu-tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-tests.txt | tail -12
el "waiting for the model and pack"
for _ in $(seq 1 150); do grep -q PREP-DONE /tmp/prep.log && break; sleep 2; done; tail -1 /tmp/prep.log
for cfg in "1|128" "1|512" "0|128"; do
  IFS='|' read -r mma tmax <<< "$cfg"
  el "prefill profile mma=$mma tmax=$tmax"
  STRATA_GPU_MOE_MMA=$mma STRATA_GPU_MOE_TMAX=$tmax timeout 150 python3 bench/h200/prefill_profile.py \
    $M 512 > $O/prefill-profile-t512-mma$mma-tmax$tmax.txt 2>&1
  echo "rc=$?"; grep -A7 "^prefill T" $O/prefill-profile-t512-mma$mma-tmax$tmax.txt
done
for tmax in 128 512 128 512; do
  el "car-on tmax=$tmax"
  STRATA_GPU_MOE_TMAX=$tmax timeout 150 python3 -m strata.bench --arm car-on --model $M \
    --pack /tmp/q30-pack --calibrate -p 512 -n 128 -r 3 --adapt-swaps 96 \
    --json $O/car-on-tmax$tmax-$SECONDS.json > /dev/null 2>&1; echo "rc=$?"
done
python3 - $O <<'PY'
import glob, json, sys
for p in sorted(glob.glob(sys.argv[1] + "/car-on-*.json")):
    r = json.load(open(p))["results"][0]
    print(p.rsplit("/", 1)[1], {k: round(r[k], 4) for k in ("prefill_tps", "decode_tps", "hit_rate", "peak_device_mib")})
PY
tar -cf $OUT/he.tar -C $O .
el "done"
