#!/usr/bin/env bash
# Session 15, call II (c68cfce, the machine of calls IF/IH still held: IF's model, pack and
# llama.cpp build): llama.cpp beside Strata at 10240 MiB, car-on against --n-cpu-moe 13 (session
# 13's fitting peer layout), all-cpu against --cpu-moe. Run as one command line:
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 STRATA_COMMIT=c68cfce; . bench/h200/lib.sh
ls /tmp/q30.gguf /tmp/q30-pack/experts.bin > /dev/null \
  && timeout 20 python3 scripts/llama_side_by_side.py wait --timeout 15 2>&1 | tail -1
timeout 160 python3 scripts/llama_side_by_side.py run --model /tmp/q30.gguf --vram-budget-mib 10240 \
  -p 512 -n 128 -r 3 -t 16 --n-cpu-moe 13 --strata-arm car-on --strata-arm all-cpu \
  --strata-extra "--pack /tmp/q30-pack --calibrate" --out $OUT 2>&1 | tail -30
