#!/usr/bin/env bash
# Session 19, call MC: the prompt's tensor-core tiles decode from their warp's staged copy of the
# weight rows (experts_mma.cu STRATA_MMA_WSTAGE): the mma tile and GEMM tests (bits against the
# unstaged build included), the 512-row dense GEMM A/B (bench/h200/mma_xstage_ab.py), the
# all-resident engine A B B A against -DSTRATA_MMA_WSTAGE=0, and the 512-token prefill profile.
. bench/h200/lib.sh
O=/tmp/mcout; rm -rf $O && mkdir -p $O
(setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &)
el "mma tests"
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_grouped.py \
  tests/test_gpu_kernels.py -k "mma or grouped or tiles" > $O/gpu-mma-tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-mma-tests.txt | tail -12
el "dense GEMM A/B"
timeout 100 python3 bench/h200/mma_xstage_ab.py Q8_0,IQ3_XXS,Q4_K,Q6_K,IQ1_M attn_q,attn_o \
  -DSTRATA_MMA_WSTAGE=0 > $O/mma-wstage-ab.txt 2>&1; echo "rc=$?"; tail -14 $O/mma-wstage-ab.txt
for _ in $(seq 1 60); do grep -q MODEL-DONE /tmp/prep.log 2>/dev/null && break; sleep 3; done
el "model: $(tail -1 /tmp/prep.log)"
run() {  # tag, env...
  local tag=$1; shift
  el "all-gpu $tag"
  env "$@" timeout 75 python3 -m strata.bench --arm all-gpu --model $M --vram-budget-widen \
    --vram-budget-mib 40000 -p 512 -n 64 -r 3 --json $O/all-gpu-$tag-$SECONDS.json > /dev/null 2>&1
  echo "rc=$?"
}
for x in 1 0 0 1; do run wstage$x STRATA_KERNEL_DEFINES="-DSTRATA_MMA_WSTAGE=$x"; done
python3 - $O > $O/engine-ab.txt <<'PY'
import glob, json, os, sys
for p in sorted(glob.glob(sys.argv[1] + "/all-gpu-*.json"), key=os.path.getmtime):
    r = json.load(open(p))["results"][0]
    print(p.rsplit("/", 1)[1], {k: round(r[k], 3) for k in ("prefill_tps", "decode_tps") if k in r})
PY
cat $O/engine-ab.txt
el "prefill profile"
timeout 60 python3 bench/h200/prefill_profile.py $M 512 > $O/prefill-profile.txt 2>&1; echo "rc=$?"
head -24 $O/prefill-profile.txt
cp $O/*.txt $O/*.json $OUT/ 2>/dev/null
el "done"
