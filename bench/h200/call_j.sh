#!/usr/bin/env bash
# Session 3, call J: the fused gate/up + intermediate-quantization variant ("fq"): its GPU tests
# and the graph tests with it, then all-resident decode with the default kernels and with it.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
M=/tmp/q30.gguf
[ -f $M ] || (setsid nohup python3 -m strata synth $M --shape qwen3-30b-a3b --quant IQ3_XXS --skew 1 \
  > /tmp/synth.log 2>&1 < /dev/null &)
timeout 90 python3 -m pytest -q -m gpu tests/test_gpu_kernels.py -k "moe or variant" -p no:cacheprovider 2>&1 \
  | tee $OUT/gpu-moe-tests.txt | tail -3
el "graph tests with fq+legacy (counter reset across replays)"
STRATA_MOE_VARIANT=fq+legacy timeout 100 python3 -m pytest -q -m gpu tests/test_gpu_graph.py -p no:cacheprovider \
  2>&1 | tee $OUT/gpu-graph-fq-tests.txt | tail -3
for i in $(seq 1 60); do [ -f $M ] && ! pgrep -f "strata synth" > /dev/null && break; sleep 2; done
el "all-gpu default, then fq+legacy"
for v in legacy+legacy fq+legacy; do
  STRATA_MOE_VARIANT=$v timeout 70 python3 -m strata.bench --arm all-gpu --model $M --vram-budget-widen \
    --vram-budget-mib 40000 -p 512 -n 128 -r 2 --json $OUT/all-gpu-$v.json 2>&1 | grep -E "^all-gpu" | tail -1
done
el "done"
