#!/usr/bin/env bash
# Call C: the GPU tests again after fixes, and the car arms with the auto expert cache.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &
el "gpu tests"
timeout 170 python3 -m pytest -q -m gpu tests/test_gpu_graph.py tests/test_gpu_tier.py tests/test_gpu_budget.py \
  tests/test_gpu_grouped.py tests/test_gpu_decode.py -p no:cacheprovider 2>&1 | tee $OUT/gpu-tests-c.txt | tail -15
for i in $(seq 1 60); do grep -q -e PREP-DONE -e rror /tmp/prep.log && break; sleep 5; done; tail -1 /tmp/prep.log
el "car arms, auto cache"
timeout 200 python3 -m strata.bench --arm car-off --arm car-on --model /tmp/q30.gguf --pack /tmp/q30-pack --calibrate \
  -p 512 -n 128 -r 3 --json $OUT/car-auto.json 2>&1 | grep -v "it/s\]$" | tail -8
el "done"
