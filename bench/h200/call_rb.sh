#!/usr/bin/env bash
# Session 24, call RB: the cluster decode kernel (attn_dec_cl: one launch, a thread-block cluster
# of STRATA_GPU_DEC_CL blocks a KV head) -- its tests, its time against the split grid and the
# short kernel at 769-16384 keys (8 and 16 blocks a cluster), the whole GPU suite, and the
# 48-layer engine all resident at positions 1024-1152 and 4096-4224 with and without it.
. bench/h200/lib.sh
O=/tmp/rbout; rm -rf $O && mkdir -p $O
start_model
el "decode attention tests"
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_decode.py \
  tests/test_gpu_kv_int8.py -k "attention" > $O/attn-tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed|Error" $O/attn-tests.txt | head -12
el "attention arms"
timeout 150 python3 bench/h200/attn_dec_profile.py 769,1024,2048,4096,8192,16384 0,c,c16,s \
  > $O/attn-arms.txt 2>&1
echo "rc=$?"; grep -E "^ctx|Error|error" $O/attn-arms.txt | cut -c1-150
el "gpu suite"
timeout 280 python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > $O/gpu-suite.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-suite.txt | tail -8
wait_model; el "model ready: $?"
for p in 1024 4096; do
  for arm in cl base cl; do
    if [ $arm = base ]; then export STRATA_GPU_DEC_CL=0; else export STRATA_GPU_DEC_CL=8; fi
    export STRATA_GPU_DEC_CL_KEYS=8192
    el "all-gpu p$p $arm"
    timeout 50 python3 -m strata.bench --arm all-gpu --model $M --vram-budget-widen \
      --vram-budget-mib 40000 -p $p -n 128 -r 3 --json $O/all-gpu-p$p-$arm-$(( $(date +%s) - T0 )).json \
      >> $O/engine-ab.txt 2>&1
    echo "rc=$?"; grep -E "^all-gpu " $O/engine-ab.txt | tail -1
  done
done
unset STRATA_GPU_DEC_CL STRATA_GPU_DEC_CL_KEYS
cp $O/* $OUT/ 2>/dev/null
el "done"
