#!/usr/bin/env bash
# Session 27, call UA: what the guest's 16 vCPUs share (topology, a register-only loop on
# 1..16 threads), the cpu-pool arm (T = 1: IQ3_XXS, Q4_K, IQ1_M T2 and T7 with the
# served step; IQ3_XXS T = 512), and the pool's decode layer on 8 / 12 / 16 threads (IQ1_M T2,
# IQ3_XXS pm). Outputs tarred into one file.
. bench/h200/lib.sh
O=/tmp/uaout; rm -rf $O && mkdir -p $O
el "topology"
{ lscpu; echo; lscpu -e; echo; for c in 0 1 8 15; do
  echo "cpu$c siblings $(cat /sys/devices/system/cpu/cpu$c/topology/thread_siblings_list 2>/dev/null)"
  done; grep -m1 -E "^flags" /proc/cpuinfo | tr ' ' '\n' | grep -c . ; } > $O/topology.txt 2>&1
grep -E "Thread|Core|Socket|NUMA node\(|Model name|MHz" $O/topology.txt
el "register-only loop"
timeout 120 python3 bench/h200/alu_scaling.py --threads 1,2,4,8,12,16 --json $O/alu.json | tee $O/alu.md
arm() {  # tag quant tokens [env]
  el "cpu-pool arm $1"
  env ${4:-STRATA_X=0} timeout 150 python3 -m strata.bench --arm cpu-pool --shape qwen3-30b-a3b \
    --quant $2 -t $3 --json $O/arm-$1.json > $O/arm-$1.txt 2> $O/arm-$1.err
  echo "rc=$?"; grep -E "^qwen3|served" $O/arm-$1.txt | cut -c1-200
}
arm iq3-t1 IQ3_XXS 1
arm q4k-t1 Q4_K 1
arm iq1m-t2-t1 IQ1_M 1
arm iq1m-t7-t1 IQ1_M 1 STRATA_CPU_LAYOUT=IQ1_M=t7
arm iq3-t512 IQ3_XXS 512
el "threads 8, 12, 16"
timeout 200 python3 bench/cpu_pool_sweep.py --quant IQ1_M,IQ3_XXS --threads 8,12,16 --tokens 1 \
  --repeats 30 --out $O/threads > $O/threads.txt 2>&1
echo "rc=$?"; grep -E "^\| (IQ1_M|IQ3_XXS)" $O/threads.txt | head -20
tar czf $OUT/ua.tgz -C $O .
el "done"
