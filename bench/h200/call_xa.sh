#!/usr/bin/env bash
# Session 30, call XA: (1) the GEMV and MoE kernel tests with the staged-table changes (gemv1w's
# table after its L2 prefetch, STRATA_GEMV1_SMEM_FMTS; stage_tab's batched loads,
# STRATA_TAB_BATCH); (2) gemv1w with IQ1_M's codes in shared memory against L1 (gemv_smem_ab.py);
# (3) the MoE decode layer with stage_tab's batched loads against one word at a time, and with
# IQ1_M's codes in shared memory (one or two copies, now that they are loaded batched). The CPU
# side is call XB.
. bench/h200/lib.sh
O=/tmp/xa; rm -rf $O; mkdir -p $O
save() { tar -czf $OUT/xa.tgz -C $O .; }
el "topology"
{ lscpu; echo; nvidia-smi -L; grep -m1 -E "^flags" /proc/cpuinfo; } > $O/topology.txt 2>&1
grep -E "Model name|^CPU\(s\)|GPU" $O/topology.txt
el "gemv / moe kernel tests"
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_kernels.py \
  -k "staged_and_plain or moe_decode_variants or test_gemv" > $O/kernel-tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/kernel-tests.txt | tail -6
save
el "gemv_smem_ab"
timeout 120 python3 bench/h200/gemv_smem_ab.py IQ1_M,IQ2_S,IQ3_XXS,Q4_K \
  "now=4,now16=16,iq1m16=16@-DSTRATA_GEMV1_SMEM_FMTS=536870912:-DSTRATA_GEMV1_GRID_BYTES=8192,all16=16@-DSTRATA_GEMV1_SMEM_FMTS=18446744073709551615:-DSTRATA_GEMV1_GRID_BYTES=8192" \
  > $O/gemv-smem-ab.txt 2>&1
echo "rc=$?"; tail -22 $O/gemv-smem-ab.txt
save
el "moe layer: stage_tab batched (default) against one word at a time; IQ1_M's codes shared"
timeout 100 python3 bench/h200/moe_variant_ab.py IQ3_XXS,IQ1_M,Q4_K \
  default,default@-DSTRATA_TAB_BATCH=1,default@-DSTRATA_GRID_SMEM_BYTES=8192,default@-DSTRATA_GRID_SMEM_BYTES=16384 \
  1 > $O/moe-tab-batch.txt 2>&1
echo "rc=$?"; tail -13 $O/moe-tab-batch.txt
save
el "done"
