#!/usr/bin/env bash
# Session 15, call IC: a prompt's top-k on the card (router_picks), the dense GEMM's tiles of 64
# tokens (dense_mma; STRATA_GPU_DENSE_MMA_NT=32 the A/B arm) and the prompt attention on the
# tensor cores (STRATA_GPU_ATTN_MMA=0 the A/B arm): the tests that touch them, the prefill
# profile three ways, car-on at 10240 MiB.
. bench/h200/lib.sh
O=/tmp/icout; rm -rf $O && mkdir -p $O
(setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &)
el "gpu tests (prep in the background)"
timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_tier.py \
  tests/test_prefill_offload.py tests/test_gpu_graph.py tests/test_gpu_kernels.py -k "not decode_sweep" \
  > $O/gpu-tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-tests.txt | tail -12
el "waiting for the model and pack"
for _ in $(seq 1 150); do grep -q PREP-DONE /tmp/prep.log && break; sleep 2; done; tail -1 /tmp/prep.log
for cfg in "64|1" "32|1" "64|0"; do
  IFS='|' read -r nt am <<< "$cfg"
  el "prefill profile dense nt=$nt attn_mma=$am"
  STRATA_GPU_DENSE_MMA_NT=$nt STRATA_GPU_ATTN_MMA=$am timeout 150 python3 bench/h200/prefill_profile.py \
    $M 512 > $O/prefill-profile-t512-nt$nt-am$am.txt 2>&1
  echo "rc=$?"; grep -A14 "^prefill T" $O/prefill-profile-t512-nt$nt-am$am.txt
done
grep -A14 "host profile" $O/prefill-profile-t512-nt64-am1.txt | tail -9
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
tar -cf $OUT/ic.tar -C $O .
el "done"
