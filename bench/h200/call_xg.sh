#!/usr/bin/env bash
# Session 31, call XG: IQ2_S's 4 KiB of grid codes (STRATA_GRID_CODES bit 22), staged in shared
# memory by gemv1w at 16 warps (call XF: its decode GEMVs at 72-110% of a same-size copy), built
# as the default in the tree it runs. The same defines reach every kernel that decodes IQ2_S, so
# against its grid bytes (session 30's defaults, `bytes`): the MoE decode layer (two copies of
# the codes in 8192 bytes, one in 4096), the GEMVs with lm_head, the prompt GEMM (dense_mma);
# then the whole GPU suite at the new defaults.
. bench/h200/lib.sh
O=/tmp/xg; rm -rf $O; mkdir -p $O
save() { tar -czf $OUT/xg.tgz -C $O .; }
B="-DSTRATA_GRID_CODES=536870912:-DSTRATA_GEMV1_SMEM_FMTS=536870912"
el "moe layer IQ2_S: grid bytes against codes, 2 copies (8192, the default) and 1 copy (4096)"
timeout 200 python3 bench/h200/moe_variant_ab.py IQ2_S \
  "default@$B,default,default@-DSTRATA_GRID_SMEM_BYTES=4096" 2 > $O/moe.txt 2>&1
echo "rc=$?"; tail -4 $O/moe.txt
save
el "gemv1w IQ2_S with lm_head"
AB_LM_HEAD=1 timeout 150 python3 bench/h200/gemv_smem_ab.py IQ2_S \
  "bytes=4@$B,bytes16=16@$B,codes2=16,codes1=16@-DSTRATA_GEMV1_GRID_BYTES=4096" > $O/gemv.txt 2>&1
echo "rc=$?"; tail -7 $O/gemv.txt
save
el "prompt GEMM IQ2_S: codes (alt) against bytes (now)"
# mma_xstage_ab's "now" is the tree's default build: here codes; "alt" the bytes
timeout 100 python3 bench/h200/mma_xstage_ab.py IQ2_S attn_q,attn_o,expert_gate "${B//:/ }" \
  > $O/mma.txt 2>&1
echo "rc=$?"; tail -5 $O/mma.txt
save
el "gpu suite"
timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > $O/suite.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/suite.txt | tail -8
save
el "done"
