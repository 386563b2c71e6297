#!/usr/bin/env bash
# Session 24, call RA: the whole GPU suite at this commit (session 23's final GPU code and its
# test mend, not yet run whole on the card); ncu's per-kernel table of two decode tokens at
# position ~4096 of the 48-layer model all resident; the engine's baseline at positions
# 4096-4224; the CPU pool's IQ1_M / Q4_K / IQ3_XXS decode layer on the 16 cores.
. bench/h200/lib.sh
O=/tmp/raout; rm -rf $O && mkdir -p $O
start_model
el "gpu suite"
timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider tests/ > $O/gpu-suite.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-suite.txt | tail -8
wait_model; el "model ready: $?"
el "all-gpu baseline"
timeout 60 python3 -m strata.bench --arm all-gpu --model $M --vram-budget-widen \
  --vram-budget-mib 40000 -p 4096 -n 128 -r 3 --json $O/all-gpu-base.json > $O/engine.txt 2>&1
echo "rc=$?"; grep -E "^all-gpu " $O/engine.txt | tail -1
el "ncu per-kernel table at ~4096"
timeout 150 ncu --clock-control none --cache-control none --profile-from-start off \
  --metrics gpu__time_duration.sum --csv --log-file $O/ncu-decode.csv \
  python3 scripts/profile_decode.py run --model $M --tokens 2 --prompt 4096 > $O/ncu-run.txt 2>&1
echo "rc=$?"; tail -2 $O/ncu-run.txt
python3 scripts/profile_decode.py report $O/ncu-decode.csv --tokens 2 > $O/ncu-decode.txt 2>&1
head -30 $O/ncu-decode.txt
el "cpu pool"
timeout 100 python3 bench/cpu_pool_sweep.py --quant IQ1_M,Q4_K,IQ3_XXS --threads 16 --tokens 1 \
  --repeats 30 --layout-ab repack,gguf --out $O/cpu-pool-16core > $O/cpu-pool.txt 2>&1
echo "rc=$?"; tail -14 $O/cpu-pool.txt
cp $O/* $OUT/ 2>/dev/null
el "done"
