#!/usr/bin/env bash
# Session 4, call P: the pool on a quiet host (call O's sweeps ran beside the model/pack build):
# IQ3_XXS T = 1 default (GGUF bytes, VBMI; prefetch 4096 B), prefetch 0 (3 rows), lut4; T = 8.
. bench/h200/lib.sh
run() { local name=$1; shift; el "$name"; timeout 120 "$@" --out $OUT/$name 2>&1 | grep -A3 "^shape" | grep IQ3; }
run t1-default python3 bench/cpu_pool_sweep.py --quant IQ3_XXS --threads 16 --tokens 1
STRATA_POOL_PREFETCH_BYTES=0 run t1-pf0 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS --threads 16 --tokens 1
run t1-lut4 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS --threads 16 --tokens 1 --layout repack
run t1-default-again python3 bench/cpu_pool_sweep.py --quant IQ3_XXS --threads 16 --tokens 1
run t8-default python3 bench/cpu_pool_sweep.py --quant IQ3_XXS --threads 16 --tokens 8
el "done"
