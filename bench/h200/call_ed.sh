#!/usr/bin/env bash
# Session 11, call ED: route_car writes the queued-ahead step's plan record into pinned memory
# itself (no copies in the graph). The whole GPU suite (under a timeout) while the model and pack
# are built; then car-on at 10240 MiB: this tree against the base (7e261e9: the record and ready
# word copied out by two memcpy nodes), alternating, two processes each, and the per-layer arm
# once; all-cpu once more each way.
. bench/h200/lib.sh
O=/tmp/edout; rm -rf $O && mkdir -p $O
BASE=/tmp/wb; rm -rf $BASE && mkdir -p $BASE && tar -xzf .snap/base.tgz -C $BASE && ln -s $PWD/strata/data $BASE/strata/data
setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &
el "GPU tests (whole suite)"
timeout 330 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider > $O/gpu-tests.txt 2>&1
echo "rc=$?"; grep -E "passed|failed|FAIL" $O/gpu-tests.txt | tail -6
for i in $(seq 1 120); do grep -q -e PREP-DONE -e rror /tmp/prep.log && break; sleep 2; done; tail -1 /tmp/prep.log
ARGS="--model $M --pack /tmp/q30-pack --calibrate -p 512 -n 128 -r 2"
for r in 1 2; do
  for side in new base; do
    el "car-on $side run $r"
    if [ $side = base ]; then d=$BASE; else d=$PWD; fi
    (cd $d && PYTHONPATH=/tmp/site:$d timeout 60 python3 -m strata.bench --arm car-on $ARGS \
      --json $O/car-on-$side-r$r.json 2>&1 | grep -E "^car-on|rror" | tail -2)
  done
done
el "car-on per-layer arm"
STRATA_GPU_ROUTED_AHEAD=0 timeout 60 python3 -m strata.bench --arm car-on $ARGS --json $O/car-on-perlayer.json 2>&1 \
  | grep -E "^car-on|rror" | tail -2
for ah in 1 0; do
  el "all-cpu ahead=$ah"
  STRATA_GPU_ROUTED_AHEAD=$ah timeout 80 python3 -m strata.bench --arm all-cpu --model $M \
    --pack /tmp/q30-pack -p 64 -n 64 -r 2 --json $O/all-cpu-ah$ah.json 2>&1 | grep -E "^all-cpu|rror" | tail -2
done
tar -cf $OUT/ed.tar -C $O .
el "done"
