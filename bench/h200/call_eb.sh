#!/usr/bin/env bash
# Session 11, call EB: the queued-ahead routed step (ec4ef13 + its first-step rule): its GPU tests
# (pool_join, the graph steps, the decode tests) under a timeout (a join that never sees its
# release would hang); car-on and all-cpu arms at 10240 MiB, queued ahead (default) against
# STRATA_GPU_ROUTED_AHEAD=0, alternating; then the issue-#3 command for three formats against the
# new host-read reference (plain and 4 KiB-prefetching sums, the faster one).
. bench/h200/lib.sh
O=/tmp/ebout; rm -rf $O && mkdir -p $O
setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &
el "GPU tests: pool_join, graph steps, decode"
timeout 240 python3 -m pytest -q -m gpu tests/test_gpu_pool_join.py tests/test_gpu_graph.py \
  tests/test_gpu_decode.py -p no:cacheprovider > $O/gpu-tests.txt 2>&1
echo "rc=$?"; grep -E "passed|failed|FAIL|Error" $O/gpu-tests.txt | tail -6
for i in $(seq 1 120); do grep -q -e PREP-DONE -e rror /tmp/prep.log && break; sleep 2; done; tail -1 /tmp/prep.log
for r in 1 2; do
  for ah in 1 0; do
    el "car-on ahead=$ah run $r"
    STRATA_GPU_ROUTED_AHEAD=$ah timeout 100 python3 -m strata.bench --arm car-on --model $M \
      --pack /tmp/q30-pack --calibrate -p 512 -n 128 -r 2 --json $O/car-on-ah$ah-r$r.json 2>&1 \
      | grep -E "^car-on|rror" | tail -2
  done
done
for ah in 1 0; do
  el "all-cpu ahead=$ah"
  STRATA_GPU_ROUTED_AHEAD=$ah timeout 100 python3 -m strata.bench --arm all-cpu --model $M \
    --pack /tmp/q30-pack -p 64 -n 64 -r 2 --json $O/all-cpu-ah$ah.json 2>&1 | grep -E "^all-cpu|rror" | tail -2
done
for q in IQ3_XXS IQ1_M Q4_K; do
  el "issue command $q T=1"
  timeout 150 python3 -m strata.bench --arm cpu-pool --shape qwen3-30b-a3b --quant $q -t 1 \
    --json $O/cpu-pool-arm-$q-t1.json 2>&1 | tail -2 | head -1
done
tar -cf $OUT/eb.tar -C $O .
el "done"
