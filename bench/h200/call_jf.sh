#!/usr/bin/env bash
# Session 16, call JF (final code): the whole GPU suite; all-resident decode (40000 MiB) with
# moe_down's pre-wait prefetch and without (-DSTRATA_MOE_DOWN_PREFETCH=0), A B B A; car-on at
# 10240 MiB; the gpu-kernels arm for the record.
. bench/h200/lib.sh
O=/tmp/jfout; rm -rf $O && mkdir -p $O
(setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &)
el "gpu tests (prep in the background)"
timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > $O/gpu-tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-tests.txt | tail -12
el "waiting for the model and pack"
for _ in $(seq 1 150); do grep -q PREP-DONE /tmp/prep.log && break; sleep 2; done; tail -1 /tmp/prep.log
for a in now nopf nopf now; do
  el "all-gpu $a"
  d=""; [ $a = nopf ] && d="-DSTRATA_MOE_DOWN_PREFETCH=0"
  STRATA_KERNEL_DEFINES="$d" timeout 100 python3 -m strata.bench --arm all-gpu --model $M \
    --vram-budget-widen --vram-budget-mib 40000 -p 512 -n 128 -r 3 \
    --json $O/all-gpu-$a-$SECONDS.json > /dev/null 2>&1; echo "rc=$?"
done
el "car-on"
timeout 100 python3 -m strata.bench --arm car-on --model $M --pack /tmp/q30-pack --calibrate \
  -p 512 -n 128 -r 3 --json $O/car-on-$SECONDS.json > /dev/null 2>&1; echo "rc=$?"
python3 - $O <<'PY'
import glob, json, sys
for p in sorted(glob.glob(sys.argv[1] + "/*-*.json")):
    r = json.load(open(p))["results"][0]
    print(p.rsplit("/", 1)[1], {k: round(r[k], 3) for k in ("prefill_tps", "decode_tps", "hit_rate")})
PY
el "gpu-kernels arm"
timeout 150 python3 -m strata.bench --arm gpu-kernels --json $O/gpu-kernels.json > $O/gpu-kernels.txt 2>&1
echo "rc=$?"; grep -E "attn_q|attn_o|layer|copy " $O/gpu-kernels.txt | grep -v "graph  " | head -40
tar -cf $OUT/jf.tar -C $O .
el "done"
