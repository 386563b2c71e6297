#!/usr/bin/env bash
# Session 13, call GA: the whole GPU suite (the engine's queued step now served by
# strata/cpu/serve.py) while the model and pack are built; then the step server against the
# Python round a layer in one process (bench/serve_ab.py): every expert in the pool (all-cpu),
# and a 6144 MiB budget with CAR on (a model larger than its budget).
. bench/h200/lib.sh
O=/tmp/gaout; rm -rf $O && mkdir -p $O
setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &
el "GPU tests (whole suite)"
timeout 300 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider > $O/gpu-tests.txt 2>&1
echo "rc=$?"; grep -E "passed|failed|FAIL|Error" $O/gpu-tests.txt | tail -8
el "CPU serve + team tests"
timeout 200 python3 -m pytest -q tests/test_cpu_serve.py tests/test_cpu_team.py -p no:cacheprovider > $O/cpu-tests.txt 2>&1
echo "rc=$?"; tail -2 $O/cpu-tests.txt
for i in $(seq 1 120); do grep -q -e PREP-DONE -e rror /tmp/prep.log && break; sleep 2; done; tail -1 /tmp/prep.log
el "serve A/B all-cpu"
timeout 150 python3 bench/serve_ab.py --model $M --pack /tmp/q30-pack --expert-cache 0 \
  --blocks 8 --steps 32 > $O/serve-ab-all-cpu.json 2> $O/serve-ab-all-cpu.err; echo "rc=$?"
cat $O/serve-ab-all-cpu.json; tail -3 $O/serve-ab-all-cpu.err
el "serve A/B 6144 MiB car-on"
timeout 150 python3 bench/serve_ab.py --model $M --pack /tmp/q30-pack --expert-cache auto \
  --vram-budget-mib 6144 --car-threshold 0.35 --blocks 8 --steps 32 > $O/serve-ab-6144.json 2> $O/serve-ab-6144.err
echo "rc=$?"; cat $O/serve-ab-6144.json; tail -3 $O/serve-ab-6144.err
tar -cf $OUT/ga.tar -C $O .
el "done"
