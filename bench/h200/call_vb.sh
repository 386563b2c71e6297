#!/usr/bin/env bash
# Session 28, call VB: moe_down_sp<W> (W warps a row, the same bits as moe_down): the MoE kernel
# tests (bit equality with legacy, the reference), the decode sweep's MoE pairs, then the
# all-resident engine with each down variant (STRATA_MOE_VARIANT), the default first and last.
. bench/h200/lib.sh
O=$OUT
start_model
el "moe kernel tests"
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_kernels.py -k "moe" \
  > $OUT/moe-tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/moe-tests.txt | tail -6
el "decode sweep, MoE pairs"
timeout 200 python3 bench/experts_decode_sweep.py --no-gemv --builds fast+smem \
  --quants IQ3_XXS,Q4_K,Q8_0,IQ1_M \
  --moe-variants st1+legacy,st1+sp2,st1+sp3,st1+sp6,legacy+legacy,legacy+sp3 \
  --json $OUT/sweep.json > $OUT/sweep.txt 2>&1
echo "rc=$?"; tail -40 $OUT/sweep.txt
wait_model || { el "no model"; exit 1; }
run_arm default-a STRATA_X=0
run_arm sp2 STRATA_MOE_VARIANT=st1+sp2
run_arm sp3 STRATA_MOE_VARIANT=st1+sp3
run_arm sp6 STRATA_MOE_VARIANT=st1+sp6
run_arm default-b STRATA_X=0
el "done"
