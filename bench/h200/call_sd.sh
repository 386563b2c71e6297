#!/usr/bin/env bash
# Session 25, call SD: the whole GPU suite at this commit, alone on the machine (SA's run beside
# the model's synthesis passed 280 s and was cut off); the outputs as one tarball.
. bench/h200/lib.sh
O=/tmp/sdout; rm -rf $O && mkdir -p $O
el "gpu suite"
timeout 560 python3 -m pytest -m gpu -q -p no:cacheprovider --durations=15 tests/ > $O/gpu-suite.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-suite.txt | tail -12
tar czf $OUT/sd.tgz -C $O .
el "done"
