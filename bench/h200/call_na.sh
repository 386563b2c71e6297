#!/usr/bin/env bash
# Prepared for the next session's first call (not run in session 19, whose device time ran out):
# the whole GPU suite at this commit (session 19's call MD reached 338 of its 425 tests before
# its 250 s limit), then the gpu-kernels arm's full table (every format's GEMVs against the
# run's copy, decode attention at 4K / 32K, the Qwen3-30B-A3B layer) for #4's record.
. bench/h200/lib.sh
O=/tmp/naout; rm -rf $O && mkdir -p $O
el "gpu suite"
timeout 420 python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > $O/gpu-tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-tests.txt | tail -12
el "gpu-kernels arm"
timeout 150 python3 -m strata.bench --arm gpu-kernels --json $O/gpu-kernels.json > $O/gpu-kernels.txt 2>&1
echo "rc=$?"; tail -30 $O/gpu-kernels.txt
cp $O/* $OUT/ 2>/dev/null
el "done"
