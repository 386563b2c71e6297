#!/usr/bin/env bash
# Session 11, call EA: the whole GPU suite first (session 10's final GPU code, 2ab9898, ran only its
# Q4_K/Q5_K selection; this tree adds the routed step's overlap), while the Qwen3-30B-A3B-shaped
# IQ3_XXS model and its pack are built; then the hybrid car-on arm at 10240 MiB with B_i queued
# before the host waits for A_i's plan (default) against STRATA_GPU_ROUTED_OVERLAP=0, alternating,
# two processes each; all-gpu last as the card's bound.
. bench/h200/lib.sh
O=/tmp/eaout; rm -rf $O && mkdir -p $O
setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &
el "GPU tests (whole suite)"
timeout 330 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider > $O/gpu-tests.txt 2>&1
echo "rc=$?"; tail -3 $O/gpu-tests.txt
for i in $(seq 1 90); do grep -q -e PREP-DONE -e rror /tmp/prep.log && break; sleep 2; done; tail -1 /tmp/prep.log
for r in 1 2; do
  for ov in 1 0; do
    el "car-on overlap=$ov run $r"
    STRATA_GPU_ROUTED_OVERLAP=$ov timeout 100 python3 -m strata.bench --arm car-on --model $M \
      --pack /tmp/q30-pack --calibrate -p 512 -n 128 -r 2 --json $O/car-on-ov$ov-r$r.json 2>&1 \
      | grep -E "^car-on|rror" | tail -2
  done
done
el "all-gpu"
timeout 80 python3 -m strata.bench --arm all-gpu --model $M --vram-budget-widen --vram-budget-mib 40000 \
  -p 512 -n 128 -r 2 --json $O/all-gpu.json 2>&1 | grep -E "^all-gpu|rror" | tail -2
tar -cf $OUT/ea.tar -C $O .
el "done"
