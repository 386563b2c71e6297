#!/usr/bin/env bash
# Session 28, call VF: the MoE kernels' register bound (-DSTRATA_MOE_MINB=N) against the default
# build in the decode layer (moe_variant_ab.py arms), then the GPU test files VD's suite run did
# not reach (test_gpu_knob_order, test_gpu_kv_int8 and test_gpu_[l-z]*).
. bench/h200/lib.sh
O=/tmp/vf; rm -rf $O; mkdir -p $O
el "moe_variant_ab, MINB arms"
timeout 100 python3 bench/h200/moe_variant_ab.py IQ3_XXS,Q4_K,Q8_0 \
  default,default@-DSTRATA_MOE_MINB=8,default@-DSTRATA_MOE_MINB=12,default@-DSTRATA_MOE_MINB=16 1 \
  > $O/moe-minb-ab.txt 2>&1
echo "rc=$?"; tail -13 $O/moe-minb-ab.txt
tar -czf $OUT/vf.tgz -C $O .
el "gpu tests: knob_order, kv_int8, [l-z]*"
timeout 170 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_knob_order.py tests/test_gpu_kv_int8.py tests/test_gpu_[l-z]*.py \
  > $O/gpu-tests-tail.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-tests-tail.txt | tail -6
tar -czf $OUT/vf.tgz -C $O .
el "done"
