#!/usr/bin/env bash
# Session 27, call UC: the whole GPU suite at this commit (no GPU code changed since session 25's
# 4f6a4e0), the all-resident engine at positions 4096-4224, and the gpu-kernels arm, for the
# issue notes' up-to-date figures. Files straight into $OUT (a cut-off run keeps what finished).
. bench/h200/lib.sh
start_model
el "gpu suite"
timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > $OUT/gpu-suite.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu-suite.txt | tail -8
wait_model || echo "no model"
el "all-gpu, positions 4096-4224"
timeout 90 python3 -m strata.bench --arm all-gpu --model $M --vram-budget-widen --vram-budget-mib 40000 \
  -p 4096 -n 128 -r 3 --json $OUT/all-gpu.json > $OUT/all-gpu.txt 2>&1
echo "rc=$?"; grep -E "^all-gpu|rror" $OUT/all-gpu.txt | tail -2
el "gpu-kernels"
timeout 110 python3 -m strata.bench --arm gpu-kernels --json $OUT/gpu-kernels.json > $OUT/gpu-kernels.txt 2>&1
echo "rc=$?"; grep -E "copy|IQ3_XXS|Q4_K .*attn_q|layer|attention_decode " $OUT/gpu-kernels.txt | head -24
el "done"
