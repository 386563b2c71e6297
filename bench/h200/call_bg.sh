#!/usr/bin/env bash
# Session 8, call BG: ncu's per-instruction (SASS) view of the T = 1 GEMV gemv1w_* at attn_q
# (4096 x 2048) for IQ3_XXS and Q4_K, full section set; the next session's starting data.
. bench/h200/lib.sh
O=/tmp/bgout; rm -rf $O && mkdir -p $O
el "ncu"
timeout 150 ncu --profile-from-start off -k regex:gemv1w --set full --import-source no -o $O/gemv1w \
  python3 scripts/profile_gemv.py --quants IQ3_XXS,Q4_K --shape attn_q > $O/ncu-run.txt 2>&1
echo "rc=$?"; tail -3 $O/ncu-run.txt
ncu --import $O/gemv1w.ncu-rep --page source --print-source sass --csv > $O/sass.csv 2> $O/sass.err
echo "source page rc=$? $(wc -l < $O/sass.csv) lines"; head -c 300 $O/sass.err
ncu --import $O/gemv1w.ncu-rep --page details --section WarpStateStats --section SourceCounters \
  --section Occupancy --section SpeedOfLight > $O/details.txt 2>&1
echo "details $(wc -l < $O/details.txt) lines"
tar -cf $OUT/bg.tar -C $O .
el "done"
