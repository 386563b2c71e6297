#!/usr/bin/env bash
# Session 25, call SB: the CPU pool's decode layer (T=1, from DRAM, 16 threads) with the f16 scale
# conversion by inline asm (STRATA_CPU_F16_ASM=1) against LLVM's lowering (=0), each arm with its
# own Numba cache, alternating; IQ1_M, Q4_K, IQ3_XXS, Q6_K, IQ4_XS.
. bench/h200/lib.sh
O=/tmp/sbout; rm -rf $O && mkdir -p $O
for r in 1 2; do
  for a in 1 0; do
    el "pool f16asm=$a r$r"
    STRATA_CPU_F16_ASM=$a NUMBA_CACHE_DIR=/tmp/nc$a timeout 130 python3 bench/cpu_pool_sweep.py \
      --quant IQ1_M,Q4_K,IQ3_XXS,Q6_K,IQ4_XS --threads 16 --tokens 1 --repeats 30 \
      --out $O/pool-asm$a-r$r > $O/pool-asm$a-r$r.txt 2>&1
    echo "rc=$?"; grep -E "^(IQ|Q)[0-9A-Z_]+ " $O/pool-asm$a-r$r.txt | tail -6
  done
done
cp -r $O/* $OUT/ 2>/dev/null
el "done"
