#!/usr/bin/env bash
# Session 21, call OB: decode attention with its loads ahead (attention.cu: STRATA_DEC_PREFETCH,
# the split's first keys asked of L2 before the PDL wait; STRATA_DEC_PV_AHEAD, attn_dec_pv's
# next tile loaded before this tile's math; the split partials read for every head at once).
# Its tests at the default and with both knobs off, the kernel records of both builds
# (attn_dec_profile.py), then a 12-layer all-resident engine A B B A against the knobs off at
# a 512- and an 8192-token prompt. Outputs straight to $OUT.
. bench/h200/lib.sh
M12=/tmp/q12.gguf
OFF="-DSTRATA_DEC_PREFETCH=0 -DSTRATA_DEC_PV_AHEAD=0"
(setsid nohup python3 -m strata synth $M12 --shape qwen3-30b-a3b --quant IQ3_XXS --skew 1 \
  --layers 12 > /tmp/synth12.log 2>&1 < /dev/null &)
T="tests/test_gpu_decode.py tests/test_gpu_kv_int8.py tests/test_gpu_graph.py"
el "tests default"
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider $T > $OUT/tests-default.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/tests-default.txt | tail -6
el "attention profile default / knobs off"
timeout 60 python3 bench/h200/attn_dec_profile.py 512,4096,32768 0,8 > $OUT/attn-dec-profile-new.txt 2>&1
echo "rc=$?"; grep "^ctx" $OUT/attn-dec-profile-new.txt
STRATA_KERNEL_DEFINES="$OFF" timeout 60 python3 bench/h200/attn_dec_profile.py 512,4096,32768 0,8 \
  > $OUT/attn-dec-profile-off.txt 2>&1
echo "rc=$?"; grep "^ctx" $OUT/attn-dec-profile-off.txt
el "tests knobs off"
STRATA_KERNEL_DEFINES="$OFF" timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider \
  tests/test_gpu_decode.py tests/test_gpu_kv_int8.py -k attention_decode > $OUT/tests-off.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/tests-off.txt | tail -6
for _ in $(seq 1 30); do [ -f $M12 ] && ! pgrep -f "strata synth" > /dev/null && break; sleep 2; done
el "model: $(ls -la $M12 2>&1 | tail -1)"
for p in 512 8192; do
  for arm in new off off new; do
    el "all-gpu p=$p $arm"
    if [ $arm = off ]; then export STRATA_KERNEL_DEFINES="$OFF"; else unset STRATA_KERNEL_DEFINES; fi
    f=$OUT/all-gpu-p$p-$arm-$SECONDS
    timeout 60 python3 -m strata.bench --arm all-gpu --model $M12 --vram-budget-widen \
      --vram-budget-mib 40000 -p $p -n 64 -r 3 --json $f.json > $f.txt 2>&1
    echo "rc=$?"; grep -hE "^all-gpu" $f.txt
  done
done
unset STRATA_KERNEL_DEFINES
el "done"
