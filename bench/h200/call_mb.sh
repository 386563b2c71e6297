#!/usr/bin/env bash
# Session 19, call MB: the grid codes for IQ1_M only (STRATA_GRID_CODES a format mask) and the
# sign bits spread by one multiply (STRATA_SIGN_SPREAD): the decode kernel tests, the T = 1
# GEMVs / MoE layer / prompt GEMM against both off (bench/h200/decode_reg_ab.py), then the
# all-resident engine (IQ3_XXS experts, 512-token prompts) A B B A against SIGN_SPREAD=0.
. bench/h200/lib.sh
O=/tmp/mbout; rm -rf $O && mkdir -p $O
(setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &)
el "kernel tests"
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_kernels.py \
  tests/test_gpu_grouped.py -k "gemv or moe or gemm_mma or embed or grouped or tiles" \
  > $O/gpu-kernel-tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-kernel-tests.txt | tail -12
el "decode A/B now vs codes off + shift signs"
timeout 120 python3 bench/h200/decode_reg_ab.py IQ3_XXS,IQ1_M,IQ2_XXS,IQ3_S,IQ2_S \
  "-DSTRATA_GRID_CODES=0 -DSTRATA_SIGN_SPREAD=0" > $O/decode-mb-ab.txt 2>&1
echo "rc=$?"; tail -22 $O/decode-mb-ab.txt
for _ in $(seq 1 60); do grep -q MODEL-DONE /tmp/prep.log 2>/dev/null && break; sleep 3; done
el "model: $(tail -1 /tmp/prep.log)"
run() {  # tag, env...
  local tag=$1; shift
  el "all-gpu $tag"
  env "$@" timeout 75 python3 -m strata.bench --arm all-gpu --model $M --vram-budget-widen \
    --vram-budget-mib 40000 -p 512 -n 64 -r 3 --json $O/all-gpu-$tag-$SECONDS.json > /dev/null 2>&1
  echo "rc=$?"
}
for x in 1 0 0 1; do run spread$x STRATA_KERNEL_DEFINES="-DSTRATA_SIGN_SPREAD=$x"; done
python3 - $O > $O/engine-ab.txt <<'PY'
import glob, json, os, sys
for p in sorted(glob.glob(sys.argv[1] + "/all-gpu-*.json"), key=os.path.getmtime):
    r = json.load(open(p))["results"][0]
    print(p.rsplit("/", 1)[1], {k: round(r[k], 3) for k in ("prefill_tps", "decode_tps") if k in r})
PY
cat $O/engine-ab.txt
cp $O/*.txt $O/*.json $OUT/ 2>/dev/null
el "done"
