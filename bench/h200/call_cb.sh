#!/usr/bin/env bash
# Session 9, call CB: (1) the pool's dynamic schedule (units a thread from shared counters) against
# the static split, arms interleaved in one process, T = 1 on 16 threads for IQ3_XXS (pm), IQ1_M
# (t2), Q4_K; T = 8 for IQ3_XXS; (2) the cpu-pool command for the three formats; (3) the
# CPU pool tests on this host; (4) all-resident decode of a Q4_K-expert Qwen3-30B-A3B-shaped model
# (Q4_K dense too), base GPU code ($BASE, 51e5630) against this tree's wide loads, alternating.
. bench/h200/lib.sh
O=/tmp/cbout; rm -rf $O && mkdir -p $O
MK=/tmp/q30k.gguf
(setsid nohup python3 -m strata synth $MK --shape qwen3-30b-a3b --quant Q4_K --dense-quant Q4_K \
  --skew 1 > /tmp/synthk.log 2>&1 < /dev/null &)
for q in IQ3_XXS IQ1_M Q4_K; do
  el "pool T=1 $q: u=0 vs units"
  timeout 150 python3 bench/cpu_pool_sweep.py --quant $q --threads 16 --tokens 1 \
    --layout-ab repack@u=0,repack,repack@u=4,repack@u=16 --out $O/pool-units-$q-t1 2>&1 | sed -n '/^quant /,/^```/p;/^arm |/,$p'
done
el "pool T=8 IQ3_XXS"
timeout 150 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS --threads 16 --tokens 8 \
  --layout-ab repack@u=0,repack --out $O/pool-units-IQ3_XXS-t8 2>&1 | sed -n '/^quant /,/^```/p;/^arm |/,$p'
for q in IQ3_XXS IQ1_M Q4_K; do
  el "issue command $q"
  timeout 100 python3 -m strata.bench --arm cpu-pool --shape qwen3-30b-a3b --quant $q -t 1 \
    --json $O/cpu-pool-arm-$q-t1.json 2>&1 | tail -2
done
el "CPU pool tests"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_cpu_pool.py > $O/cpu-pool-tests.txt 2>&1
echo "rc=$?"; tail -2 $O/cpu-pool-tests.txt
for _ in $(seq 1 60); do [ -f $MK ] && ! pgrep -f "strata synth" > /dev/null && break; sleep 2; done
ls -la $MK; tail -2 /tmp/synthk.log
for r in 1 2; do
  for side in base new; do
    if [ $side = base ]; then d=$BASE; else d=$PWD; fi
    el "all-gpu Q4_K $side run $r"
    (cd $d && PYTHONPATH=/tmp/site:$d timeout 90 python3 -m strata.bench --arm all-gpu --model $MK \
      --vram-budget-widen --vram-budget-mib 40000 -p 512 -n 128 -r 3 \
      --json $O/all-gpu-q4k-$side-r$r.json 2>&1 | grep -E "^all-gpu|rror" | tail -2)
  done
done
tar -cf $OUT/cb.tar -C $O .
el "done"
