#!/usr/bin/env bash
# Session 11, call EE (the last of the session's device time): the whole GPU suite at the final
# GPU code (the host's wait for a plan in compiled code without the GIL; the queued-ahead step's
# default off on HIP), while the model and pack are built; then car-on queued ahead twice and the
# per-layer arm once.
. bench/h200/lib.sh
O=/tmp/eeout; rm -rf $O && mkdir -p $O
setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &
el "GPU tests (whole suite)"
timeout 215 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider > $O/gpu-tests.txt 2>&1
echo "rc=$?"; grep -E "passed|failed|FAIL" $O/gpu-tests.txt | tail -6
for i in $(seq 1 10); do grep -q -e PREP-DONE -e rror /tmp/prep.log && break; sleep 2; done; tail -1 /tmp/prep.log
ARGS="--model $M --pack /tmp/q30-pack --calibrate -p 512 -n 128 -r 2"
for ah in 1 0 1; do
  el "car-on ahead=$ah"
  STRATA_GPU_ROUTED_AHEAD=$ah timeout 25 python3 -m strata.bench --arm car-on $ARGS \
    --json $O/car-on-ah$ah-$(date +%s).json 2>&1 | grep -E "^car-on|rror" | tail -2
done
tar -cf $OUT/ee.tar -C $O .
el "done"
