#!/usr/bin/env bash
# Session 25, call SA: the whole GPU suite at this commit (the cluster kernel off by default, the
# merged determinism test, neither yet run whole on the card); the engine's baseline at positions
# 4096-4224; the CPU kernels' one-core ceilings with the f16 scale conversion by inline asm
# (STRATA_CPU_F16_ASM=1, the default) against LLVM's lowering (=0) on the 16-core guest, each arm
# with its own Numba cache, alternating.
. bench/h200/lib.sh
O=/tmp/saout; rm -rf $O && mkdir -p $O
start_model
el "gpu suite"
timeout 280 python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > $O/gpu-suite.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-suite.txt | tail -8
wait_model; el "model ready: $?"
el "all-gpu baseline p4096"
timeout 70 python3 -m strata.bench --arm all-gpu --model $M --vram-budget-widen \
  --vram-budget-mib 40000 -p 4096 -n 128 -r 3 --json $O/all-gpu-base.json > $O/engine.txt 2>&1
echo "rc=$?"; grep -E "^all-gpu " $O/engine.txt | tail -1
Q=Q4_K,Q5_K,Q6_K,IQ4_XS,Q8_0,IQ2_S,IQ2_XXS,IQ3_S,IQ3_XXS,IQ1_M
for r in 1 2; do
  for a in 1 0; do
    el "ceilings f16asm=$a r$r"
    STRATA_CPU_F16_ASM=$a NUMBA_CACHE_DIR=/tmp/nc$a timeout 110 python3 bench/cpu_pool_sweep.py \
      --quant $Q --ceiling-only --out $O/ceil-asm$a-r$r > $O/ceil-asm$a-r$r.txt 2>&1
    echo "rc=$?"
  done
done
cp -r $O/* $OUT/ 2>/dev/null
el "done"
