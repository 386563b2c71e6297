#!/usr/bin/env bash
# Session 30, call XB (run after XA on the warm machine): the cpu-pool arm at T = 1 for
# Q4_K, IQ1_M and IQ3_XXS (the AVX-512 K-quant kernels now the default on this host), and the
# three kernels' ceilings, one thread alone and each of 16 busy.
. bench/h200/lib.sh
O=/tmp/xb; rm -rf $O; mkdir -p $O
save() { tar -czf $OUT/xb.tgz -C $O .; }
{ lscpu; grep -m1 -E "^flags" /proc/cpuinfo; } > $O/topology.txt 2>&1
arm() {  # tag quant
  el "cpu-pool arm $1"
  timeout 75 python3 -m strata.bench --arm cpu-pool --shape qwen3-30b-a3b --quant $2 -t 1 \
    --json $O/arm-$1.json > $O/arm-$1.txt 2> $O/arm-$1.err
  echo "rc=$?"; grep -E "^qwen3|served|host read" $O/arm-$1.txt | cut -c1-200
  save
}
arm q4k Q4_K
arm iq1m IQ1_M
arm iq3 IQ3_XXS
el "kernel ceilings: one thread alone, each of 16 busy (L2-resident weights)"
timeout 100 python3 bench/cpu_pool_sweep.py --quant IQ1_M,IQ3_XXS,Q4_K --ceiling-only \
  --ceiling-threads 16 --out $O/ceilings > $O/ceilings.txt 2>&1
echo "rc=$?"; tail -12 $O/ceilings.txt
save
el "done"
