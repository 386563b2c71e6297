#!/usr/bin/env bash
# Session 4, call M: router_topk lanes, MoE unrolls, block_sum shuffle: call L's steps (GPU tests,
# all-gpu after and before, ncu), then the gpu-kernels arm.
SIDES="after base" bash bench/h200/call_l.sh
. bench/h200/lib.sh
el "gpu-kernels arm"
timeout 150 python3 -m strata.bench --arm gpu-kernels --json $OUT/gpu-kernels.json 2>&1 | tail -40 > $OUT/gpu-kernels.txt
tail -40 $OUT/gpu-kernels.txt
el "done2"
