#!/usr/bin/env bash
# Session 21, call OA: the whole GPU suite with the decode grids fitted to the position back in
# (cd55e7b, reverted in c3c20d9, brought back), their engine A/B (12-layer all-resident model,
# grids on against STRATA_GPU_DEC_GRIDS=0), then where attention_decode's time goes (CUPTI
# kernel records at 512 / 4K / 32K keys, bench/h200/attn_dec_profile.py). Outputs straight to $OUT.
. bench/h200/lib.sh
M12=/tmp/q12.gguf
(setsid nohup python3 -m strata synth $M12 --shape qwen3-30b-a3b --quant IQ3_XXS --skew 1 \
  --layers 12 > /tmp/synth12.log 2>&1 < /dev/null &)
el "attention profile"
timeout 90 python3 bench/h200/attn_dec_profile.py 512,4096,32768 0,8,32 > $OUT/attn-dec-profile.txt 2>&1
echo "rc=$?"; cat $OUT/attn-dec-profile.txt | cut -c1-400
el "gpu suite"
timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > $OUT/gpu-suite.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu-suite.txt | tail -8
for _ in $(seq 1 30); do [ -f $M12 ] && ! pgrep -f "strata synth" > /dev/null && break; sleep 2; done
el "model: $(ls -la $M12 2>&1 | tail -1)"
for arm in on off on off; do
  el "all-gpu grids $arm"
  if [ $arm = off ]; then export STRATA_GPU_DEC_GRIDS=0; else unset STRATA_GPU_DEC_GRIDS; fi
  timeout 50 python3 -m strata.bench --arm all-gpu --model $M12 --vram-budget-widen \
    --vram-budget-mib 40000 -p 512 -n 64 -r 3 --json $OUT/all-gpu-$arm-$SECONDS.json > $OUT/all-gpu-$arm-$SECONDS.txt 2>&1
  echo "rc=$?"; grep -hE "^all-gpu|tok/s" $OUT/all-gpu-$arm-*.txt | tail -2
done
el "done"
