#!/usr/bin/env bash
# Session 7, call AF: the pool's barrier A/B again (flags, the default, against the counter),
# one layer at T = 1 from DRAM, 16 threads, arms interleaved call by call: IQ3_XXS (both
# layouts), IQ1_M (T2 repack), Q4_K (GGUF bytes). Ran at c7b11e4 (call AE's code); no gain beyond
# noise, so the flag barrier was taken back out afterwards.
. bench/h200/lib.sh
O=/tmp/afout; rm -rf $O && mkdir -p $O
for q in "IQ3_XXS repack@counter,repack,gguf@counter,gguf 70" "IQ1_M repack@counter,repack 110" \
         "Q4_K gguf@counter,gguf 60"; do
  set -- $q
  el "layout-ab $1"
  timeout $3 python3 bench/cpu_pool_sweep.py --quant $1 --threads 16 --tokens 1 --layout-ab $2 \
    --out $O/pool-$1-barrier 2>&1 | grep -A6 "^quant " | head -6
done
tar -cf $OUT/af.tar -C $O .
el "done"
