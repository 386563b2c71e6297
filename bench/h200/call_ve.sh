#!/usr/bin/env bash
# Session 28, call VE: the whole GPU suite at this commit in two processes on the one card (VD's
# single run passed its first ~80% in the 320 s it had): test_gpu_[a-j]* beside test_gpu_[k-z]*.
. bench/h200/lib.sh
O=/tmp/ve; rm -rf $O; mkdir -p $O
el "gpu suite, two halves at once"
A=$(ls tests/test_gpu_[a-j]*.py); B=$(ls tests/test_gpu_[k-z]*.py)
timeout 250 python3 -m pytest -m gpu -q -p no:cacheprovider $A > $O/gpu-suite-a.txt 2>&1 &
timeout 250 python3 -m pytest -m gpu -q -p no:cacheprovider $B > $O/gpu-suite-b.txt 2>&1 &
wait
for h in a b; do echo "half $h:"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-suite-$h.txt | tail -6; done
tar -czf $OUT/ve.tgz -C $O .
el "done"
