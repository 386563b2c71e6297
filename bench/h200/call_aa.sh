#!/usr/bin/env bash
# Session 7's first call. 1. The new decode kernels' GPU tests (gemv1r{R}_*, moe_gate_up_r{R}).
# 2. The decode sweep: T = 1 GEMV variants (R rows a warp, block sizes, warps a row) at the
#    attention and single-expert shapes, and the MoE gate/up r2/r4 against legacy, default build.
# 3. The gpu-kernels arm twice: one run of it hit an illegal address in sessions 5 and 6;
#    ae4679d made it wait for its default-stream uploads before timing on its non-blocking
#    stream (the likely cause). 4. The CPU pool at T = 1 (call Z2's pool runs came on a
#    disturbed host). Outputs go to one tarball (the run returns 8 files).
. bench/h200/lib.sh
O=/tmp/aaout; rm -rf $O && mkdir -p $O
el "gpu tests (new decode kernels)"
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_decode.py \
  tests/test_gpu_kernels.py -k "gemv1 or moe" > $O/pytest-gpu-subset.txt 2>&1
echo "rc=$?"; tail -2 $O/pytest-gpu-subset.txt
el "decode sweep"
timeout 200 python3 bench/experts_decode_sweep.py --builds fast+smem \
  --quants Q8_0,Q4_K,Q6_K,IQ4_XS,IQ3_XXS,IQ2_XXS,IQ1_M \
  --moe-variants legacy+legacy,r2+legacy,r4+legacy,st1+legacy,r2+st,r4+st \
  --gemv-shapes attn_q,attn_kv,attn_o,expert_gate,expert_down \
  --gemv-variants split,r1w8,r2w4,r4w4,r2w8,r4w8,r2w4p2,r4w8p2,r1w8p4,r2w8p4,rows \
  --json $O/decode-sweep.json > $O/decode-sweep.txt 2>&1
echo "rc=$?"; tail -3 $O/decode-sweep.txt
for r in 1 2; do
  el "gpu-kernels run $r"
  timeout 150 python3 -m strata.bench --arm gpu-kernels --json $O/gpu-kernels-r$r.json > $O/gpu-kernels-r$r.txt 2>&1
  echo "rc=$?"; grep -E "rror|layer decode\+pdl" $O/gpu-kernels-r$r.txt | head -3
done
for q in "IQ3_XXS repack,gguf" "IQ1_M repack,gguf" "Q4_K gguf"; do
  set -- $q
  el "pool $1 ($2)"
  timeout 80 python3 bench/cpu_pool_sweep.py --quant $1 --threads 16 --tokens 1 --layout-ab $2 \
    --out $O/pool-$1 2>&1 | grep -A4 "^quant " | tail -3
done
tar -cf $OUT/aa.tar -C $O .
el "done"
