#!/usr/bin/env bash
# Session 28, call VA: the MoE down prefetch (experts.cu: gate/up blocks ask L2 for their pair's
# down rows) against the build without it (-DSTRATA_MOE_DOWN_PREFETCH=0): the MoE layer at T = 1
# (decode_reg_ab.py, one process, arms interleaved), then the all-resident engine A B B A.
. bench/h200/lib.sh
O=$OUT
start_model
el "decode_reg_ab: default against -DSTRATA_MOE_DOWN_PREFETCH=0"
timeout 200 python3 bench/h200/decode_reg_ab.py IQ3_XXS,Q4_K,Q8_0 -DSTRATA_MOE_DOWN_PREFETCH=0 \
  > $OUT/moe-prefetch-ab.txt 2>&1
echo "rc=$?"; grep -E "copy|moe|Error|error" $OUT/moe-prefetch-ab.txt | tail -12
wait_model || { el "no model"; exit 1; }
run_arm pf-a STRATA_X=0
run_arm nopf-b STRATA_KERNEL_DEFINES=-DSTRATA_MOE_DOWN_PREFETCH=0
run_arm nopf-c STRATA_KERNEL_DEFINES=-DSTRATA_MOE_DOWN_PREFETCH=0
run_arm pf-d STRATA_X=0
el "done"
