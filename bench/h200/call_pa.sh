#!/usr/bin/env bash
# Session 22, call PA (HEAD of session 21 plus nothing on the card side): the whole GPU suite at
# the commit every later figure stands on, then the 48-layer Qwen3-30B-A3B-shaped IQ3_XXS model
# all resident with session 21's short decode attention against the split kernels alone
# (STRATA_GPU_DEC_SHORT=0), A B A, positions 512-640.
. bench/h200/lib.sh
O=/tmp/paout; rm -rf $O && mkdir -p $O
start_model
el "gpu suite"
timeout 340 python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > $O/gpu-suite.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-suite.txt | tail -8
wait_model; el "model ready: $?"
for arm in short off short; do
  if [ $arm = off ]; then export STRATA_GPU_DEC_SHORT=0; else unset STRATA_GPU_DEC_SHORT; fi
  el "all-gpu $arm"
  timeout 100 python3 -m strata.bench --arm all-gpu --model $M --vram-budget-widen \
    --vram-budget-mib 40000 -p 512 -n 128 -r 3 --json $O/all-gpu-$arm-$(( $(date +%s) - T0 )).json \
    >> $O/engine-ab.txt 2>&1
  echo "rc=$?"; tail -3 $O/engine-ab.txt
done
unset STRATA_GPU_DEC_SHORT
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $O/gpu-info.txt 2>&1
lscpu > $O/host-lscpu.txt 2>&1
cp $O/* $OUT/ 2>/dev/null
el "done"
