#!/usr/bin/env bash
# Session 20, call NB: the whole GPU suite at the session's final kernel code, then the T = 1
# GEMVs / MoE layer / prompt GEMM of the decode changes (sign masks, index permutes, word
# loads, the stepped GEMV loop) against the build with STRATA_SIGN_SPREAD=0 and
# STRATA_GEMV1_STEP=0 (bench/h200/decode_reg_ab.py, one process, arms interleaved).
. bench/h200/lib.sh
O=/tmp/nbout; rm -rf $O && mkdir -p $O
el "gpu suite"
timeout 440 python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > $O/gpu-tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-tests.txt | tail -12
el "decode A/B: now vs SIGN_SPREAD=0 GEMV1_STEP=0"
timeout 110 python3 bench/h200/decode_reg_ab.py IQ3_XXS,IQ3_S,IQ2_S,IQ2_XXS,Q6_K,IQ1_M \
  "-DSTRATA_SIGN_SPREAD=0 -DSTRATA_GEMV1_STEP=0" > $O/decode-nb-ab.txt 2>&1
echo "rc=$?"; tail -30 $O/decode-nb-ab.txt
cp $O/*.txt $OUT/ 2>/dev/null
el "done"
