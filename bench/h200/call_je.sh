#!/usr/bin/env bash
# Session 16, call JE: the T = 1 GEMVs as the engine now launches them against session 15's
# form (gemv_pdl_ab.py); the decode and graph GPU tests; all-resident decode (40000 MiB) with
# the new GEMVs, with 4 warps a block, with session 15's GEMV form, and with every kernel's entry
# trigger left out (STRATA_PDL_ENTRY_TRIGGER=0), arms in the order A B C D D C B A.
. bench/h200/lib.sh
O=/tmp/jeout; rm -rf $O && mkdir -p $O
(setsid nohup bash bench/h200/prep.sh > /tmp/prep.log 2>&1 < /dev/null &)
el "gemv a/b (prep in the background)"
timeout 150 python3 bench/h200/gemv_pdl_ab.py > $O/gemv-pdl-ab.txt 2>&1; echo "rc=$?"
grep -v "graph  " $O/gemv-pdl-ab.txt | tail -30
el "gpu tests: decode, graph"
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_decode.py \
  tests/test_gpu_graph.py > $O/gpu-tests.txt 2>&1
echo "rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" $O/gpu-tests.txt | tail -8
el "waiting for the model"
for _ in $(seq 1 150); do grep -q MODEL-DONE /tmp/prep.log && break; sleep 2; done; tail -1 /tmp/prep.log
run_arm() {  # name, then env assignments
  local name=$1; shift
  el "all-gpu $name"
  env "$@" timeout 120 python3 -m strata.bench --arm all-gpu --model $M --vram-budget-widen \
    --vram-budget-mib 40000 -p 512 -n 128 -r 3 --json $O/all-gpu-$name-$SECONDS.json \
    > /dev/null 2>&1; echo "rc=$?"
}
for a in now w4 s15 notrig notrig s15 w4 now; do
  case $a in
    now) run_arm now STRATA_KERNEL_DEFINES= ;;
    w4) run_arm w4 STRATA_GPU_GEMV1_WARPS=4 ;;
    s15) run_arm s15 STRATA_GPU_GEMV1_WARPS=4 STRATA_KERNEL_DEFINES=-DSTRATA_GEMV_PDL_SPLIT=0 ;;
    notrig) run_arm notrig STRATA_KERNEL_DEFINES=-DSTRATA_PDL_ENTRY_TRIGGER=0 ;;
  esac
done
python3 - $O <<'PY'
import glob, json, sys
for p in sorted(glob.glob(sys.argv[1] + "/all-gpu-*.json")):
    r = json.load(open(p))["results"][0]
    print(p.rsplit("/", 1)[1], {k: round(r[k], 2) for k in ("prefill_tps", "decode_tps")})
PY
tar -cf $OUT/je.tar -C $O .
el "done"
