#!/usr/bin/env bash
# Session 19, call MA: the i-quant grids as selector codes in lane-banked shared-memory copies
# (quant_blocks.cuh STRATA_GRID_CODES, GridTab): the kernel tests that touch the decode (GEMV,
# MoE, prompt GEMM, embed; the grouped tiles), then the T = 1 GEMVs, MoE layer and prompt GEMM
# against the grids' bytes (-DSTRATA_GRID_CODES=0) at the default decode budget (4096 bytes of
# copies a block) and at 16384 (bench/h200/decode_reg_ab.py). Model and pack prepared meanwhile.
. bench/h200/lib.sh
O=/tmp/maout; rm -rf $O && mkdir -p $O
(setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &)
el "kernel tests"
timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_kernels.py \
  tests/test_gpu_grouped.py -k "gemv or moe or gemm_mma or embed or grouped or tiles" \
  > $O/gpu-kernel-tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-kernel-tests.txt | tail -12
Q=IQ3_XXS,IQ1_M,IQ2_XXS,IQ3_S,IQ2_S,Q4_K
el "decode A/B codes (4096) vs bytes"
timeout 150 python3 bench/h200/decode_reg_ab.py $Q -DSTRATA_GRID_CODES=0 > $O/decode-codes-ab.txt 2>&1
echo "rc=$?"; tail -24 $O/decode-codes-ab.txt
el "decode A/B codes (16384) vs bytes"
STRATA_KERNEL_DEFINES=-DSTRATA_GRID_SMEM_BYTES=16384 timeout 150 python3 bench/h200/decode_reg_ab.py \
  $Q -DSTRATA_GRID_CODES=0 > $O/decode-codes16k-ab.txt 2>&1
echo "rc=$?"; tail -24 $O/decode-codes16k-ab.txt
cp $O/*.txt $OUT/
el "done $(tail -1 /tmp/prep.log)"
