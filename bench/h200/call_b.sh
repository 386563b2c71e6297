#!/usr/bin/env bash
# Call B: llama.cpp beside Strata at 10240 MiB (-p 512 -n 128), then the 4K CAR arms.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
el "start"
bash bench/h200/prep.sh > /tmp/prep.log 2>&1; tail -1 /tmp/prep.log
timeout 420 python3 scripts/llama_side_by_side.py wait 2>&1 | tail -2
el "side by side"
timeout 330 python3 scripts/llama_side_by_side.py run --model /tmp/q30.gguf --vram-budget-mib 10240 \
  -p 512 -n 128 -r 3 -t 16 --strata-extra "--pack /tmp/q30-pack --calibrate" --out $OUT 2>&1 | tail -40
el "car arms, 4K prompt"
timeout 220 python3 -m strata.bench --arm car-off --arm car-on --model /tmp/q30.gguf --pack /tmp/q30-pack \
  --calibrate --prefill-once -p 4096 -n 256 -r 8 --json $OUT/car-4k.json 2>&1 | grep -v "it/s\]$" | tail -12
el "done"
