#!/usr/bin/env bash
# Session 25, call SC: the CPU pool's pipelined decode layer (STRATA_POOL_PIPELINE=1, arm
# `@pl=1`: no barrier after gate/up) against the barriered default, calls interleaved in one
# process (`--layout-ab auto,auto@pl=1`), 16 threads, T = 1 and T = 8; the outputs as one tarball
# (the device returns 8 files at most).
. bench/h200/lib.sh
O=/tmp/scout; rm -rf $O && mkdir -p $O
for t in 1 8; do
  for r in 1 2; do
    el "pipeline A/B T=$t r$r"
    timeout 150 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS,Q4_K,IQ1_M --threads 16 --tokens $t \
      --repeats 40 --layout-ab auto,auto@pl=1 --out $O/pl-ab-t$t-r$r > $O/pl-ab-t$t-r$r.txt 2>&1
    echo "rc=$?"; grep -E "^(IQ|Q)[0-9A-Z_]+ " $O/pl-ab-t$t-r$r.txt | tail -6
  done
done
tar czf $OUT/sc.tgz -C $O .
el "done"
