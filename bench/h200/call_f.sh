#!/usr/bin/env bash
# Session 3, call F: llama.cpp beside Strata in one run at 10240 MiB (-p 512 -n 128, -r 3), the
# Strata arms with routing on the card (the routed hybrid step), the pack and calibrated placement.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
el "start"
bash bench/h200/prep.sh > /tmp/prep.log 2>&1; tail -1 /tmp/prep.log
timeout 60 python3 scripts/llama_side_by_side.py wait 2>&1 | tail -2
el "side by side"
timeout 520 python3 scripts/llama_side_by_side.py run --model /tmp/q30.gguf --vram-budget-mib 10240 \
  -p 512 -n 128 -r 3 -t 16 --strata-extra "--pack /tmp/q30-pack --calibrate" --out $OUT 2>&1 | tail -40
el "done"
