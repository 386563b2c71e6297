#!/usr/bin/env bash
# Session 23, call QB: attn_dec_pv's split sums by cp.async (all of a round's rows in flight)
# and the counters' acq_rel atomics (block_arrive_last) against the portable forms
# (-DSTRATA_DEC_SUM_REGS=1, -DSTRATA_ARRIVE_FENCES=1), each alone and both; the whole GPU suite;
# the 48-layer model all resident at positions 4096-4224, new against both old forms, A B A.
. bench/h200/lib.sh
O=/tmp/qbout; rm -rf $O && mkdir -p $O
start_model
el "attention arms"
for d in "" "-DSTRATA_ARRIVE_FENCES=1" "-DSTRATA_DEC_SUM_REGS=1" "-DSTRATA_ARRIVE_FENCES=1 -DSTRATA_DEC_SUM_REGS=1" ""; do
  echo "== defines: ${d:-none}" >> $O/attn-arms.txt
  STRATA_KERNEL_DEFINES="$d" timeout 60 python3 bench/h200/attn_dec_profile.py 1024,4096,16384,32768 \
    >> $O/attn-arms.txt 2>&1
  echo "rc=$?"
done
grep -E "^==|^ctx" $O/attn-arms.txt | cut -c1-200
el "gpu suite"
timeout 290 python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > $O/gpu-suite.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-suite.txt | tail -8
wait_model; el "model ready: $?"
for arm in new old new; do
  if [ $arm = old ]; then export STRATA_KERNEL_DEFINES="-DSTRATA_ARRIVE_FENCES=1 -DSTRATA_DEC_SUM_REGS=1"; else unset STRATA_KERNEL_DEFINES; fi
  el "all-gpu $arm"
  timeout 60 python3 -m strata.bench --arm all-gpu --model $M --vram-budget-widen \
    --vram-budget-mib 40000 -p 4096 -n 128 -r 3 --json $O/all-gpu-$arm-$(( $(date +%s) - T0 )).json \
    >> $O/engine-ab.txt 2>&1
  echo "rc=$?"; tail -2 $O/engine-ab.txt
done
unset STRATA_KERNEL_DEFINES
cp $O/* $OUT/ 2>/dev/null
el "done"
