#!/usr/bin/env bash
# Session 5, call W: the T = 1 GEMVs with 4 / 8 / 16 warps a block (STRATA_GEMV1_WARPS: fewer
# block launches for the same rows; the launch floor has 1280 empty blocks at ~2 us): their GPU
# tests at 16, all-resident decode at each, the gpu-kernels arm at 4 and 16.
. bench/h200/lib.sh
start_model
el "GEMV tests, 16 warps a block"
STRATA_GEMV1_WARPS=16 timeout 100 python3 -m pytest -q -m gpu tests/test_gpu_kernels.py -k "gemv" -p no:cacheprovider 2>&1 \
  | tee $OUT/gpu-tests-w16.txt | tail -1
wait_model
for w in 4 16 8 4; do
  el "all-gpu warps $w"
  STRATA_GEMV1_WARPS=$w timeout 60 python3 -m strata.bench --arm all-gpu --model $M --vram-budget-widen \
    --vram-budget-mib 40000 -p 512 -n 128 -r 3 --json $OUT/all-gpu-w$w.json 2>&1 | grep -E "^all-gpu|Error" | tail -1
done
for w in 16 4; do
  el "gpu-kernels warps $w"
  STRATA_GEMV1_WARPS=$w timeout 90 python3 -m strata.bench --arm gpu-kernels --json $OUT/gpu-kernels-w$w.json \
    > $OUT/gpu-kernels-w$w.txt 2>&1
  grep -E "floor|attn_q .*graph$|expert_gate .*graph$|layer decode" $OUT/gpu-kernels-w$w.txt | head -30
done
el "done"
