#!/usr/bin/env bash
# Session 3, call I: CPU pool repack vs gather kernels on the 16 cores (GPU idle), then the engine
# arms: all-gpu (every expert resident), car-on and all-cpu at 10240 MiB with prefill offload
# (default) and, for all-cpu, without it.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
bash bench/h200/prep.sh >> /tmp/prep.log 2>&1; tail -1 /tmp/prep.log
el "pool: repack (default) vs gguf gather kernels"
timeout 150 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS,IQ2_XXS,IQ1_M,Q4_K --threads 16 --tokens 1 \
  --out $OUT/pool-repack 2>&1 | grep -A12 "^shape" | tail -6
timeout 120 python3 bench/cpu_pool_sweep.py --quant IQ3_XXS,IQ2_XXS,IQ1_M --threads 16 --tokens 1 \
  --layout gguf --out $OUT/pool-gather 2>&1 | grep -A12 "^shape" | tail -5
el "all-gpu (default kernels)"
timeout 100 python3 -m strata.bench --arm all-gpu --model /tmp/q30.gguf --vram-budget-widen \
  --vram-budget-mib 40000 -p 512 -n 128 -r 3 --json $OUT/all-gpu.json 2>&1 | grep -v "it/s\]$" | tail -3
# the fastest correct default-build variants of call H's sweep (IQ3_XXS experts at T=1; GEMV
# summed over the attention shapes), set by environment for a second all-gpu run
eval "$(python3 - <<'PY'
import json
try:
    d = json.load(open("/tmp/experts-sweep.json"))
except OSError:
    raise SystemExit
ex = [r for r in d["experts"] if r["qtype"] == "IQ3_XXS" and r.get("T") == 1 and r["build"] == "base" and r["ok"]]
if ex:
    print("export STRATA_MOE_VARIANT=" + min(ex, key=lambda r: r["us"])["variant"])
tot = {}
for r in d["gemv"]:
    if r["build"] == "base":
        t = tot.setdefault(r["variant"], [0.0, True]); t[0] += r["us"]; t[1] &= r["ok"]
ok = {v: t[0] for v, t in tot.items() if t[1]}
if ok:
    print("export STRATA_GEMV1_VARIANT=" + min(ok, key=ok.get))
PY
)"
el "all-gpu with STRATA_MOE_VARIANT=${STRATA_MOE_VARIANT:-} STRATA_GEMV1_VARIANT=${STRATA_GEMV1_VARIANT:-}"
timeout 100 python3 -m strata.bench --arm all-gpu --model /tmp/q30.gguf --vram-budget-widen \
  --vram-budget-mib 40000 -p 512 -n 128 -r 3 --json $OUT/all-gpu-variant.json 2>&1 | grep -v "it/s\]$" | tail -3
el "car-on, all-cpu (prefill offload auto)"
timeout 150 python3 -m strata.bench --arm car-on --arm all-cpu --model /tmp/q30.gguf --pack /tmp/q30-pack \
  --calibrate -p 512 -n 128 -r 2 --json $OUT/arms.json 2>&1 | grep -v "it/s\]$" | tail -6
el "all-cpu, prefill offload off"
timeout 100 python3 -m strata.bench --arm all-cpu --model /tmp/q30.gguf --pack /tmp/q30-pack \
  --prefill-offload off -p 512 -n 32 -r 1 --json $OUT/all-cpu-off.json 2>&1 | grep -v "it/s\]$" | tail -4
el "done"
