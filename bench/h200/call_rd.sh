#!/usr/bin/env bash
# Session 24, call RD: why the cluster decode kernel, faster alone (RC), slowed the engine: a
# 12-layer, 32-expert Qwen3-30B-A3B-shaped IQ3_XXS model all resident at positions 1024-1152,
# the split grid (STRATA_GPU_DEC_CL=0) against the cluster kernel launched with PDL and without
# (STRATA_GPU_CLUSTER_PDL=0), alternating; the decode tests RC failed (a test's missing reset).
. bench/h200/lib.sh
O=/tmp/rdout; rm -rf $O && mkdir -p $O
M12=/tmp/q30-12.gguf
el "synth"
timeout 120 python3 -m strata synth $M12 --shape qwen3-30b-a3b --quant IQ3_XXS --skew 1 --layers 12 \
  --experts 32 > $O/synth.txt 2>&1; echo "rc=$?"
for r in 1 2; do
  for arm in base cl clnopdl; do
    unset STRATA_GPU_DEC_CL STRATA_GPU_CLUSTER_PDL
    [ $arm = base ] && export STRATA_GPU_DEC_CL=0
    [ $arm = clnopdl ] && export STRATA_GPU_CLUSTER_PDL=0
    el "all-gpu p1024 $arm r$r"
    timeout 40 python3 -m strata.bench --arm all-gpu --model $M12 --vram-budget-widen \
      --vram-budget-mib 40000 -p 1024 -n 128 -r 3 --json $O/all-gpu-$arm-r$r.json >> $O/engine-ab.txt 2>&1
    echo "rc=$?"; grep -E "^all-gpu " $O/engine-ab.txt | tail -1
  done
done
unset STRATA_GPU_DEC_CL STRATA_GPU_CLUSTER_PDL
el "decode tests"
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_decode.py tests/test_gpu_graph.py \
  > $O/tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/tests.txt | tail -6
cp $O/* $OUT/ 2>/dev/null
el "done"
