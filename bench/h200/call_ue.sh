#!/usr/bin/env bash
# Session 27, call UE: test_gpu_tier.py (the short-sequence test now 20 sequences a case, a 50%
# floor) three times on the card.
. bench/h200/lib.sh
for i in 1 2 3; do
  el "test_gpu_tier.py, run $i"
  timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_tier.py > $OUT/tier-r$i.txt 2>&1
  echo "rc=$?"; grep -E "AssertionError|passed|failed" $OUT/tier-r$i.txt | tail -3
done
el "done"
