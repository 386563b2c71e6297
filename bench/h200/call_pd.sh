#!/usr/bin/env bash
# Session 22, call PD (the eager decode's attention pick): the whole GPU suite, the lockstep
# repeats (graph against eager should now agree in every arm), then the 48-layer model hybrid at
# the default 10240 MiB budget (car-on, no pack: the GGUF's bytes for the pool).
. bench/h200/lib.sh
O=/tmp/pdout; rm -rf $O && mkdir -p $O
start_model
el "gpu suite"
timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > $O/gpu-suite.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-suite.txt | tail -8
el "lockstep repeats"
timeout 150 python3 bench/h200/lockstep_repeat.py 14 > $O/lockstep-repeat.txt 2>&1
echo "rc=$?"; grep -v Warning $O/lockstep-repeat.txt | tail -4
wait_model; el "model ready: $?"
timeout 130 python3 -m strata.bench --arm car-on --model $M --vram-budget-mib 10240 -p 512 -n 128 \
  -r 3 --json $O/car-on.json > $O/car-on.txt 2>&1
echo "rc=$?"; tail -6 $O/car-on.txt
cp $O/* $OUT/ 2>/dev/null
el "done"
