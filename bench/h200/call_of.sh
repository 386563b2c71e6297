#!/usr/bin/env bash
# Session 21, call OF: the attention scripts on their shared setup (bench/h200/attn_cache.py) and
# the decode reference tests folded over both kernels (test_gpu_decode.py, short / splits).
. bench/h200/lib.sh
cd bench/h200
timeout 40 python3 attn_dec_profile.py 512 8,s 2>&1 | grep -v Warn | tee $OUT/attn-dec-profile.txt | grep -E "^ctx|Error"
timeout 30 python3 attn_dec_sweep.py 512 64 0 2>&1 | tee $OUT/attn-dec-sweep.txt | tail -2
cd ../..
timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_decode.py \
  -k "matches_reference or short" > $OUT/tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/tests.txt | tail -4
el "done"
