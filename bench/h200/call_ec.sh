#!/usr/bin/env bash
# Session 11, call EC: call EB found the queued-ahead step's wait method shadowed by the device
# plan dict (`plan`, renamed `wait_plan`). The whole GPU suite at this commit (under a timeout: a
# join that never sees its release would hang), while the model and pack are built; then car-on
# and all-cpu at 10240 MiB, queued ahead (default) against STRATA_GPU_ROUTED_AHEAD=0, alternating.
. bench/h200/lib.sh
O=/tmp/ecout; rm -rf $O && mkdir -p $O
setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &
el "GPU tests (whole suite)"
timeout 330 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider > $O/gpu-tests.txt 2>&1
echo "rc=$?"; grep -E "passed|failed|FAIL" $O/gpu-tests.txt | tail -6
for i in $(seq 1 120); do grep -q -e PREP-DONE -e rror /tmp/prep.log && break; sleep 2; done; tail -1 /tmp/prep.log
for r in 1 2; do
  for ah in 1 0; do
    el "car-on ahead=$ah run $r"
    STRATA_GPU_ROUTED_AHEAD=$ah timeout 60 python3 -m strata.bench --arm car-on --model $M \
      --pack /tmp/q30-pack --calibrate -p 512 -n 128 -r 2 --json $O/car-on-ah$ah-r$r.json 2>&1 \
      | grep -E "^car-on|rror" | tail -2
  done
done
for ah in 1 0; do
  el "all-cpu ahead=$ah"
  STRATA_GPU_ROUTED_AHEAD=$ah timeout 80 python3 -m strata.bench --arm all-cpu --model $M \
    --pack /tmp/q30-pack -p 64 -n 64 -r 2 --json $O/all-cpu-ah$ah.json 2>&1 | grep -E "^all-cpu|rror" | tail -2
done
tar -cf $OUT/ec.tar -C $O .
el "done"
