#!/usr/bin/env bash
# Session 24, call RE (the last ~150 s of device time): at the final GPU code (the cluster kernel
# off by default) the engine-level graph tests, then the decode kernels' tests, output straight
# into $OUT so that a cut-off run still returns what finished.
. bench/h200/lib.sh
el "graph tests"
timeout 80 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_graph.py > $OUT/graph-tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/graph-tests.txt | tail -4
el "decode tests"
timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_decode.py -x > $OUT/decode-tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/decode-tests.txt | tail -4
el "done"
