#!/usr/bin/env bash
# Call D: the graph tests after the routed hybrid step and greedy-on-card, then all-gpu and the
# car arms again (auto cache, calibrated placement, the pack).
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &
el "gpu graph tests"
timeout 100 python3 -m pytest -q -m gpu tests/test_gpu_graph.py -p no:cacheprovider 2>&1 | tee $OUT/gpu-graph-tests.txt | tail -12
for i in $(seq 1 40); do grep -q -e MODEL-DONE -e rror /tmp/prep.log && break; sleep 3; done
el "all-gpu"
timeout 60 python3 -m strata.bench --arm all-gpu --model /tmp/q30.gguf --vram-budget-widen --vram-budget-mib 40000 \
  -p 512 -n 128 -r 2 --json $OUT/all-gpu-d.json 2>&1 | grep -v "it/s\]$" | tail -4
for i in $(seq 1 40); do grep -q -e PREP-DONE -e rror /tmp/prep.log && break; sleep 3; done
el "car arms"
timeout 100 python3 -m strata.bench --arm car-off --arm car-on --model /tmp/q30.gguf --pack /tmp/q30-pack --calibrate \
  -p 512 -n 128 -r 2 --json $OUT/car-d.json 2>&1 | grep -v "it/s\]$" | tail -6
el "done"
