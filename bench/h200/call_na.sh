#!/usr/bin/env bash
# Session 20, call NA: the IQ2/IQ3 signs as two byte masks (STRATA_SIGN_SPREAD=2, sign_masks:
# two multiplies and two prmt for 8 values) and the grid indices by byte permute (byte_of):
# the decode/prompt kernel tests, the T = 1 GEMVs / MoE layer / prompt GEMM against
# SIGN_SPREAD=0 (what default builds took before: the knob was read before its default was
# defined), the all-resident engine A B B A against SIGN_SPREAD=0, then ncu's view of the
# IQ3_XXS attn_q GEMV with the new decode.
. bench/h200/lib.sh
O=/tmp/naout; rm -rf $O && mkdir -p $O
(setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &)
el "kernel tests"
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_kernels.py \
  tests/test_gpu_grouped.py -k "gemv or moe or gemm_mma or embed or grouped or tiles" \
  > $O/gpu-kernel-tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-kernel-tests.txt | tail -12
el "decode A/B: now vs SIGN_SPREAD=0"
timeout 120 python3 bench/h200/decode_reg_ab.py IQ3_XXS,IQ2_XXS,IQ3_S,IQ2_S \
  "-DSTRATA_SIGN_SPREAD=0" > $O/decode-na-ab.txt 2>&1
echo "rc=$?"; tail -24 $O/decode-na-ab.txt
for _ in $(seq 1 60); do grep -q MODEL-DONE /tmp/prep.log 2>/dev/null && break; sleep 3; done
el "model: $(tail -1 /tmp/prep.log)"
run() {  # tag, env...
  local tag=$1; shift
  el "all-gpu $tag"
  env "$@" timeout 80 python3 -m strata.bench --arm all-gpu --model $M --vram-budget-widen \
    --vram-budget-mib 40000 -p 512 -n 64 -r 3 --json $O/all-gpu-$tag-$SECONDS.json > /dev/null 2>&1
  echo "rc=$?"
}
for x in 2 0 0 2; do run spread$x STRATA_KERNEL_DEFINES="-DSTRATA_SIGN_SPREAD=$x"; done
python3 - $O > $O/engine-ab.txt <<'PY'
import glob, json, os, sys
for p in sorted(glob.glob(sys.argv[1] + "/all-gpu-*.json"), key=os.path.getmtime):
    r = json.load(open(p))["results"][0]
    print(p.rsplit("/", 1)[1], {k: round(r[k], 3) for k in ("prefill_tps", "decode_tps") if k in r})
PY
cat $O/engine-ab.txt
el "ncu gemv1w IQ3_XXS attn_q"
timeout 90 ncu --profile-from-start off -k regex:gemv1w --section SpeedOfLight \
  --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section Occupancy python3 scripts/profile_gemv.py --quants IQ3_XXS --shape attn_q \
  > $O/ncu-gemv1w-iq3_xxs-attn_q.txt 2>&1
echo "rc=$?"; grep -E "Duration|Throughput|Issue|Cycles Per|Pipe|Occupancy" $O/ncu-gemv1w-iq3_xxs-attn_q.txt | head -30
cp $O/*.txt $O/*.json $OUT/ 2>/dev/null
el "done"
