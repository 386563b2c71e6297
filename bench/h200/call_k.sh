#!/usr/bin/env bash
# Session 4, call K: host CPU flags + versions; the whole GPU test suite (last full run at
# be32cd9); per-kernel device time of an all-resident decode token under ncu.
. bench/h200/lib.sh
start_model
{ grep -o 'avx512[a-z_0-9]*\|amx[a-z_0-9]*\|gfni\|vaes' /proc/cpuinfo | sort -u | tr '\n' ' '; echo;
  grep -m1 'model name' /proc/cpuinfo; grep -m1 MHz /proc/cpuinfo;
  python3 -c "import numba, llvmlite, llvmlite.binding as b; print('numba', numba.__version__, 'llvmlite', llvmlite.__version__, 'llvm', b.llvm_version_info, b.get_host_cpu_name())"; } \
  | tee $OUT/host-cpu.txt
el "GPU tests"
timeout 330 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider -x -q 2>&1 | tee $OUT/gpu-tests.txt | tail -5
wait_model
el "ncu decode profile"
timeout 200 ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \
  --log-file $OUT/ncu-decode.csv python3 scripts/profile_decode.py run --model $M --tokens 2 2>&1 | tee /tmp/prof.log | tail -4
S=$(grep -o 'unprofiled step: [0-9.]*' /tmp/prof.log | awk '{print $3}')
python3 scripts/profile_decode.py report $OUT/ncu-decode.csv --tokens 2 --step-ms ${S:-0} | tee $OUT/ncu-report.txt | head -40
el "done"
