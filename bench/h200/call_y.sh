#!/usr/bin/env bash
# Session 6, call Y: the register-bounded gate/up kernel (moe_gate_up_lb: 40 registers, one wave
# of a decode layer's 1536 blocks instead of two) against the default, its tests, then ncu's
# stall and occupancy sections for one decode layer's kernels (where their time goes).
. bench/h200/lib.sh
start_model
el "GPU tests: MoE decode variants (lb included)"
timeout 150 python3 -m pytest -q -m gpu tests/test_gpu_kernels.py -k "moe or variant" -p no:cacheprovider 2>&1 \
  | tee $OUT/gpu-tests-moe.txt | tail -1
wait_model || { el "model not ready"; exit 1; }
for v in legacy lb legacy lb; do
  el "all-gpu gate/up $v"
  STRATA_MOE_VARIANT=$v+legacy timeout 75 python3 -m strata.bench --arm all-gpu --model $M --vram-budget-widen \
    --vram-budget-mib 40000 -p 512 -n 128 -r 3 --json $OUT/all-gpu-$v.json 2>&1 | grep -E "^all-gpu|Error" | tail -1
done
SEC="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis"
el "ncu sections, one decode layer"
timeout 150 ncu --clock-control none --profile-from-start off $SEC \
  --kernel-name "regex:^(gemv1w|gemv1f|moe_|attn_dec|norm_quant|router_topk|qk_norm)" --launch-count 13 \
  --log-file $OUT/ncu-sections-layer.txt python3 scripts/profile_decode.py run --model $M --tokens 1 2>&1 | tail -2
el "ncu sections, lb gate/up"
STRATA_MOE_VARIANT=lb+legacy timeout 100 ncu --clock-control none --profile-from-start off $SEC \
  --kernel-name "regex:^moe_gate_up" --launch-count 1 \
  --log-file $OUT/ncu-sections-lb.txt python3 scripts/profile_decode.py run --model $M --tokens 1 2>&1 | tail -2
el "done"
