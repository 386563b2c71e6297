#!/usr/bin/env bash
# Session 31, call XJ: call XI cut to the device time left (about 240 s): a 12-layer
# Qwen3-30B-A3B-shaped model, every tensor but the embedding IQ2_S, the all-resident engine with
# IQ2_S's grid codes (the default) against its grid bytes and 4 warps (session 30's), A B B A
# as far as the time allows (each arm's JSON saved as it ends).
. bench/h200/lib.sh
O=/tmp/xj; rm -rf $O; mkdir -p $O
save() { tar -czf $OUT/xj.tgz -C $O .; }
M=/tmp/q12-iq2s.gguf
el "synth IQ2_S, 12 layers"
python3 -m strata synth $M --shape qwen3-30b-a3b --layers 12 --quant IQ2_S --dense-quant IQ2_S \
  --skew 1 > $O/synth.txt 2>&1 || { tail -3 $O/synth.txt; save; exit 1; }
BYTES="-DSTRATA_GRID_CODES=536870912 -DSTRATA_GEMV1_SMEM_FMTS=536870912"
run_arm iq2s-bytes-a STRATA_KERNEL_DEFINES="$BYTES" STRATA_GPU_GEMV1_WARPS=4
save
run_arm iq2s-codes-b STRATA_X=0
save
run_arm iq2s-codes-c STRATA_X=0
save
run_arm iq2s-bytes-d STRATA_KERNEL_DEFINES="$BYTES" STRATA_GPU_GEMV1_WARPS=4
save
el "done"
