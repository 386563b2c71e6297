#!/usr/bin/env bash
# Session 6, call Z (the session's final GPU call): the whole GPU suite at the final commit, then
# the decode chain and the CPU pool at the session's start (tree /tmp/wo, 2b69d98) against the
# final commit (this tree) in one call, arms alternating; the final commit is also run with
# STRATA_FAST_DECODE=1 (tree /tmp/wf: the same source with quant_blocks.cuh's compile-time
# default flipped by sed; tests hold its outputs bit-identical), and ncu's per-kernel table.
. bench/h200/lib.sh
: "${SNAP:?set SNAP to the .snap directory of the checkout: old.tar = 2b69d98, head.tar = this commit}"
rm -rf /tmp/wo /tmp/wf && mkdir -p /tmp/wo /tmp/wf && tar -xf $SNAP/old.tar -C /tmp/wo && tar -xf $SNAP/head.tar -C /tmp/wf
sed -i 's/^#define STRATA_FAST_DECODE 0$/#define STRATA_FAST_DECODE 1/' /tmp/wf/strata/gpu/kernels/quant_blocks.cuh
grep -c "define STRATA_FAST_DECODE 1" /tmp/wf/strata/gpu/kernels/quant_blocks.cuh
start_model
el "GPU suite"
timeout 330 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tee $OUT/gpu-tests.txt | tail -3
wait_model || { el "model not ready"; exit 1; }
for r in 1 2; do
  for arm in wo w wf; do
    el "all-gpu $arm run $r"
    (cd /tmp/$arm && PYTHONPATH=/tmp/site:/tmp/$arm timeout 75 python3 -m strata.bench --arm all-gpu --model $M \
      --vram-budget-widen --vram-budget-mib 40000 -p 512 -n 128 -r 3 --json $OUT/all-gpu-$arm-r$r.json 2>&1 \
      | grep -E "^all-gpu|Error" | tail -1)
  done
done
el "ncu per-kernel table (final commit)"
timeout 120 ncu --clock-control none --cache-control none --profile-from-start off --metrics gpu__time_duration.sum \
  --csv --log-file $OUT/ncu-decode.csv python3 scripts/profile_decode.py run --model $M --tokens 2 2>&1 | grep unprofiled
python3 scripts/profile_decode.py report $OUT/ncu-decode.csv --tokens 2 > $OUT/ncu-decode.txt 2>&1; head -16 $OUT/ncu-decode.txt
for q in "IQ3_XXS repack,gguf" "IQ1_M repack,gguf" "Q4_K gguf"; do
  set -- $q
  for arm in wo w; do
    el "pool $1 ($2) tree $arm"
    (cd /tmp/$arm && PYTHONPATH=/tmp/site:/tmp/$arm timeout 100 python3 bench/cpu_pool_sweep.py --quant $1 --threads 16 \
      --tokens 1 --layout-ab $2 --out $OUT/pool-$1-$arm 2>&1 | grep -A4 "^quant " | tail -3)
  done
done
el "done"
