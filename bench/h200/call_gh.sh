#!/usr/bin/env bash
# Session 13, call GH: the prefill GEMV's token passes over grid y (gemv.py token_groups): the
# whole GPU suite (the model synthesized meanwhile), then call GG's prefill profile again.
. bench/h200/lib.sh
O=/tmp/ghout; rm -rf $O && mkdir -p $O
start_model
el "GPU tests (whole suite)"
timeout 320 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider > $O/gpu-tests.txt 2>&1
echo "rc=$?"; grep -E "passed|failed|FAIL|Error" $O/gpu-tests.txt | tail -8
wait_model || { echo "no model"; exit 1; }
el "prefill profile T=512"
timeout 200 python3 bench/h200/prefill_profile.py $M 512 > $O/prefill-profile-t512.txt 2> $O/prefill-profile.err
echo "rc=$?"; head -14 $O/prefill-profile-t512.txt; tail -2 $O/prefill-profile.err
cp $O/* $OUT/
el "done"
