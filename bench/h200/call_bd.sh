#!/usr/bin/env bash
# Session 8, call BD: IQ3_XXS pm (one block at a time, the default "repack" on this AVX-512 host
# now) on the card's host: the CPU tests that see the host's kernels (bit for bit, the pool, the
# pack), the ceilings on 1 and 16 cores, and the pool at T = 1 and T = 8 on 16 threads, layouts
# interleaved in one process (lut4, pm, GGUF bytes), twice; the same for IQ1_M (t2 vs gguf) once.
. bench/h200/lib.sh
O=/tmp/bdout; rm -rf $O && mkdir -p $O
el "CPU tests"
timeout 330 python3 -m pytest -q -p no:cacheprovider tests/test_cpu_iq3_pm.py tests/test_cpu_iq3_vbmi.py \
  tests/test_cpu_kernels.py tests/test_cpu_gather.py tests/test_cpu_pool.py tests/test_cpu_pack.py > $O/cpu-tests.txt 2>&1
echo "rc=$?"; tail -3 $O/cpu-tests.txt
el "ceilings"
timeout 100 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS --layout-ab lut4,pm,gguf \
  --ceiling-only --ceiling-threads 16 --out $O/ceil-iq3 2>&1 | grep "^| IQ3"
for r in 1 2; do
  el "pool T=1 run $r"
  timeout 120 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS --threads 16 --tokens 1 \
    --layout-ab lut4,pm,gguf --out $O/pool-iq3-t1-r$r 2>&1 | grep -A4 "^quant " | tail -3
done
el "pool T=8"
timeout 120 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS --threads 16 --tokens 8 \
  --layout-ab lut4,pm,gguf --out $O/pool-iq3-t8 2>&1 | grep -A4 "^quant " | tail -3
tar -cf $OUT/bd.tar -C $O .
el "done"
