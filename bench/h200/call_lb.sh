#!/usr/bin/env bash
# Session 18, call LB: the whole GPU suite at this commit (a prompt's pairs grouped on the card,
# group_pairs.cu; Q8_0 / IQ3_XXS quants read as funnel-shifted aligned words,
# STRATA_WORD_LOADS), then the word loads against the 16-bit loads: the dense prompt GEMM
# (bench/h200/mma_xstage_ab.py) and the T = 1 GEMVs + MoE layer (bench/h200/decode_reg_ab.py).
# Model and pack prepared meanwhile (for call LC).
. bench/h200/lib.sh
O=/tmp/lbout; rm -rf $O && mkdir -p $O
(setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &)
el "gpu tests"
timeout 360 python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > $O/gpu-tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-tests.txt | tail -12
el "dense A/B words"
timeout 80 python3 bench/h200/mma_xstage_ab.py Q8_0,IQ3_XXS attn_q,attn_o -DSTRATA_WORD_LOADS=0 \
  > $O/mma-words-ab.txt 2>&1; echo "rc=$?"; cat $O/mma-words-ab.txt
el "decode A/B words"
timeout 100 python3 bench/h200/decode_reg_ab.py Q8_0,IQ3_XXS -DSTRATA_WORD_LOADS=0 \
  > $O/decode-words-ab.txt 2>&1; echo "rc=$?"; tail -14 $O/decode-words-ab.txt
cp $O/*.txt $OUT/
el "done $(tail -1 /tmp/prep.log)"
