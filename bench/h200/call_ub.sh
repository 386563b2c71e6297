#!/usr/bin/env bash
# Session 27, call UB: the pool's decode layer on expert bytes in NumPy (THP-advised), 4 KiB
# anonymous, 2 MiB-aligned THP anonymous and page-cache file memory, calls interleaved
# (bench/cpu_page_ab.py), IQ3_XXS / Q4_K / IQ1_M, twice; the register-only loop with 16 chains.
. bench/h200/lib.sh
O=/tmp/ubout; rm -rf $O && mkdir -p $O
cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag > $O/thp.txt
grep -E "AnonHugePages|HugePages_|MemFree|MemAvailable" /proc/meminfo >> $O/thp.txt; cat $O/thp.txt
el "register-only loop, 16 chains"
timeout 120 python3 bench/h200/alu_scaling.py --threads 1,2,4,8,12,16 --json $O/alu.json | tee $O/alu.md
for r in 1 2; do
  el "page A/B run $r"
  timeout 220 python3 bench/cpu_page_ab.py --quant IQ3_XXS,Q4_K,IQ1_M --threads 16 --repeats 40 \
    --json $O/page-ab-r$r.json > $O/page-ab-r$r.txt 2>&1
  echo "rc=$?"; cat $O/page-ab-r$r.txt | tail -14
done
tar czf $OUT/ub.tgz -C $O .
el "done"
