#!/usr/bin/env bash
# Session 17, call KF (the last ~300 s of device time; no default kernel changed since KE: the
# default experts_mma.cu cubin is byte-identical to KE's): the arm -DSTRATA_MMA_K32=1 (one k32
# mma a sub-block for one-scale formats) against the default on the dense prompt GEMM (with
# the products compared) and in the all-resident engine's prefill (A B B A), then where a
# 512-token prefill's device time goes now (bench/h200/prefill_profile.py).
. bench/h200/lib.sh
O=/tmp/kfout; rm -rf $O && mkdir -p $O
start_model
el "dense A/B k32"
timeout 80 python3 bench/h200/mma_xstage_ab.py Q8_0,Q4_K,IQ4_XS,IQ3_XXS,Q6_K attn_q,attn_o \
  -DSTRATA_MMA_K32=1 > $O/mma-k32-ab.txt 2>&1; echo "rc=$?"; cat $O/mma-k32-ab.txt
wait_model; el "model: $(ls -la $M | cut -c1-80)"
for x in 1 0 0 1; do
  el "all-gpu k32=$x"
  STRATA_KERNEL_DEFINES="-DSTRATA_MMA_K32=$x" timeout 45 python3 -m strata.bench --arm all-gpu \
    --model $M --vram-budget-widen --vram-budget-mib 40000 -p 512 -n 16 -r 3 \
    --json $O/all-gpu-k$x-$SECONDS.json > /dev/null 2>&1; echo "rc=$?"
done
python3 - $O > $O/engine-ab.txt <<'PY'
import glob, json, sys
for p in sorted(glob.glob(sys.argv[1] + "/all-gpu-*.json")):
    r = json.load(open(p))["results"][0]
    print(p.rsplit("/", 1)[1], {k: round(r[k], 3) for k in ("prefill_tps", "decode_tps") if k in r})
PY
cat $O/engine-ab.txt
el "prefill profile"
timeout 60 python3 bench/h200/prefill_profile.py $M 512 > $O/prefill-profile.txt 2>&1; echo "rc=$?"
head -30 $O/prefill-profile.txt
cp $O/*.txt $OUT/
el "done"
