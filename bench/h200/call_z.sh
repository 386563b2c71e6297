#!/usr/bin/env bash
# Session 6, call Z: the whole GPU suite at the final commit, then the decode chain at the
# session's start (tree /tmp/wo, 2b69d98) against the final commit (this tree) in one call, arms
# alternating (call_z2.sh does the same for the CPU pool); the final commit is also run with
# STRATA_FAST_DECODE=1 (tree /tmp/wf: the same source with quant_blocks.cuh's compile-time
# default flipped by sed; tests hold its outputs bit-identical) and with STRATA_SMEM_GRID=1 too
# (tree /tmp/ws: lookup grids in shared memory for the MoE kernels), and ncu's per-kernel table.
. bench/h200/lib.sh
: "${SNAP:?set SNAP to a directory holding old.tar (git archive of 2b69d98, default.gguf left out)}"
rm -rf /tmp/wo /tmp/wf /tmp/ws && mkdir -p /tmp/wo && tar -xf $SNAP/old.tar -C /tmp/wo \
  && cp -a $PWD /tmp/wf && cp -a $PWD /tmp/ws
for t in wf ws; do
  sed -i 's/^#define STRATA_FAST_DECODE 0$/#define STRATA_FAST_DECODE 1/' /tmp/$t/strata/gpu/kernels/quant_blocks.cuh
done
sed -i 's/^#define STRATA_SMEM_GRID 0$/#define STRATA_SMEM_GRID 1/' /tmp/ws/strata/gpu/kernels/quant_blocks.cuh
grep -h "define STRATA_FAST_DECODE\|define STRATA_SMEM_GRID" /tmp/w*/strata/gpu/kernels/quant_blocks.cuh | sort | uniq -c
start_model
el "GPU suite"
timeout 330 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tee $OUT/gpu-tests.txt | tail -3
wait_model || { el "model not ready"; exit 1; }
for r in 1 2; do
  for arm in wo w wf ws; do
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
el "done"
