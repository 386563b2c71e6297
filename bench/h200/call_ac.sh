#!/usr/bin/env bash
# Session 7, call AC, at the session's final GPU code: the GPU suite; the all-resident decode on
# the Qwen3-30B-A3B-shaped IQ3_XXS model, the new per-type MoE default (st1+legacy for IQ3_XXS)
# against the old one (STRATA_MOE_VARIANT=legacy+legacy), alternating, twice; the gpu-kernels
# arm (its layer now on st1); the CPU pool at T = 1 for IQ3_XXS if the host is quiet.
. bench/h200/lib.sh
O=/tmp/acout; rm -rf $O && mkdir -p $O
start_model
el "GPU suite"
timeout 300 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider > $O/gpu-tests.txt 2>&1
echo "rc=$?"; tail -2 $O/gpu-tests.txt
wait_model || { el "model not ready"; tar -cf $OUT/ac.tar -C $O .; exit 1; }
for r in 1 2; do
  for arm in legacy default; do
    el "all-gpu $arm run $r"
    v=""; [ $arm = legacy ] && v=legacy+legacy
    STRATA_MOE_VARIANT=$v timeout 75 python3 -m strata.bench --arm all-gpu --model $M \
      --vram-budget-widen --vram-budget-mib 40000 -p 512 -n 128 -r 3 \
      --json $O/all-gpu-$arm-r$r.json 2>&1 | grep -E "^all-gpu|Error" | tail -1
  done
done
el "gpu-kernels"
timeout 150 python3 -m strata.bench --arm gpu-kernels --json $O/gpu-kernels.json > $O/gpu-kernels.txt 2>&1
echo "rc=$?"; grep -E "rror|layer decode\+pdl" $O/gpu-kernels.txt | head -3
el "pool IQ3_XXS"
timeout 80 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS --threads 16 --tokens 1 --layout-ab repack,gguf \
  --out $O/pool-IQ3_XXS 2>&1 | grep -A4 "^quant " | tail -3
tar -cf $OUT/ac.tar -C $O .
el "done"
