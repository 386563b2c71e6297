#!/usr/bin/env bash
# Session 8, call BB: IQ3_XXS position-major repack (iq3_pm.py, AVX-512 VBMI + VNNI kernel) and the
# GGUF-byte VBMI kernel with four-block reductions, on the card's host: their tests (the kernels
# themselves, bit for bit), the compute ceilings on 1 and 16 cores, and the pool at T = 1 on 16
# threads, the layouts interleaved in one process (lut4, pm, GGUF bytes new kernel, old kernel).
. bench/h200/lib.sh
O=/tmp/bbout; rm -rf $O && mkdir -p $O
el "CPU tests (AVX-512 kernels)"
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_cpu_iq3_pm.py tests/test_cpu_iq3_vbmi.py \
  tests/test_cpu_pool.py > $O/cpu-tests.txt 2>&1
echo "rc=$?"; tail -3 $O/cpu-tests.txt
el "ceilings"
timeout 200 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS --layout-ab repack,pm,gguf,gguf@k=42 \
  --ceiling-only --ceiling-threads 16 --out $O/ceil-iq3 2>&1 | grep "^| IQ3"
for r in 1 2; do
  el "pool T=1 run $r"
  timeout 150 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS --threads 16 --tokens 1 \
    --layout-ab repack,pm,gguf,gguf@k=42 --out $O/pool-iq3-t1-r$r 2>&1 | grep -A5 "^quant " | tail -4
done
tar -cf $OUT/bb.tar -C $O .
el "done"
