#!/usr/bin/env bash
# Session 18, call LA: where the prompt's tensor-core kernels spend their cycles now (after
# session 17's x staging): ncu's full set and SASS view of dense_mma (Q8_0, IQ3_XXS at attn_q,
# 512 rows) and of one layer's moe_gate_up_mma / moe_down_mma in the all-gpu engine's prefill.
# (Ran at db5d846 as bench/h200/ncu_prefill.py, since folded into prefill_profile.py --ncu.)
. bench/h200/lib.sh
O=/tmp/laout; rm -rf $O && mkdir -p $O
start_model
SECS="--section WarpStateStats --section SourceCounters --section Occupancy --section SpeedOfLight \
  --section ComputeWorkloadAnalysis --section InstructionStats --section MemoryWorkloadAnalysis \
  --section LaunchStats"
report() {  # name
  ncu --import $O/$1.ncu-rep --page source --print-source sass --csv > $O/$1-sass.csv 2> /dev/null
  gzip $O/$1-sass.csv
  ncu --import $O/$1.ncu-rep --page details $SECS --print-details all > $O/$1-details.txt 2>&1
  grep -E "^  [a-z_]+|Duration|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issue Slots Busy|Compute \(SM\) Throughput|L1/TEX Cache Throughput|Executed Ipc A" $O/$1-details.txt | head -40
}
el "ncu dense"
timeout 150 ncu --profile-from-start off -k regex:dense_mma --set full --import-source no -o $O/dense \
  python3 scripts/profile_gemv.py --quants Q8_0,IQ3_XXS --shape attn_q --tokens 512 --time 30 > $O/dense-run.txt 2>&1
echo "rc=$?"; tail -3 $O/dense-run.txt; report dense
wait_model; el "model: $(ls -la $M | cut -c1-80)"
el "ncu moe"
timeout 240 ncu --profile-from-start off -k "regex:moe_(gate_up|down)_mma" -c 2 --set full --import-source no \
  -o $O/moe python3 bench/h200/prefill_profile.py $M 512 --ncu > $O/moe-run.txt 2>&1
echo "rc=$?"; tail -3 $O/moe-run.txt; report moe
tar -czf $OUT/la.tgz -C $O --exclude='*.ncu-rep' . ; cp $O/*-details.txt $OUT/
el "done"
