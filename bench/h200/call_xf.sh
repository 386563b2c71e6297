#!/usr/bin/env bash
# Session 30, call XF: the new defaults (IQ1_M's codes in shared memory for gemv1w with 16 warps
# a block and for the MoE kernels; stage_tab's loads 4 words at a time) on the card: the GEMV /
# MoE / decode tests, then the GEMVs against the old defaults interleaved in one process (the MoE
# layer's A/B is call XE's; cut to fit the device time left), and IQ2_S's 4 KiB of codes in
# shared memory (two copies) at 16 warps a block.
. bench/h200/lib.sh
O=/tmp/xf; rm -rf $O; mkdir -p $O
save() { tar -czf $OUT/xf.tgz -C $O .; }
OLD="-DSTRATA_GEMV1_SMEM_FMTS=0:-DSTRATA_TAB_BATCH=1:-DSTRATA_GRID_SMEM_BYTES=4096"
el "tests"
timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_kernels.py \
  tests/test_gpu_decode.py -k "staged_and_plain or moe_decode_variants or test_gemv or gemv1w_warps" \
  > $O/tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/tests.txt | tail -6
save
el "gemv1w: IQ1_M's new default (16 warps, shared codes) against the old (4 warps, L1); IQ2_S's codes shared"
S2="-DSTRATA_GRID_CODES=541065216:-DSTRATA_GEMV1_SMEM_FMTS=541065216"
timeout 110 python3 bench/h200/gemv_smem_ab.py IQ1_M,IQ2_S "old=4@$OLD,new=16,iq2s=16@$S2" \
  > $O/gemv.txt 2>&1
echo "rc=$?"; tail -11 $O/gemv.txt
save
el "done"
