#!/usr/bin/env bash
# Session 28, call VC: the down kernel sp2 against the default in the gpu-kernels decode layer
# (moe_variant_ab.py, interleaved), then the all-resident engine A B B A (STRATA_MOE_VARIANT).
. bench/h200/lib.sh
O=/tmp/vc; rm -rf $O; mkdir -p $O
start_model
el "moe_variant_ab"
timeout 200 python3 bench/h200/moe_variant_ab.py IQ3_XXS,Q4_K,IQ1_M,Q8_0 default,st1+sp2,legacy+sp2 2 \
  > $O/moe-variant-ab.txt 2>&1
echo "rc=$?"; cat $O/moe-variant-ab.txt | tail -16
wait_model || { el "no model"; tar -czf $OUT/vc.tgz -C $O .; exit 1; }
run_arm default-a STRATA_X=0
run_arm sp2-b STRATA_MOE_VARIANT=st1+sp2
run_arm sp2-c STRATA_MOE_VARIANT=st1+sp2
run_arm default-d STRATA_X=0
run_arm sp2-e STRATA_MOE_VARIANT=st1+sp2
run_arm default-f STRATA_X=0
tar -czf $OUT/vc.tgz -C $O .
el "done"
