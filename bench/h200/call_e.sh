#!/usr/bin/env bash
# Session 3, call E: the CPU's topology, the CUDA llama.cpp build (background, all cores), the
# Qwen3-30B-A3B-shaped IQ3_XXS model (skew 1) and its pack; waits for the build.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
el "start"; nproc; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
lscpu | grep -E "Model name|Thread|Core|Socket|NUMA node|L2|L3|Flags" | sed 's/\(Flags:.\{0,40\}\).*\(avx512_vnni\).*/\1 ... \2 .../' | tee $OUT/lscpu.txt
python3 scripts/llama_side_by_side.py build --background 2>&1 | tail -3
el "model + pack"
bash bench/h200/prep.sh > /tmp/prep.log 2>&1; tail -2 /tmp/prep.log
el "waiting for the llama.cpp build"
timeout 330 python3 scripts/llama_side_by_side.py wait 2>&1 | tail -3
el "done"
