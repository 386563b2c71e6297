#!/usr/bin/env bash
# Session 29, call WA (the host's CPU side): what host this lease is, the IQ2_S lut4 repack's
# tests on an AVX-512 VBMI + VNNI host, IQ2_S's pool layer on its GGUF bytes (iq2s_avx512.py,
# the "auto" there) against lut4 (the AVX2 kernel) interleaved, and the cpu-pool arm at
# T = 1 for IQ3_XXS, Q4_K and IQ1_M (the #3 figure on this host).
. bench/h200/lib.sh
O=/tmp/waout; rm -rf $O && mkdir -p $O
el "topology"
{ lscpu; echo; nvidia-smi -L; grep -m1 -E "^flags" /proc/cpuinfo; } > $O/topology.txt 2>&1
grep -E "Thread|Core|Socket|NUMA node\(|Model name|MHz|GPU" $O/topology.txt
el "IQ2_S kernel tests"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_cpu_kernels.py -k "IQ2_S or iq2" \
  > $O/iq2s-tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/iq2s-tests.txt | tail -4
el "IQ2_S layer: gguf (avx512) against lut4, interleaved"
timeout 120 python3 bench/cpu_pool_sweep.py --quant IQ2_S --threads 16 --tokens 1 --repeats 40 \
  --layout-ab auto,IQ2_S=lut4 --out $O/iq2s-ab > $O/iq2s-ab.txt 2>&1
echo "rc=$?"; grep -A4 "calls interleaved" $O/iq2s-ab.txt | grep -E "^IQ2_S "
arm() {  # tag quant tokens [env]
  el "cpu-pool arm $1"
  env ${4:-STRATA_X=0} timeout 100 python3 -m strata.bench --arm cpu-pool --shape qwen3-30b-a3b \
    --quant $2 -t $3 --json $O/arm-$1.json > $O/arm-$1.txt 2> $O/arm-$1.err
  echo "rc=$?"; grep -E "^qwen3|served" $O/arm-$1.txt | cut -c1-220
}
arm iq1m-t1 IQ1_M 1
arm iq3-t1 IQ3_XXS 1
arm q4k-t1 Q4_K 1
arm iq2s-t1 IQ2_S 1
tar czf $OUT/wa.tgz -C $O .
el "done"
