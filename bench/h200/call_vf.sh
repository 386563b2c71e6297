#!/usr/bin/env bash
# Session 28, call VF (prepared; no machine was lent after VD): moe_gate_up_gs (gate and up of a
# row on two warps: 44 registers against moe_gate_up's 64 for IQ3_XXS, local ptxas) — the MoE
# kernel tests (bits against legacy), every format's decode layer on the default pair against
# gs+sp2 / gs+legacy (moe_variant_ab.py), then the all-resident engine A B B A.
. bench/h200/lib.sh
O=/tmp/vf; rm -rf $O; mkdir -p $O
start_model
el "moe kernel tests"
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_kernels.py -k "moe" \
  > $O/moe-tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/moe-tests.txt | tail -6
el "moe_variant_ab, every format"
timeout 150 python3 bench/h200/moe_variant_ab.py Q5_K,Q6_K,IQ4_XS,IQ3_S,IQ2_XXS,IQ2_S,IQ3_XXS,Q4_K,IQ1_M,Q8_0 \
  default,gs+sp2,gs+legacy 1 > $O/moe-variant-ab.txt 2>&1
echo "rc=$?"; tail -31 $O/moe-variant-ab.txt
tar -czf $OUT/vf.tgz -C $O .
wait_model || { el "no model"; exit 1; }
run_arm default-a STRATA_X=0
run_arm gs-b STRATA_MOE_VARIANT=gs+sp2
run_arm gs-c STRATA_MOE_VARIANT=gs+sp2
run_arm default-d STRATA_X=0
tar -czf $OUT/vf.tgz -C $O .
el "done"
