#!/usr/bin/env bash
# Session 24, call RC: the cluster decode kernel at its new defaults (16 blocks a cluster, up to
# 2560 keys) against the split grid and the short kernel at 256-3584 keys; the whole GPU suite
# with the kernel tests' loader as the engine's (PDL and clusters on: conftest K); the 48-layer
# engine all resident at positions 1024-1152 and 2048-2176, default against STRATA_GPU_DEC_CL=0.
. bench/h200/lib.sh
O=/tmp/rcout; rm -rf $O && mkdir -p $O
start_model
el "attention arms"
timeout 150 python3 bench/h200/attn_dec_profile.py 256,512,768,1024,1536,2048,2560,3072,3584 0,c,s \
  > $O/attn-arms.txt 2>&1
echo "rc=$?"; grep -E "^ctx|Error|error" $O/attn-arms.txt | cut -c1-150
el "gpu suite"
timeout 290 python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > $O/gpu-suite.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-suite.txt | tail -8
wait_model; el "model ready: $?"
for p in 1024 2048; do
  for arm in cl base cl; do
    if [ $arm = base ]; then export STRATA_GPU_DEC_CL=0; else unset STRATA_GPU_DEC_CL; fi
    el "all-gpu p$p $arm"
    timeout 50 python3 -m strata.bench --arm all-gpu --model $M --vram-budget-widen \
      --vram-budget-mib 40000 -p $p -n 128 -r 3 --json $O/all-gpu-p$p-$arm-$(( $(date +%s) - T0 )).json \
      >> $O/engine-ab.txt 2>&1
    echo "rc=$?"; grep -E "^all-gpu " $O/engine-ab.txt | tail -1
  done
done
unset STRATA_GPU_DEC_CL
cp $O/* $OUT/ 2>/dev/null
el "done"
