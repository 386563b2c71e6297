#!/usr/bin/env bash
# Session 21, call OC: the one-launch decode attention for short positions (attention.cu
# attn_dec_short: a block per query head over every key; dec_grid_for picks it up to
# STRATA_GPU_DEC_SHORT keys, default 1024). The decode / int8 / graph test files, the kernel
# records against the split grids at 64-4096 keys (attn_dec_profile.py), then the 12-layer
# all-resident engine A B B A against STRATA_GPU_DEC_SHORT=0. Outputs straight to $OUT, few files.
. bench/h200/lib.sh
M12=/tmp/q12.gguf
(setsid nohup python3 -m strata synth $M12 --shape qwen3-30b-a3b --quant IQ3_XXS --skew 1 \
  --layers 12 > /tmp/synth12.log 2>&1 < /dev/null &)
el "attention profile"
timeout 120 python3 bench/h200/attn_dec_profile.py 64,256,512,1024,1536,2048,4096 0,8,32,s \
  > $OUT/attn-dec-profile.txt 2>&1
echo "rc=$?"; grep "^ctx" $OUT/attn-dec-profile.txt | cut -c1-60
el "tests"
timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_decode.py \
  tests/test_gpu_kv_int8.py tests/test_gpu_graph.py > $OUT/tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/tests.txt | tail -8
for _ in $(seq 1 40); do [ -f $M12 ] && ! pgrep -f "strata synth" > /dev/null && break; sleep 2; done
el "model: $(ls -la $M12 2>&1 | tail -1)"
for arm in short off off short; do
  el "all-gpu p=512 $arm"
  if [ $arm = off ]; then export STRATA_GPU_DEC_SHORT=0; else unset STRATA_GPU_DEC_SHORT; fi
  timeout 60 python3 -m strata.bench --arm all-gpu --model $M12 --vram-budget-widen \
    --vram-budget-mib 40000 -p 512 -n 64 -r 3 >> $OUT/engine-ab.txt 2>&1
  echo "rc=$?"; grep -E "^all-gpu" $OUT/engine-ab.txt | tail -1
done
unset STRATA_GPU_DEC_SHORT
el "done"
