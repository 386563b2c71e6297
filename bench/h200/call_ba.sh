#!/usr/bin/env bash
# Session 8, call BA: the bulk-copy T = 1 GEMV (gemv1b_*) on the card: its GPU tests (bit-equal
# to gemv1w_*), the GEMV sweep (split / staged / bulk[R] at attn_q, attn_kv, attn_o, graph and
# graph+PDL), the all-resident decode with STRATA_GEMV1_VARIANT=split against bulk, alternating,
# twice, the gpu-kernels arm on bulk; then the CPU kernels' compute ceiling with all 16 cores
# busy (each on its own L2-resident copy) against one core.
. bench/h200/lib.sh
O=/tmp/baout; rm -rf $O && mkdir -p $O
start_model
el "GPU tests (GEMV)"
timeout 240 python3 -m pytest -q -m gpu tests/test_gpu_decode.py tests/test_gpu_kernels.py \
  -k "gemv1w or staged_and_plain or gemv" -p no:cacheprovider > $O/gpu-tests-gemv.txt 2>&1
echo "rc=$?"; tail -2 $O/gpu-tests-gemv.txt
el "GEMV sweep"
timeout 200 python3 bench/experts_decode_sweep.py --no-experts --builds fast+smem \
  --quants IQ3_XXS,Q4_K,Q8_0,IQ2_XXS,IQ1_M \
  --gemv-variants split,staged,bulk,bulk4,bulk16 --gemv-shapes attn_q,attn_kv,attn_o \
  --json $O/gemv-sweep.json > $O/gemv-sweep.txt 2>&1
echo "rc=$?"; grep -E "^gemv1.*attn_q|rror" $O/gemv-sweep.txt | head -40
wait_model || { el "model not ready"; tar -cf $OUT/ba.tar -C $O .; exit 1; }
for r in 1 2; do
  for v in split bulk; do
    el "all-gpu $v run $r"
    STRATA_GEMV1_VARIANT=$v timeout 75 python3 -m strata.bench --arm all-gpu --model $M \
      --vram-budget-widen --vram-budget-mib 40000 -p 512 -n 128 -r 3 \
      --json $O/all-gpu-$v-r$r.json 2>&1 | grep -E "^all-gpu|Error" | tail -1
  done
done
el "gpu-kernels bulk"
STRATA_GEMV1_VARIANT=bulk timeout 150 python3 -m strata.bench --arm gpu-kernels \
  --json $O/gpu-kernels-bulk.json > $O/gpu-kernels-bulk.txt 2>&1
echo "rc=$?"; grep -E "rror|layer decode" $O/gpu-kernels-bulk.txt | head -3
el "CPU ceilings on 16 cores"
timeout 200 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS,Q4_K,IQ1_M,IQ2_XXS,Q8_0 --layout-ab repack,gguf \
  --ceiling-only --ceiling-threads 16 --out $O/ceil16 2>&1 | tail -16
tar -cf $OUT/ba.tar -C $O .
el "done"
