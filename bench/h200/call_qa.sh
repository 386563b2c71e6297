#!/usr/bin/env bash
# Session 23, call QA: (1) the guest's CPU facts (gather mitigation, topology); (2) where
# attn_dec_pv's fixed cost goes: bench/h200/ablate_dec_pv.patch applied to this copy, the
# profile at 1K / 4K / 32K with parts left out (STRATA_DEC_ABLATE: 1 no global max/sum read,
# 2 no split sums, 4 no slot reduction either, 8 no tiles; timing only), the source restored;
# (3) the adaptive-cache routed test repeated (its logit errors printed); (4) IQ1_M's layouts
# at 16 threads.
. bench/h200/lib.sh
O=/tmp/qaout; rm -rf $O && mkdir -p $O
el "cpu facts"
{ grep . /sys/devices/system/cpu/vulnerabilities/* ; lscpu; lscpu -e; } > $O/cpu-facts.txt 2>&1
grep -E "gather|Model name|Thread|Core|Socket|NUMA node0" $O/cpu-facts.txt | head -12
el "attention ablations"
cp strata/gpu/kernels/attention.cu /tmp/attention.cu.keep
{ patch -p1 < bench/h200/ablate_dec_pv.patch || git apply bench/h200/ablate_dec_pv.patch; } > /dev/null || { echo "patch failed"; exit 1; }
for a in 0 1 2 4 8; do
  echo "== STRATA_DEC_ABLATE=$a" >> $O/ablate.txt
  STRATA_KERNEL_DEFINES="-DSTRATA_DEC_ABLATE=$a" timeout 100 python3 bench/h200/attn_dec_profile.py \
    1024,4096,32768 >> $O/ablate.txt 2>&1
  echo "rc=$?"
done
grep -v Warn $O/ablate.txt | cut -c1-220
cp /tmp/attention.cu.keep strata/gpu/kernels/attention.cu
el "adaptive routed test x5"
for r in 1 2 3 4 5; do
  timeout 60 python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/test_gpu_graph.py \
    -k adaptive_cache_on_the_routed_step >> $O/adaptive.txt 2>&1
  echo "rc=$?"
done
grep -E "logit errors|passed|failed|assert" $O/adaptive.txt
el "IQ1_M layouts, 16 threads"
timeout 150 python3 bench/cpu_pool_sweep.py --quant IQ1_M,Q4_K --threads 16 --tokens 1 \
  --repeats 30 --layout-ab repack,gguf --out $O/cpu-iq1m-16core > $O/cpu-pool.txt 2>&1
echo "rc=$?"; tail -22 $O/cpu-pool.txt
cp $O/* $OUT/ 2>/dev/null
el "done"
