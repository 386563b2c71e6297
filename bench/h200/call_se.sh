#!/usr/bin/env bash
# Session 25, call SE (the one machine this session got after SA/SB; SC and SD could not start):
# the CPU pool's pipelined decode layer (STRATA_POOL_PIPELINE=1, arm `@pl=1`) against the
# barriered default, calls interleaved in one process, 16 threads, T = 1 and T = 8, with the new
# Q8_0 AVX2 kernel in the set; then the whole GPU suite at this commit, written to $OUT as it
# runs (so a cut-off run still returns what passed).
. bench/h200/lib.sh
O=/tmp/seout; rm -rf $O && mkdir -p $O
for t in 1 8; do
  el "pipeline A/B T=$t"
  timeout 140 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS,Q4_K,IQ1_M,Q8_0 --threads 16 --tokens $t \
    --repeats 30 --layout-ab auto,auto@pl=1 --out $O/pl-ab-t$t > $O/pl-ab-t$t.txt 2>&1
  echo "rc=$?"; grep -E "^(IQ|Q)[0-9A-Z_]+ " $O/pl-ab-t$t.txt | tail -8
done
tar czf $OUT/se-cpu.tgz -C $O .
el "gpu suite"
timeout 400 python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > $OUT/gpu-suite.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu-suite.txt | tail -12
el "done"
