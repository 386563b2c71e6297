#!/usr/bin/env bash
# Session 20, call NE (the last of the session's device time): decode attention grids fitted to
# the position (attention.dec_grid_for: the graph decoder captures a graph per grid, 8 / 32 /
# 132 splits): their tests (same bits as the full grid; the graph decode tests), then a
# 12-layer all-resident engine, grids on against STRATA_GPU_DEC_GRIDS=0. Outputs go straight to
# $OUT (the call may be cut short by the budget).
. bench/h200/lib.sh
M12=/tmp/q12.gguf
(setsid nohup python3 -m strata synth $M12 --shape qwen3-30b-a3b --quant IQ3_XXS --skew 1 \
  --layers 12 > /tmp/synth12.log 2>&1 < /dev/null &)
el "tests"
timeout 45 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_decode.py \
  tests/test_gpu_graph.py -k "smaller_grids or attention_decode or all_resident" > $OUT/tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/tests.txt | tail -6
for _ in $(seq 1 30); do [ -f $M12 ] && ! pgrep -f "strata synth" > /dev/null && break; sleep 2; done
el "model: $(ls -la $M12 2>&1 | tail -1)"
for arm in on off; do
  el "all-gpu grids $arm"
  if [ $arm = off ]; then export STRATA_GPU_DEC_GRIDS=0; fi
  timeout 50 python3 -m strata.bench --arm all-gpu --model $M12 --vram-budget-widen \
    --vram-budget-mib 40000 -p 512 -n 64 -r 3 --json $OUT/all-gpu-$arm.json > $OUT/all-gpu-$arm.txt 2>&1
  echo "rc=$?"; grep -E "^all-gpu" $OUT/all-gpu-$arm.txt
done
el "done"
