#!/usr/bin/env bash
# Session 14, call HF: the suites that run prompts through the grouped expert kernels, at the new
# default chunk of 512 tokens (HE ran the whole suite at 128).
. bench/h200/lib.sh
O=/tmp/hfout; rm -rf $O && mkdir -p $O
timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_tier.py \
  tests/test_prefill_offload.py tests/test_gpu_decode.py tests/test_gpu_grouped.py \
  tests/test_gpu_graph.py > $O/gpu-tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-tests.txt | tail -12
tar -cf $OUT/hf.tar -C $O .
el "done"
