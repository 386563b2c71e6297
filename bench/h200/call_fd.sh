#!/usr/bin/env bash
# Session 12, call FD: why whole processes of one arm differ by 10-25% on this host (calls FA-FC):
# the CPU topology, transparent huge pages and NUMA nodes; then the team against regions in one
# process (bench/pool_team_ab.py) with the team's members unpinned and pinned one to a CPU
# (STRATA_POOL_PIN=1), two processes each, alternating, IQ3_XXS then Q4_K.
. bench/h200/lib.sh
O=/tmp/fdout; rm -rf $O && mkdir -p $O
el "machine"
{ lscpu; echo; for f in enabled defrag; do echo "thp $f: $(cat /sys/kernel/mm/transparent_hugepage/$f)"; done
  ls -d /sys/devices/system/node/node* ; grep -i -e huge -e MemTotal /proc/meminfo
  cat /sys/devices/system/cpu/cpu0/topology/thread_siblings_list; } > $O/machine.txt 2>&1
grep -E "Model name|Thread|Core|Socket|NUMA|L3|thp|node" $O/machine.txt
for q in IQ3_XXS Q4_K; do
  for r in 1 2; do
    for pin in 0 1; do
      el "team vs regions $q pin=$pin run $r"
      STRATA_POOL_PIN=$pin timeout 150 python3 bench/pool_team_ab.py --quant $q \
        --json $O/team-ab-$q-pin$pin-r$r.json 2>&1 | tail -3
    done
  done
done
tar -cf $OUT/fd.tar -C $O .
el "done"
