#!/usr/bin/env bash
# Session 13, call GE: llama.cpp beside Strata at 10240 MiB (-p 512 -n 128 -r 3) on the model,
# pack and llama.cpp build of calls GA-GD (the engine's queued step now on the step server).
. bench/h200/lib.sh
el "model + pack (a fresh machine: GD's call started it)"
bash bench/h200/prep.sh > /tmp/prep.log 2>&1; tail -1 /tmp/prep.log
el "waiting for the llama.cpp build"
timeout 330 python3 scripts/llama_side_by_side.py wait 2>&1 | tail -2
el "side by side"
timeout 250 python3 scripts/llama_side_by_side.py run --model /tmp/q30.gguf --vram-budget-mib 10240 \
  -p 512 -n 128 -r 3 -t 16 --strata-extra "--pack /tmp/q30-pack --calibrate" --out $OUT 2>&1 | tail -40
el "done"
