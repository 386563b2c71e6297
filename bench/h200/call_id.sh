#!/usr/bin/env bash
# Session 15, call ID: where a prompt chunk's dense GEMM on the tensor cores (experts_mma.cu
# dense_mma, T = 512) waits: CUDA-event times at attn_q and attn_o for Q8_0 and IQ3_XXS (tiles
# of 64 and of 32 tokens), then ncu's full section set and SASS view of one launch each.
. bench/h200/lib.sh
O=/tmp/idout; rm -rf $O && mkdir -p $O
for nt in 64 32; do
  for shape in attn_q attn_o; do
    el "time nt=$nt $shape"
    STRATA_GPU_DENSE_MMA_NT=$nt timeout 60 python3 scripts/profile_gemv.py --quants Q8_0,IQ3_XXS \
      --shape $shape --tokens 512 --time 50 2>&1 | tail -2
  done
done
el "ncu"
timeout 200 ncu --profile-from-start off -k regex:dense_mma --set full --import-source no -o $O/dense \
  python3 scripts/profile_gemv.py --quants Q8_0,IQ3_XXS --shape attn_q --tokens 512 > $O/ncu-run.txt 2>&1
echo "rc=$?"; tail -3 $O/ncu-run.txt
ncu --import $O/dense.ncu-rep --page source --print-source sass --csv > $O/sass.csv 2> $O/sass.err
echo "source page rc=$? $(wc -l < $O/sass.csv) lines"; gzip $O/sass.csv
ncu --import $O/dense.ncu-rep --page details --section WarpStateStats --section SourceCounters \
  --section Occupancy --section SpeedOfLight --section ComputeWorkloadAnalysis \
  --section MemoryWorkloadAnalysis --section LaunchStats > $O/details.txt 2>&1
echo "details $(wc -l < $O/details.txt) lines"
grep -E "Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Stall|Warp Cycles Per Issued|Issue Slots Busy|Compute \(SM\) Throughput|Memory Throughput|Block Limit" $O/details.txt | head -40
tar -cf $OUT/id.tar -C $O .
el "done"
