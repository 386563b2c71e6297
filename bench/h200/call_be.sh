#!/usr/bin/env bash
# Session 8, call BE: the pool's fixed cost per call and the IQ3_XXS pm layer at T = 1 under the
# OpenMP wait policy Numba's omp layer inherits (default, OMP_WAIT_POLICY=ACTIVE, =PASSIVE),
# alternating processes, twice; then the CPU test file that failed on this host in call BD.
. bench/h200/lib.sh
O=/tmp/beout; rm -rf $O && mkdir -p $O
for r in 1 2; do
  for pol in default ACTIVE PASSIVE; do
    el "policy $pol run $r"
    if [ $pol = default ]; then unset OMP_WAIT_POLICY; else export OMP_WAIT_POLICY=$pol; fi
    timeout 60 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS --threads 16 --overhead-only \
      --out $O/ovh-$pol-r$r 2>&1 | grep -E "qwen3-30b-a3b \| 16 \| (0|8) \| fused|empty" | head -3
    timeout 60 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS --threads 16 --tokens 1 \
      --layout-ab pm --out $O/pool-$pol-r$r 2>&1 | grep "pm/pm"
  done
done
unset OMP_WAIT_POLICY
el "tests"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_cpu_kernels.py > $O/cpu-tests-kernels.txt 2>&1
echo "rc=$?"; tail -2 $O/cpu-tests-kernels.txt
tar -cf $OUT/be.tar -C $O .
el "done"
