#!/usr/bin/env bash
# Session 12, call FG: the whole GPU suite at the final code (the pool's intermediate quantized
# by the thread completing each block, eager_quant); then eager against the barrier-and-phase
# arm (eq=0) in one process per format (run_layout_ab: calls interleaved ABBA, T = 1, 16
# threads, on the team), and the intermediate-quant A/B (parallel against sequential at
# T = 1, 8, 64, 512) for IQ3_XXS.
. bench/h200/lib.sh
O=/tmp/fgout; rm -rf $O && mkdir -p $O
el "GPU tests (whole suite)"
timeout 300 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider > $O/gpu-tests.txt 2>&1
echo "rc=$?"; grep -E "passed|failed|FAIL" $O/gpu-tests.txt | tail -6
for a in "IQ3_XXS repack" "Q4_K gguf" "IQ1_M repack"; do
  set -- $a
  el "eager quant A/B $1"
  timeout 120 python3 -c "
import json, sys
from strata.bench.cpu_pool import run_layout_ab
rows = run_layout_ab('qwen3-30b-a3b', '$1', ('$2', '$2@eq=0'), tokens=1, threads=16, repeats=60)
json.dump(rows, open('$O/eq-ab-$1.json', 'w'), indent=1)
" 2>&1 | tail -4
done
el "intermediate-quant A/B IQ3_XXS"
timeout 150 python3 -c "
import json
from strata.bench.cpu_pool import run_quant_ab
json.dump(run_quant_ab('qwen3-30b-a3b', 'IQ3_XXS', threads=16), open('$O/quant-ab-IQ3_XXS.json', 'w'), indent=1)
" 2>&1 | tail -7
tar -cf $OUT/fg.tar -C $O .
el "done"
