#!/usr/bin/env bash
# Session 12, call FE: are the host's buffers of one process of different speed (six 1 GiB
# buffers read one by one, bench/h200/buffer_reads.py)? Then the issue-#3 command twice for
# IQ3_XXS, Q4_K and IQ1_M (the pool on its team; the JSON now also gives the pool against a
# read of its own weight pages), and the whole GPU suite at the final code.
. bench/h200/lib.sh
O=/tmp/feout; rm -rf $O && mkdir -p $O
el "buffer reads"
timeout 120 python3 bench/h200/buffer_reads.py 2>&1 | tee $O/buffer-reads.txt
for r in 1 2; do
  for q in IQ3_XXS Q4_K IQ1_M; do
    el "issue command $q T=1 run $r"
    timeout 150 python3 -m strata.bench --arm cpu-pool --shape qwen3-30b-a3b --quant $q -t 1 \
      --json $O/cpu-pool-$q-t1-r$r.json 2>&1 | tail -2 | head -1
  done
done
el "GPU tests (whole suite)"
timeout 300 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider > $O/gpu-tests.txt 2>&1
echo "rc=$?"; grep -E "passed|failed|FAIL" $O/gpu-tests.txt | tail -6
tar -cf $OUT/fe.tar -C $O .
el "done"
