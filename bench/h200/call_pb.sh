#!/usr/bin/env bash
# Session 22, call PB: PA's one failure (test_adaptive_swaps_upload_off_the_critical_path: graph
# and eager logits apart at step 13) repeated with fresh prompts per arm (short decode attention
# or the split kernels in the graph engine; swaps or none), then the CPU pool on the 16-core
# guest (IQ3_XXS, Q4_K, IQ1_M at T = 1; #3's standing at this commit).
. bench/h200/lib.sh
O=/tmp/pbout; rm -rf $O && mkdir -p $O
el "lockstep repeats"
timeout 330 python3 bench/h200/lockstep_repeat.py 14 > $O/lockstep-repeat.txt 2>&1
echo "rc=$?"; grep -v Warning $O/lockstep-repeat.txt | tail -8
el "cpu pool"
timeout 200 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS,Q4_K,IQ1_M --threads 16 --tokens 1 \
  --repeats 30 --wait-quiet --out $O/cpu-pool-16core > $O/cpu-pool.txt 2>&1
echo "rc=$?"; tail -24 $O/cpu-pool.txt
cp $O/* $OUT/ 2>/dev/null
el "done"
