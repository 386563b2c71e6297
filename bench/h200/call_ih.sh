#!/usr/bin/env bash
# Session 15, call IH (the final code): the whole GPU suite.
. bench/h200/lib.sh
O=/tmp/ihout; rm -rf $O && mkdir -p $O
el "gpu tests"
timeout 215 python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > $O/gpu-tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-tests.txt | tail -12
tar -cf $OUT/ih.tar -C $O .
el "done"
