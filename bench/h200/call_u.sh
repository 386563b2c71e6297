#!/usr/bin/env bash
# Session 5, call U: what the host's 16 "cores" are (lscpu), the CPU pool's thread scaling on the
# GGUF bytes (IQ1_M's AVX-512 kernel, IQ3_XXS's VBMI kernel) and its fixed cost per call, GPU idle;
# then the gpu-kernels arm with the launch floor (empty launches, plain and PDL).
. bench/h200/lib.sh
lscpu | grep -E "^(CPU\(s\)|Thread|Core|Socket|Model name|NUMA node\(s\)|L1d|L2|L3|CPU max MHz)" | tee $OUT/lscpu.txt
el "pool thread scaling, gguf layouts"
timeout 200 python3 bench/cpu_pool_sweep.py --quant IQ1_M,IQ3_XXS --threads 1,2,4,8,16 --tokens 1 --layout gguf \
  --overhead --out $OUT/pool-scaling-gguf 2>&1 | grep -B2 -A16 "^quant " | head -60
el "gpu-kernels"
timeout 150 python3 -m strata.bench --arm gpu-kernels --json $OUT/gpu-kernels.json > $OUT/gpu-kernels.txt 2>&1
grep -E "floor|expert_gate|layer|copy" $OUT/gpu-kernels.txt | head -40
el "done"
