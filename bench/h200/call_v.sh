#!/usr/bin/env bash
# Session 5, call V: the whole GPU suite at the final GPU code (PDL, the chunked argmax) while the
# model and pack are built; all-resident decode; the gpu-kernels arm (launch floor, GEMV chains
# with PDL); the hybrid car-on and all-cpu arms at 10240 MiB (their graphs captured with PDL).
. bench/h200/lib.sh
setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &
el "GPU tests"
timeout 200 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tee $OUT/gpu-tests.txt | tail -2
for i in $(seq 1 90); do grep -q -e PREP-DONE -e rror /tmp/prep.log && break; sleep 2; done; tail -1 /tmp/prep.log
el "all-gpu"
timeout 80 python3 -m strata.bench --arm all-gpu --model $M --vram-budget-widen --vram-budget-mib 40000 \
  -p 512 -n 128 -r 3 --json $OUT/all-gpu.json 2>&1 | grep -E "^all-gpu|Error" | tail -2
el "gpu-kernels"
timeout 100 python3 -m strata.bench --arm gpu-kernels --json $OUT/gpu-kernels.json > $OUT/gpu-kernels.txt 2>&1
grep -E "floor|rror|layer" $OUT/gpu-kernels.txt | head -12
el "car-on, all-cpu"
timeout 220 python3 -m strata.bench --arm car-on --arm all-cpu --model $M --pack /tmp/q30-pack \
  --calibrate -p 512 -n 128 -r 2 --json $OUT/arms.json 2>&1 | grep -v "it/s\]$" | tail -4
el "done"
