#!/usr/bin/env bash
# Call A: llama.cpp build (background), model + pack, GPU tests, the all-gpu arm.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
el "start"; nproc; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 scripts/llama_side_by_side.py build --background --jobs 10 2>&1 | tail -3
setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &
el "gpu tests"
timeout 200 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tee $OUT/gpu-tests.txt | tail -30
el "waiting for the model"
for i in $(seq 1 60); do grep -q MODEL-DONE /tmp/prep.log && break; sleep 5; done; tail -2 /tmp/prep.log
el "waiting for the llama.cpp build"
timeout 200 python3 scripts/llama_side_by_side.py wait 2>&1 | tail -3
el "all-gpu"
timeout 150 python3 -m strata.bench --arm all-gpu --model /tmp/q30.gguf --vram-budget-widen \
  --vram-budget-mib 40000 -p 512 -n 128 -r 3 --json $OUT/all-gpu.json 2>&1 | grep -v "it/s\]$" | tail -12
el "waiting for the pack"
for i in $(seq 1 40); do grep -q -e PREP-DONE -e rror /tmp/prep.log && break; sleep 5; done; tail -2 /tmp/prep.log
ls -la /tmp/q30.gguf /tmp/q30-pack; df -h /tmp | tail -1
el "done"
