#!/usr/bin/env bash
# Session 17, call KA: the whole GPU suite at this commit (covers session 16's GPU-tier test of
# the prompt's resident-first order, run until now on the emulator only, and the register/SWAR
# decode + gemv1w's shared-memory grid), then the decode A/B (bench/h200/decode_reg_ab.py: the
# new decode against -DSTRATA_REG_DECODE=0 -DSTRATA_GEMV1_SMEM_GRID=0, one process). The model
# and pack for call KC are prepared in the background meanwhile.
. bench/h200/lib.sh
O=/tmp/kaout; rm -rf $O && mkdir -p $O
(setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &)
el "gpu tests"
timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > $O/gpu-tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-tests.txt | tail -12
cp $O/gpu-tests.txt $OUT/
el "decode A/B"
timeout 220 python3 bench/h200/decode_reg_ab.py > $O/decode-reg-ab.txt 2>&1; echo "rc=$?"
cat $O/decode-reg-ab.txt | tail -40
cp $O/decode-reg-ab.txt $OUT/
el "prep: $(tail -1 /tmp/prep.log)"
el "done"
