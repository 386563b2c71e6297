#!/usr/bin/env bash
# Session 28, call VD: every format's decode layer on the old default pair against st1+sp2 and
# legacy+sp2 (moe_variant_ab.py), the all-resident engine on the old pair and both new ones
# (A B C C B A), then the whole GPU suite at this commit (the new defaults).
. bench/h200/lib.sh
O=/tmp/vd; rm -rf $O; mkdir -p $O
start_model
el "moe_variant_ab, every format"
timeout 150 python3 bench/h200/moe_variant_ab.py Q5_K,Q6_K,IQ4_XS,IQ3_S,IQ2_XXS,IQ2_S,IQ3_XXS,Q4_K,IQ1_M,Q8_0 \
  st1+legacy,st1+sp2,legacy+sp2,legacy+legacy 1 > $O/moe-variant-ab.txt 2>&1
echo "rc=$?"; tail -41 $O/moe-variant-ab.txt
wait_model || { el "no model"; tar -czf $OUT/vd.tgz -C $O .; exit 1; }
run_arm old-a STRATA_MOE_VARIANT=st1+legacy
run_arm st1sp2-b STRATA_X=0
run_arm legsp2-c STRATA_MOE_VARIANT=legacy+sp2
run_arm legsp2-d STRATA_MOE_VARIANT=legacy+sp2
run_arm st1sp2-e STRATA_X=0
run_arm old-f STRATA_MOE_VARIANT=st1+legacy
tar -czf $OUT/vd.tgz -C $O .
el "gpu suite"
timeout 320 python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > $O/gpu-suite.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-suite.txt | tail -8
tar -czf $OUT/vd.tgz -C $O .
el "done"
