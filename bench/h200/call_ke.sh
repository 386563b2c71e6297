#!/usr/bin/env bash
# Session 17, call KE: the whole GPU suite at this commit (experts_mma.cu's x staged in shared
# memory, STRATA_MMA_XSTAGE=1), then the A/B of it: the dense prompt GEMM alone
# (bench/h200/mma_xstage_ab.py), the all-resident engine (prefill of 512 tokens) and car-on at
# 10240 MiB (its staged misses run on the same tiles), each A B B A against
# STRATA_KERNEL_DEFINES=-DSTRATA_MMA_XSTAGE=0. Model and pack prepared meanwhile.
. bench/h200/lib.sh
O=/tmp/keout; rm -rf $O && mkdir -p $O
(setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &)
el "gpu tests"
timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > $O/gpu-tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-tests.txt | tail -12
el "dense A/B"
timeout 90 python3 bench/h200/mma_xstage_ab.py > $O/mma-xstage-ab.txt 2>&1; echo "rc=$?"
cat $O/mma-xstage-ab.txt
for _ in $(seq 1 40); do grep -q PREP-DONE /tmp/prep.log 2>/dev/null && break; sleep 3; done
el "prep: $(tail -1 /tmp/prep.log)"
for x in 1 0 0 1; do
  el "all-gpu xstage=$x"
  STRATA_KERNEL_DEFINES="-DSTRATA_MMA_XSTAGE=$x" timeout 60 python3 -m strata.bench --arm all-gpu \
    --model /tmp/q30.gguf --vram-budget-widen --vram-budget-mib 40000 -p 512 -n 32 -r 3 \
    --json $O/all-gpu-x$x-$SECONDS.json > /dev/null 2>&1; echo "rc=$?"
done
for x in 1 0 0 1; do
  el "car-on xstage=$x"
  STRATA_KERNEL_DEFINES="-DSTRATA_MMA_XSTAGE=$x" timeout 60 python3 -m strata.bench --arm car-on \
    --model /tmp/q30.gguf --pack /tmp/q30-pack --calibrate -p 512 -n 32 -r 3 \
    --json $O/car-on-x$x-$SECONDS.json > /dev/null 2>&1; echo "rc=$?"
done
python3 - $O > $O/engine-ab.txt <<'PY'
import glob, json, sys
for p in sorted(glob.glob(sys.argv[1] + "/*-x*.json")):
    r = json.load(open(p))["results"][0]
    print(p.rsplit("/", 1)[1], {k: round(r[k], 3) for k in ("prefill_tps", "decode_tps") if k in r})
PY
cat $O/engine-ab.txt
cp $O/gpu-tests.txt $O/mma-xstage-ab.txt $O/engine-ab.txt $OUT/
el "done"
