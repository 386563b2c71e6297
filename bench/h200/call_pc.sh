#!/usr/bin/env bash
# Session 22, call PC: which engine of the adaptive-swap lockstep is not deterministic: per trial
# two graph engines and two eager ones on one prompt (the eager engine's greedy tokens fed to all).
. bench/h200/lib.sh
O=/tmp/pcout; rm -rf $O && mkdir -p $O
el "lockstep repeats"
timeout 420 python3 bench/h200/lockstep_repeat.py 14 > $O/lockstep-repeat.txt 2>&1
echo "rc=$?"; grep -v Warning $O/lockstep-repeat.txt | tail -8
cp $O/* $OUT/ 2>/dev/null
el "done"
