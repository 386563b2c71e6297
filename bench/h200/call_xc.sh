#!/usr/bin/env bash
# Session 30, call XC: calls XA and XB in one call's time (machines were scarce), the steps cut
# to fit: XA's GPU steps with shorter limits, then XB's cpu-pool arm for Q4_K and IQ1_M.
. bench/h200/lib.sh
export OUT
bash bench/h200/call_xa.sh
O=/tmp/xb; rm -rf $O; mkdir -p $O
save() { tar -czf $OUT/xb.tgz -C $O .; }
{ lscpu; grep -m1 -E "^flags" /proc/cpuinfo; } > $O/topology.txt 2>&1
for q in Q4_K IQ1_M; do
  el "cpu-pool arm $q"
  timeout 70 python3 -m strata.bench --arm cpu-pool --shape qwen3-30b-a3b --quant $q -t 1 \
    --json $O/arm-$q.json > $O/arm-$q.txt 2> $O/arm-$q.err
  echo "rc=$?"; grep -E "^qwen3|served|host read" $O/arm-$q.txt | cut -c1-200
  save
done
el "done"
