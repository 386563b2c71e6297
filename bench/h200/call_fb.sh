#!/usr/bin/env bash
# Session 12, call FB: the whole GPU suite (the engine's CPU pool now runs on the resident team)
# while the model and pack are built; then the engine with every expert in the pool (all-cpu)
# and at 10240 MiB (car-on), the pool on its team against parallel regions (STRATA_POOL_TEAM=0),
# one process per sample, arms alternating.
. bench/h200/lib.sh
O=/tmp/fbout; rm -rf $O && mkdir -p $O
setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &
el "GPU tests (whole suite)"
timeout 300 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider > $O/gpu-tests.txt 2>&1
echo "rc=$?"; grep -E "passed|failed|FAIL" $O/gpu-tests.txt | tail -6
for i in $(seq 1 120); do grep -q -e PREP-DONE -e rror /tmp/prep.log && break; sleep 2; done; tail -1 /tmp/prep.log
for r in 1 2; do
  for tm in 1 0; do
    el "all-cpu team=$tm run $r"
    STRATA_POOL_TEAM=$tm timeout 80 python3 -m strata.bench --arm all-cpu --model $M \
      --pack /tmp/q30-pack -p 64 -n 64 -r 2 --json $O/all-cpu-team$tm-r$r.json 2>&1 | grep -E "^all-cpu|rror" | tail -2
  done
done
for tm in 1 0; do
  el "car-on team=$tm"
  STRATA_POOL_TEAM=$tm timeout 40 python3 -m strata.bench --arm car-on --model $M --pack /tmp/q30-pack \
    --calibrate -p 512 -n 128 -r 2 --json $O/car-on-team$tm.json 2>&1 | grep -E "^car-on|rror" | tail -2
done
tar -cf $OUT/fb.tar -C $O .
el "done"
