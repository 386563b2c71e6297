#!/usr/bin/env bash
# Session 18, call LE (the machine of call LD still held: its model, pack and llama.cpp build):
# llama.cpp beside Strata at 10240 MiB (car-on against --n-cpu-moe 13, session 13's fitting
# layout; llama.cpp's all-GPU and --cpu-moe rows as the script runs them), then Strata's
# all-gpu arm (every expert on the card) on the same file in the same call.
. bench/h200/lib.sh
ls /tmp/q30.gguf /tmp/q30-pack/experts.bin > /dev/null \
  && timeout 20 python3 scripts/llama_side_by_side.py wait --timeout 15 2>&1 | tail -1
timeout 300 python3 scripts/llama_side_by_side.py run --model /tmp/q30.gguf --vram-budget-mib 10240 \
  -p 512 -n 128 -r 3 -t 16 --n-cpu-moe 13 --strata-arm car-on \
  --strata-extra "--pack /tmp/q30-pack --calibrate" --out $OUT 2>&1 | tail -24
el "strata all-gpu"
timeout 120 python3 -m strata.bench --arm all-gpu --model /tmp/q30.gguf --vram-budget-widen \
  --vram-budget-mib 40000 -p 512 -n 128 -r 3 --json $OUT/strata-all-gpu.json 2>&1 | tail -6
el "done"
