#!/usr/bin/env bash
# Session 17, call KB (CPU only, the card idle; after KA's prep has finished): the AVX-512 CPU
# kernel tests on the 16-core guest (session 16's IQ2_S kernel had run on the 2-vCPU Xeon only),
# then every format's pool on one Qwen3-30B-A3B decode layer at 16 threads.
. bench/h200/lib.sh
O=/tmp/kbout; rm -rf $O && mkdir -p $O
for _ in $(seq 1 60); do grep -q PREP-DONE /tmp/prep.log 2>/dev/null && break; sleep 3; done
el "prep: $(tail -1 /tmp/prep.log)"
lscpu | grep -E "Model name|^CPU\(s\)|Thread|Flags" | cut -c1-200 > $O/lscpu.txt
el "cpu avx512 tests"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_cpu_iq2s_avx512.py tests/test_cpu_iq1_avx512.py \
  tests/test_cpu_iq1_t2_avx512.py > $O/cpu-avx512-tests.txt 2>&1
echo "rc=$?"; tail -3 $O/cpu-avx512-tests.txt
el "pool sweep"
timeout 300 python3 bench/cpu_pool_sweep.py --threads 16 --tokens 1 --repeats 30 --wait-quiet \
  --out $O/cpu-pool-16core > $O/sweep.log 2>&1
echo "rc=$?"; tail -25 $O/cpu-pool-16core.md
cp $O/* $OUT/
el "done"
