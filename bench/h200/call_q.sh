#!/usr/bin/env bash
# Session 4, call Q: T = 8 and T = 1 pool, this commit's pool.py against 5d23757's (base.tar), one host.
. bench/h200/lib.sh
mkdir -p /tmp/base && tar -xf .snap/base.tar -C /tmp/base
for T in 8 1; do for side in new old; do
  d=$PWD; [ $side = old ] && d=/tmp/base
  el "T=$T $side"
  (cd $d && PYTHONPATH=/tmp/site:$d timeout 60 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS --threads 16 \
    --tokens $T --layout gguf --repeats 20 --out $OUT/t$T-$side 2>&1 | grep -A3 "^shape" | grep IQ3)
done; done
el "done"
