#!/usr/bin/env bash
# Session 6, call Z2: the CPU pool at the session's start (tree /tmp/wo, 2b69d98) against the
# final commit (this tree), one Qwen3-30B-A3B layer from DRAM, T = 1, 16 threads, the trees
# alternating per format (layouts interleaved within each run).
. bench/h200/lib.sh
: "${SNAP:?set SNAP to a directory holding old.tar (git archive of 2b69d98, default.gguf left out)}"
rm -rf /tmp/wo && mkdir -p /tmp/wo && tar -xf $SNAP/old.tar -C /tmp/wo
for q in "IQ3_XXS repack,gguf" "IQ1_M repack,gguf" "Q4_K gguf"; do
  set -- $q
  for arm in wo w; do
    el "pool $1 ($2) tree $arm"
    (cd /tmp/$arm && PYTHONPATH=/tmp/site:/tmp/$arm timeout 100 python3 bench/cpu_pool_sweep.py --quant $1 --threads 16 \
      --tokens 1 --layout-ab $2 --out $OUT/pool-$1-$arm 2>&1 | grep -A4 "^quant " | tail -3)
  done
done
el "done"
