#!/usr/bin/env bash
# Session 16, call JA: the whole GPU suite (session 15's final code plus the GEMVs' split PDL
# form); the T = 1 GEMVs, split PDL form against wait-at-entry, in one process; car-on decode
# with each build (STRATA_KERNEL_DEFINES), arms alternating.
. bench/h200/lib.sh
O=/tmp/jaout; rm -rf $O && mkdir -p $O
(setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &)
el "gpu tests (prep in the background)"
timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > $O/gpu-tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-tests.txt | tail -12
el "gemv pdl a/b"
timeout 150 python3 bench/h200/gemv_pdl_ab.py > $O/gemv-pdl-ab.txt 2>&1; echo "rc=$?"
cat $O/gemv-pdl-ab.txt | tail -40
el "waiting for the model and pack"
for _ in $(seq 1 150); do grep -q PREP-DONE /tmp/prep.log && break; sleep 2; done; tail -1 /tmp/prep.log
for arm in split entry entry split; do
  el "car-on $arm"
  d=""; [ $arm = entry ] && d="-DSTRATA_GEMV_PDL_SPLIT=0"
  STRATA_KERNEL_DEFINES="$d" timeout 100 python3 -m strata.bench --arm car-on --model $M \
    --pack /tmp/q30-pack --calibrate -p 512 -n 128 -r 3 --json $O/car-on-$arm-$SECONDS.json \
    > /dev/null 2>&1; echo "rc=$?"
done
python3 - $O <<'PY'
import glob, json, sys
for p in sorted(glob.glob(sys.argv[1] + "/car-on-*.json")):
    r = json.load(open(p))["results"][0]
    print(p.rsplit("/", 1)[1], {k: round(r[k], 4) for k in ("prefill_tps", "decode_tps", "hit_rate")})
PY
tar -cf $OUT/ja.tar -C $O .
el "done"
