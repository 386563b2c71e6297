#!/usr/bin/env bash
# Prepared for the next session's first call (not run yet): the GPU suite (the residual-add
# assertion in the resident-experts test has only run on the emulator), all-resident decode with
# the default MoE kernels against the fused gate/up + quant variant (one launch fewer a layer),
# the ncu table after, and the CPU pool's IQ3_XXS layouts timed against each other in one
# process (lut4 repack vs the VBMI kernel on the GGUF bytes), T = 1 and 8, on an idle host.
. bench/h200/lib.sh
start_model
el "GPU tests"
timeout 260 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tee $OUT/gpu-tests.txt | tail -3
wait_model
for v in legacy+legacy fq+legacy; do
  el "all-gpu $v"
  STRATA_MOE_VARIANT=$v timeout 90 python3 -m strata.bench --arm all-gpu --model $M --vram-budget-widen \
    --vram-budget-mib 40000 -p 512 -n 128 -r 3 --json $OUT/all-gpu-${v/+/-}.json 2>&1 | grep -E "^all-gpu" | tail -1
done
el "ncu"
timeout 120 ncu --clock-control none --cache-control none --profile-from-start off --metrics gpu__time_duration.sum \
  --csv --log-file $OUT/ncu-decode.csv python3 scripts/profile_decode.py run --model $M --tokens 2 2>&1 | tail -1
S=$(python3 -c "import json; print(1000/json.load(open('$OUT/all-gpu-legacy-legacy.json'))['results'][0]['decode_tps'])" 2>/dev/null)
python3 scripts/profile_decode.py report $OUT/ncu-decode.csv --tokens 2 --step-ms ${S:-0} > $OUT/ncu-report.txt
head -16 $OUT/ncu-report.txt
for T in 1 8; do
  el "pool layout A/B T=$T"
  timeout 120 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS --threads 16 --tokens $T --layout-ab repack,gguf \
    --out $OUT/pool-layout-ab-t$T 2>&1 | grep -A3 "^quant " | tail -3
done
el "done"
