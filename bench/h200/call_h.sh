#!/usr/bin/env bash
# Session 3, call H: every GPU test (int8 KV, sampling on the card, packed routing plan, staged
# prompt experts, decode experts variants), then the decode-experts sweep; the model and its pack
# are written in the background meanwhile for call I.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
el "gpu tests"
timeout 330 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tee $OUT/gpu-tests.txt | tail -40
setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &
el "decode experts sweep"
timeout 230 python3 bench/experts_decode_sweep.py --json $OUT/experts-sweep.json 2>&1 | tee $OUT/experts-sweep.txt | tail -60
cp $OUT/experts-sweep.json /tmp/experts-sweep.json 2>/dev/null  # call I picks its variants from it
el "done"
