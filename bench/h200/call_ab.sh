#!/usr/bin/env bash
# Session 7, call AB. 1. The decode sweep, default build against the row-prefetch builds
#    (STRATA_ROW_PREFETCH=1 / 2: every decode warp prefetches its rows' lines into L1 / L2 first),
#    MoE legacy / st1 / r4 gate-up, T = 1 GEMV at the attention shapes (the model is synthesized
#    meanwhile). 2. The all-resident decode on the Qwen3-30B-A3B-shaped IQ3_XXS model: the default
#    against the prefetch builds (STRATA_KERNEL_DEFINES) and the MoE gate/up st1 and r4
#    (STRATA_MOE_VARIANT), one run each, the default first and last (drift).
. bench/h200/lib.sh
O=/tmp/about; rm -rf $O && mkdir -p $O
start_model
el "decode sweep"
timeout 200 python3 bench/experts_decode_sweep.py --builds fast+smem,pf-l1,pf-l2 \
  --quants IQ3_XXS,Q4_K,Q8_0,Q6_K --moe-variants legacy+legacy,st1+legacy,r4+legacy \
  --gemv-shapes attn_q,attn_kv,attn_o --gemv-variants split \
  --json $O/decode-sweep-pf.json > $O/decode-sweep-pf.txt 2>&1
echo "rc=$?"; grep -A40 "^summed" $O/decode-sweep-pf.txt
wait_model || { el "model not ready"; tar -cf $OUT/ab.tar -C $O .; exit 1; }
run_arm() {  # name, then env assignments
  local name=$1; shift
  el "all-gpu $name"
  env "$@" timeout 75 python3 -m strata.bench --arm all-gpu --model $M --vram-budget-widen \
    --vram-budget-mib 40000 -p 512 -n 128 -r 3 --json $O/all-gpu-$name.json 2>&1 \
    | grep -E "^all-gpu|Error" | tail -1
}
run_arm default-1 STRATA_X=0
run_arm pf-l1 STRATA_KERNEL_DEFINES=-DSTRATA_ROW_PREFETCH=1
run_arm pf-l2 STRATA_KERNEL_DEFINES=-DSTRATA_ROW_PREFETCH=2
run_arm moe-st1 STRATA_MOE_VARIANT=st1+legacy
run_arm moe-r4 STRATA_MOE_VARIANT=r4+legacy
run_arm default-2 STRATA_X=0
tar -cf $OUT/ab.tar -C $O .
el "done"
