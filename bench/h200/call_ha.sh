#!/usr/bin/env bash
# Session 14, call HA: the whole GPU suite (the adaptive cache on the card-routed step is new),
# then car-on at 10240 MiB three ways: a static cache (--adapt-swaps 0, what the side-by-side
# runs), the adaptive cache on the card-routed step (new default), and the host-routed hybrid
# step it replaces (STRATA_ADAPT_ROUTED=0).
. bench/h200/lib.sh
O=/tmp/haout; rm -rf $O && mkdir -p $O
(setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &)
el "gpu tests (prep in the background)"
timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > $O/gpu-tests.txt 2>&1
echo "rc=$?"; tail -6 $O/gpu-tests.txt
el "waiting for the model and pack"
for _ in $(seq 1 150); do grep -q PREP-DONE /tmp/prep.log && break; sleep 2; done; tail -1 /tmp/prep.log
for cfg in "static|0|1" "routed|768|1" "hybrid|768|0" "routed-b|768|1" "static-b|0|1"; do
  IFS='|' read -r name swaps routed <<< "$cfg"
  el "car-on $name (adapt-swaps $swaps, STRATA_ADAPT_ROUTED=$routed)"
  STRATA_ADAPT_ROUTED=$routed timeout 150 python3 -m strata.bench --arm car-on --model $M \
    --pack /tmp/q30-pack --calibrate -p 512 -n 128 -r 3 --adapt-swaps $swaps \
    --json $O/car-on-$name.json > $O/car-on-$name.txt 2>&1; echo "rc=$?"
  python3 - "$O/car-on-$name.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["results"][0]
print({k: r[k] for k in ("decode_tps", "decode_tps_min", "decode_tps_max", "hit_rate",
      "car_substitution_rate", "adapt_swaps", "expert_bytes_uploaded", "prefill_tps")})
PY
done
tar -cf $OUT/ha.tar -C $O .
el "done"
