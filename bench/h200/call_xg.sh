#!/usr/bin/env bash
# Session 31, call XG: IQ2_S's 4 KiB of grid codes (STRATA_GRID_CODES bit 22) before making them a
# default: call XF took its decode GEMVs to 72-110% of a same-size copy with them in shared
# memory at 16 warps. The same defines reach every kernel that decodes IQ2_S, so: the MoE decode
# layer, the GEMVs with lm_head (one copy against two), and the prompt GEMM (dense_mma).
. bench/h200/lib.sh
O=/tmp/xg; rm -rf $O; mkdir -p $O
save() { tar -czf $OUT/xg.tgz -C $O .; }
C="-DSTRATA_GRID_CODES=541065216"
S="$C:-DSTRATA_GEMV1_SMEM_FMTS=541065216"
el "moe layer IQ2_S: grid bytes (default) against codes, 2 copies (8192) and 1 copy (4096)"
timeout 200 python3 bench/h200/moe_variant_ab.py IQ2_S \
  "default,default@$C,default@$C:-DSTRATA_GRID_SMEM_BYTES=4096" 2 > $O/moe.txt 2>&1
echo "rc=$?"; tail -4 $O/moe.txt
save
el "gemv1w IQ2_S with lm_head"
AB_LM_HEAD=1 timeout 150 python3 bench/h200/gemv_smem_ab.py IQ2_S \
  "l1x4=4,l1x16=16,codes2=16@$S,codes1=16@$S:-DSTRATA_GEMV1_GRID_BYTES=4096" > $O/gemv.txt 2>&1
echo "rc=$?"; tail -7 $O/gemv.txt
save
el "prompt GEMM IQ2_S"
timeout 100 python3 bench/h200/mma_xstage_ab.py IQ2_S attn_q,attn_o,expert_gate "${C//:/ }" \
  > $O/mma.txt 2>&1
echo "rc=$?"; tail -5 $O/mma.txt
save
el "done"
