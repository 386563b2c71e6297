#!/usr/bin/env bash
# Session 14, call HB: the routed adaptive-cache test (warmed before the copy stream spins) and the
# tier tests; the prefill profile with the host's side (cProfile) after the compiled top-k of
# prompt rows; car-on at 10240 MiB with the engine's default adaptive cache (96 swaps a request).
. bench/h200/lib.sh
O=/tmp/hbout; rm -rf $O && mkdir -p $O
(setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &)
el "gpu tests (prep in the background)"
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_graph.py \
  tests/test_gpu_tier.py > $O/gpu-tests.txt 2>&1
echo "rc=$?"; tail -4 $O/gpu-tests.txt
el "waiting for the model and pack"
for _ in $(seq 1 150); do grep -q PREP-DONE /tmp/prep.log && break; sleep 2; done; tail -1 /tmp/prep.log
el "prefill profile"
timeout 150 python3 bench/h200/prefill_profile.py $M 512 > $O/prefill-profile-t512.txt 2>&1
echo "rc=$?"; head -20 $O/prefill-profile-t512.txt; grep -A40 "host profile" $O/prefill-profile-t512.txt | head -45
for cfg in "adapt96|96"; do
  IFS='|' read -r name swaps <<< "$cfg"
  el "car-on $name"
  timeout 150 python3 -m strata.bench --arm car-on --model $M --pack /tmp/q30-pack --calibrate \
    -p 512 -n 128 -r 3 --adapt-swaps $swaps --json $O/car-on-$name.json > $O/car-on-$name.txt 2>&1
  echo "rc=$?"
  python3 -c "import json; r=json.load(open('$O/car-on-$name.json'))['results'][0]; print({k: r[k] for k in ('decode_tps','hit_rate','adapt_swaps','prefill_tps')})"
done
tar -cf $OUT/hb.tar -C $O .
el "done"
