#!/usr/bin/env bash
# Session 20, call ND: attention_decode's split shape swept (bench/h200/attn_dec_sweep.py:
# min_chunk x nsplit at 512-32K keys of a 32K cache), and its tests at two other min_chunk
# values (STRATA_GPU_DEC_MIN_CHUNK) so a new default is a tested one.
. bench/h200/lib.sh
O=/tmp/ndout; rm -rf $O && mkdir -p $O
el "sweep"
timeout 150 python3 bench/h200/attn_dec_sweep.py > $O/attn-dec-sweep.txt 2>&1
echo "rc=$?"; cat $O/attn-dec-sweep.txt
for mc in 256 1024; do
  el "decode attention tests, min_chunk $mc"
  STRATA_GPU_DEC_MIN_CHUNK=$mc timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider \
    tests/test_gpu_decode.py tests/test_gpu_kv_int8.py -k "attention_decode" > $O/tests-mc$mc.txt 2>&1
  echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/tests-mc$mc.txt | tail -4
done
cp $O/* $OUT/ 2>/dev/null
el "done"
