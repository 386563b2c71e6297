#!/usr/bin/env bash
# Session 8, call BC: why the four-block IQ3_XXS kernels ran slower than the one-block one (call BB):
# one-core and 16-core ceilings of the A/B kernel codes: 42 (GGUF bytes, one block, vpmaddwd),
# 45 (one block, vpdpwssd), 39 (four blocks, vector float steps), 46 (pm, one block),
# 47 (pm, four blocks, scalar float steps), 44 (pm, four blocks, vector float steps).
. bench/h200/lib.sh
O=/tmp/bcout; rm -rf $O && mkdir -p $O
for r in 1 2; do
  el "ceilings run $r"
  timeout 200 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS --layout-ab gguf@k=42,gguf@k=45,gguf,pm@k=46,pm@k=47,pm \
    --ceiling-only --ceiling-threads 16 --out $O/ceil-r$r 2>&1 | grep "^| IQ3"
done
tar -cf $OUT/bc.tar -C $O .
el "done"
