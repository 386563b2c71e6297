#!/usr/bin/env bash
# Session 5, first call: the GPU suite with programmatic dependent launch in the captured graphs
# (pdl.py), all-resident decode with PDL on / off / on + the fused gate/up + quant variant, and
# the gpu-kernels arm (GEMV chains with and without PDL, the layer both ways).
. bench/h200/lib.sh
start_model
el "GPU tests"
timeout 240 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider -x 2>&1 | tee $OUT/gpu-tests.txt | tail -3
wait_model
for arm in pdl1-legacy pdl0-legacy pdl1-fq; do
  el "all-gpu $arm"
  p=${arm%%-*}; v=${arm#*-}
  STRATA_GPU_PDL=${p#pdl} STRATA_MOE_VARIANT=$v+legacy timeout 80 python3 -m strata.bench --arm all-gpu \
    --model $M --vram-budget-widen --vram-budget-mib 40000 -p 512 -n 128 -r 3 --json $OUT/all-gpu-$arm.json \
    2>&1 | grep -E "^all-gpu|Error" | tail -2
done
el "gpu-kernels"
timeout 150 python3 -m strata.bench --arm gpu-kernels --json $OUT/gpu-kernels.json > $OUT/gpu-kernels.txt 2>&1
grep -E "attn_q|layer|copy" $OUT/gpu-kernels.txt | head -40
el "done"
