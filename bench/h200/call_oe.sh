#!/usr/bin/env bash
# Session 21, call OE (the last device time): the final defaults (STRATA_DS_U 4,
# STRATA_GPU_DEC_SHORT 768): the attention, int8-cache, graph-decoder and tier test files.
. bench/h200/lib.sh
el "tests"
timeout 270 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_decode.py \
  tests/test_gpu_kv_int8.py tests/test_gpu_graph.py tests/test_gpu_tier.py > $OUT/tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/tests.txt | tail -8
el "done"
