#!/usr/bin/env bash
# Session 31, call XI: the all-resident engine on a Qwen3-30B-A3B-shaped IQ2_S model (experts,
# attention and lm_head all IQ2_S, so the GEMVs' gain and lm_head's 1.03x both count): IQ2_S's
# grid codes (the default since 8772b4a / 8f6eec6) against its grid bytes and 4 warps (session
# 30's defaults, through STRATA_KERNEL_DEFINES and STRATA_GPU_GEMV1_WARPS), A B B A; then the
# IQ3_XXS model at the final defaults (the 200 tok/s target).
# LAYERS=12 (call XJ, cut to fit about 240 s of device time): a 12-layer IQ2_S model and no
# IQ3_XXS run.
. bench/h200/lib.sh
O=/tmp/xi; rm -rf $O; mkdir -p $O
save() { tar -czf $OUT/xi.tgz -C $O .; }
L=${LAYERS:-48}
M2=/tmp/q$L-iq2s.gguf
[ "$L" = 48 ] && start_model
el "synth IQ2_S, $L layers"
python3 -m strata synth $M2 --shape qwen3-30b-a3b --layers $L --quant IQ2_S --dense-quant IQ2_S \
  --skew 1 > $O/synth.txt 2>&1 || { tail -3 $O/synth.txt; save; exit 1; }
BYTES="-DSTRATA_GRID_CODES=536870912 -DSTRATA_GEMV1_SMEM_FMTS=536870912"
M0=$M; M=$M2
run_arm iq2s-bytes-a STRATA_KERNEL_DEFINES="$BYTES" STRATA_GPU_GEMV1_WARPS=4
save
run_arm iq2s-codes-b STRATA_X=0
save
run_arm iq2s-codes-c STRATA_X=0
save
run_arm iq2s-bytes-d STRATA_KERNEL_DEFINES="$BYTES" STRATA_GPU_GEMV1_WARPS=4
save
[ "$L" = 48 ] || { el "done"; exit 0; }
M=$M0
wait_model || { el "no IQ3_XXS model"; exit 1; }
run_arm iq3xxs-default STRATA_X=0
save
el "done"
