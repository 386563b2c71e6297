#!/usr/bin/env bash
# Session 31, call XH: the defaults after call XG (IQ2_S's codes, one shared copy a block:
# STRATA_GRID_COPIES 1): the GEMV / MoE / prompt / grid-code tests, IQ2_S and IQ1_M's MoE layer
# and IQ2_S's GEMVs against the grid bytes (session 30's defaults), then the gpu-kernels arm.
. bench/h200/lib.sh
O=/tmp/xh; rm -rf $O; mkdir -p $O
save() { tar -czf $OUT/xh.tgz -C $O .; }
B="-DSTRATA_GRID_CODES=536870912:-DSTRATA_GEMV1_SMEM_FMTS=536870912"
el "tests"
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_kernels.py \
  tests/test_gpu_decode.py tests/test_gpu_grid_codes.py \
  -k "staged_and_plain or moe_decode_variants or test_gemv or gemv1w_warps or mma or codes" \
  > $O/tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/tests.txt | tail -6
save
el "moe layer: bytes (session 30) against the default"
timeout 150 python3 bench/h200/moe_variant_ab.py IQ2_S,IQ1_M "default@$B,default" 2 > $O/moe.txt 2>&1
echo "rc=$?"; tail -5 $O/moe.txt
save
el "gemv1w IQ2_S with lm_head"
AB_LM_HEAD=1 timeout 100 python3 bench/h200/gemv_smem_ab.py IQ2_S "old=4@$B,new=16" > $O/gemv.txt 2>&1
echo "rc=$?"; tail -7 $O/gemv.txt
save
el "gpu-kernels arm"
timeout 150 python3 -m strata.bench --arm gpu-kernels --json $O/gpu-kernels.json > $O/gpu-kernels.txt 2>&1
echo "rc=$?"; tail -4 $O/gpu-kernels.txt
save
el "done"
