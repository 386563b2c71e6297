#!/usr/bin/env bash
# Session 16, call JG (final code: call JF's minus the moe_down prefetch, reverted to the
# experts.cu that call JA's suite ran): the whole GPU suite.
. bench/h200/lib.sh
O=/tmp/jgout; rm -rf $O && mkdir -p $O
el "gpu tests"
timeout 420 python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > $O/gpu-tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-tests.txt | tail -12
cp $O/gpu-tests.txt $OUT/
el "done"
