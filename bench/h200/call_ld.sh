#!/usr/bin/env bash
# Session 18, call LD (the final kernel code): the llama.cpp build started in the background
# (for the side-by-side, call LE), the model and pack too; the whole GPU suite; then the wait for
# the build.
. bench/h200/lib.sh
O=/tmp/ldout; rm -rf $O && mkdir -p $O
python3 scripts/llama_side_by_side.py build --background --jobs 12 2>&1 | tail -2
(setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &)
el "gpu tests (prep and the llama.cpp build in the background)"
timeout 360 python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > $O/gpu-tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-tests.txt | tail -12
el "prep: $(tail -1 /tmp/prep.log)"
timeout 200 python3 scripts/llama_side_by_side.py wait --timeout 190 2>&1 | tail -2
cp $O/*.txt $OUT/
el "done"
