#!/usr/bin/env bash
# Session 23, call QC: QB's cp.async sums dropped; the split sums a row batch of 16 with teams of
# 16 (STRATA_DEC_SUM_U, STRATA_DEC_TEAM) against 8 / 8, with the acq_rel counters and the
# fences; the whole GPU suite at this commit; the 48-layer model all resident at positions
# 4096-4224 against session 22's forms (teams of 8, rows 8, fences), A B A.
. bench/h200/lib.sh
O=/tmp/qcout; rm -rf $O && mkdir -p $O
start_model
OLD="-DSTRATA_ARRIVE_FENCES=1 -DSTRATA_DEC_TEAM=8 -DSTRATA_DEC_SUM_U=8"
el "attention arms"
for d in "" "-DSTRATA_DEC_SUM_U=8" "-DSTRATA_DEC_TEAM=8 -DSTRATA_DEC_SUM_U=8" "$OLD"; do
  echo "== defines: ${d:-none}" >> $O/attn-arms.txt
  STRATA_KERNEL_DEFINES="$d" timeout 60 python3 bench/h200/attn_dec_profile.py 1024,4096,16384,32768 \
    >> $O/attn-arms.txt 2>&1
  echo "rc=$?"
done
grep -E "^==|^ctx" $O/attn-arms.txt | cut -c1-200
el "gpu suite"
timeout 280 python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > $O/gpu-suite.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-suite.txt | tail -8
wait_model; el "model ready: $?"
for arm in new old new; do
  if [ $arm = old ]; then export STRATA_KERNEL_DEFINES="$OLD"; else unset STRATA_KERNEL_DEFINES; fi
  el "all-gpu $arm"
  timeout 50 python3 -m strata.bench --arm all-gpu --model $M --vram-budget-widen \
    --vram-budget-mib 40000 -p 4096 -n 128 -r 3 --json $O/all-gpu-$arm-$(( $(date +%s) - T0 )).json \
    >> $O/engine-ab.txt 2>&1
  echo "rc=$?"; grep -E "^all-gpu " $O/engine-ab.txt | tail -1
done
unset STRATA_KERNEL_DEFINES
cp $O/* $OUT/ 2>/dev/null
el "done"
