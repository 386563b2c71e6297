#!/usr/bin/env bash
# Session 8, call BF, at the session's final CPU code: the cpu-pool arm command for IQ3_XXS
# at T = 1 (the default layout: pm on this host), then lut4 / pm / GGUF bytes interleaved at T = 1.
. bench/h200/lib.sh
O=/tmp/bfout; rm -rf $O && mkdir -p $O
el "cpu-pool arm"
timeout 100 python3 -m strata.bench --arm cpu-pool --shape qwen3-30b-a3b --quant IQ3_XXS -t 1 \
  --json $O/arm-iq3-t1.json > $O/arm-iq3-t1.txt 2>&1
echo "rc=$?"; tail -4 $O/arm-iq3-t1.txt
el "layouts T=1"
timeout 120 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS --threads 16 --tokens 1 \
  --layout-ab lut4,pm,gguf --out $O/pool-iq3-t1 2>&1 | grep -A4 "^quant " | tail -4
tar -cf $OUT/bf.tar -C $O .
el "done"
