#!/usr/bin/env bash
# Session 13, call GG: where a 512-token prefill's device time goes, all experts resident
# (bench/h200/prefill_profile.py), on a fresh machine (the model synthesized first).
. bench/h200/lib.sh
O=/tmp/ggout; rm -rf $O && mkdir -p $O
el "model"
start_model; wait_model || { echo "no model"; exit 1; }
el "prefill profile T=512"
timeout 240 python3 bench/h200/prefill_profile.py $M 512 > $O/prefill-profile-t512.txt 2> $O/prefill-profile.err
echo "rc=$?"; cat $O/prefill-profile-t512.txt; tail -3 $O/prefill-profile.err
cp $O/* $OUT/
el "done"
