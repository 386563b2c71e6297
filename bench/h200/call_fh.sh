#!/usr/bin/env bash
# Session 12, call FH (the session's last device time): the eager intermediate quantization
# against its phase-and-barrier arm (eq=0) in prefill-sized batches, IQ3_XXS, T = 64 and 512.
. bench/h200/lib.sh
O=/tmp/fhout; rm -rf $O && mkdir -p $O
for t in 64 512; do
  el "eager quant A/B IQ3_XXS T=$t"
  timeout 90 python3 -c "
import json
from strata.bench.cpu_pool import run_layout_ab
rows = run_layout_ab('qwen3-30b-a3b', 'IQ3_XXS', ('repack', 'repack@eq=0'), tokens=$t, threads=16, repeats=16)
json.dump(rows, open('$O/eq-ab-IQ3_XXS-t$t.json', 'w'), indent=1)
" 2>&1 | tail -3
done
tar -cf $OUT/fh.tar -C $O .
el "done"
