#!/usr/bin/env bash
# Session 6, call Z2: the GPU suite at the final commit (its default build changed after call Z:
# FAST_DECODE and SMEM_GRID on); the decode and prefill of the session's start (tree /tmp/wo,
# 2b69d98) against the final commit (this tree), alternating; then the CPU pool, start against
# end, one Qwen3-30B-A3B layer from DRAM, T = 1, 16 threads, the trees alternating per format
# (layouts interleaved within each run). Outputs go to one tarball (the run returns 8 files).
. bench/h200/lib.sh
: "${SNAP:?set SNAP to a directory holding old.tar (git archive of 2b69d98, default.gguf left out)}"
O=/tmp/z2out; rm -rf $O /tmp/wo && mkdir -p $O /tmp/wo && tar -xf $SNAP/old.tar -C /tmp/wo
start_model
el "GPU suite"
timeout 300 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tee $O/gpu-tests.txt | tail -2
wait_model || { el "model not ready"; exit 1; }
for r in 1 2; do
  for arm in wo w; do
    el "all-gpu $arm run $r"
    (cd /tmp/$arm && PYTHONPATH=/tmp/site:/tmp/$arm timeout 75 python3 -m strata.bench --arm all-gpu --model $M \
      --vram-budget-widen --vram-budget-mib 40000 -p 512 -n 128 -r 3 --json $O/all-gpu-$arm-r$r.json 2>&1 \
      | grep -E "^all-gpu|Error" | tail -1)
  done
done
for q in "IQ3_XXS repack,gguf" "IQ1_M repack,gguf" "Q4_K gguf"; do
  set -- $q
  for arm in wo w; do
    el "pool $1 ($2) tree $arm"
    (cd /tmp/$arm && PYTHONPATH=/tmp/site:/tmp/$arm timeout 100 python3 bench/cpu_pool_sweep.py --quant $1 --threads 16 \
      --tokens 1 --layout-ab $2 --out $O/pool-$1-$arm 2>&1 | grep -A4 "^quant " | tail -3)
  done
done
tar -cf $OUT/z2.tar -C $O .
el "done"
