#!/usr/bin/env bash
# Session 21, call OD: attn_dec_short with 512 threads and STRATA_DS_U rows in flight a lane
# (default 8; 4 as OC ran with 256 threads): kernel records against the split grids at 64-2048
# keys, its tests, then the 12-layer all-resident engine at a 256-token prompt (positions
# 256-320) A B B A, STRATA_GPU_DEC_SHORT=512 against 0. Outputs straight to $OUT, few files.
. bench/h200/lib.sh
M12=/tmp/q12.gguf
(setsid nohup python3 -m strata synth $M12 --shape qwen3-30b-a3b --quant IQ3_XXS --skew 1 \
  --layers 12 > /tmp/synth12.log 2>&1 < /dev/null &)
el "attention profile U=8 (default)"
timeout 80 python3 bench/h200/attn_dec_profile.py 64,256,512,768,1024,1536,2048 8,32,s \
  > $OUT/attn-dec-profile.txt 2>&1
echo "rc=$?"; grep "^ctx" $OUT/attn-dec-profile.txt | cut -c1-60
el "attention profile U=4"
STRATA_KERNEL_DEFINES="-DSTRATA_DS_U=4" timeout 60 python3 bench/h200/attn_dec_profile.py \
  64,256,512,768,1024 s >> $OUT/attn-dec-profile.txt 2>&1
echo "rc=$?"; grep "^ctx" $OUT/attn-dec-profile.txt | tail -5 | cut -c1-60
el "tests"
timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_decode.py \
  tests/test_gpu_kv_int8.py -k "short or attention_decode" > $OUT/tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/tests.txt | tail -8
for _ in $(seq 1 40); do [ -f $M12 ] && ! pgrep -f "strata synth" > /dev/null && break; sleep 2; done
el "model: $(ls -la $M12 2>&1 | tail -1)"
for arm in 512 0 0 512; do
  el "all-gpu p=256 short=$arm"
  STRATA_GPU_DEC_SHORT=$arm timeout 60 python3 -m strata.bench --arm all-gpu --model $M12 \
    --vram-budget-widen --vram-budget-mib 40000 -p 256 -n 64 -r 3 >> $OUT/engine-ab.txt 2>&1
  echo "rc=$?"; grep -E "^all-gpu" $OUT/engine-ab.txt | tail -1
done
el "done"
