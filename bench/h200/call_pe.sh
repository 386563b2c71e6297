#!/usr/bin/env bash
# Session 22, call PE: the graph tests (twice: fresh random prompts each run) after the traced
# test's eager engine routes its prompt on the host too.
. bench/h200/lib.sh
O=/tmp/peout; rm -rf $O && mkdir -p $O
for r in 1 2; do
  el "graph tests $r"
  timeout 110 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_graph.py >> $O/graph-tests.txt 2>&1
  echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/graph-tests.txt | tail -3
done
cp $O/* $OUT/ 2>/dev/null
el "done"
