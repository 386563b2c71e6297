#!/usr/bin/env bash
# Session 15, call IG: llama.cpp beside Strata at 10240 MiB (-p 512 -n 128 -r 3) on call IF's
# model, pack and llama.cpp build: car-on against --n-cpu-moe 13 (the peer layout that fit the
# budget in session 13's call GE), car-off and all-cpu against their peers.
. bench/h200/lib.sh
el "model + pack (call IF made them; a fresh machine makes them again)"
bash bench/h200/prep.sh > /tmp/prep.log 2>&1; tail -1 /tmp/prep.log
el "waiting for the llama.cpp build"
timeout 400 python3 scripts/llama_side_by_side.py wait --timeout 390 2>&1 | tail -2
el "side by side"
timeout 300 python3 scripts/llama_side_by_side.py run --model /tmp/q30.gguf --vram-budget-mib 10240 \
  -p 512 -n 128 -r 3 -t 16 --n-cpu-moe 13 --strata-extra "--pack /tmp/q30-pack --calibrate" \
  --out $OUT 2>&1 | tail -40
el "done"
