#!/usr/bin/env bash
# Session 30, call XD (after XC on the warm machine): the MoE decode layer A/B that XC's time
# limit cut (stage_tab's batched loads against one word at a time; IQ1_M's codes in shared
# memory), and gemv1w with IQ1_M's codes shared at 4, 8 and 16 warps a block.
. bench/h200/lib.sh
O=/tmp/xd; rm -rf $O; mkdir -p $O
save() { tar -czf $OUT/xd.tgz -C $O .; }
el "moe layer"
timeout 260 python3 bench/h200/moe_variant_ab.py IQ3_XXS,IQ1_M,Q4_K \
  default,default@-DSTRATA_TAB_BATCH=1,default@-DSTRATA_GRID_SMEM_BYTES=8192 1 > $O/moe-tab-batch.txt 2>&1
echo "rc=$?"; tail -10 $O/moe-tab-batch.txt
save
S="-DSTRATA_GEMV1_SMEM_FMTS=536870912:-DSTRATA_GEMV1_GRID_BYTES=8192"
el "gemv1w IQ1_M warps"
timeout 150 python3 bench/h200/gemv_smem_ab.py IQ1_M,IQ2_S \
  "now=4,now16=16,s4=4@$S,s8=8@$S,s16=16@$S" > $O/gemv-iq1m-warps.txt 2>&1
echo "rc=$?"; tail -11 $O/gemv-iq1m-warps.txt
save
el "done"
