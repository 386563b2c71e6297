#!/usr/bin/env bash
# Issue 47's Must-show rows on the GPU machine (one H100 or H200 + 16 cores), one step a call
# (each under the 10-minute limit), from the repo root, with .llama carried:
#
#   scripts/gpu-hybrid-47.sh build          # llama-bench (CUDA) in the background, returns
#   scripts/gpu-hybrid-47.sh synth-h93      # Qwen3-30B-A3B-shaped Q4_K, usage entropy 0.93
#   scripts/gpu-hybrid-47.sh synth-uniform  # the same shape and quant, uniform routing (skew 0)
#   scripts/gpu-hybrid-47.sh llama h93      # llama.cpp: all-GPU, --cpu-moe, best fitting --n-cpu-moe
#   scripts/gpu-hybrid-47.sh strata h93     # Strata at 10240 MiB: car-off (CAR off, no profile,
#                                           # no calibration, the server's defaults) and all-cpu
#   scripts/gpu-hybrid-47.sh card h93       # Strata every expert on the card; writes the report
#   scripts/gpu-hybrid-47.sh split h93      # car-off decoding eager: misses a window in the pool
#                                           # and over PCIe, link/gather GB/s, pool GB/s vs host
#   scripts/gpu-hybrid-47.sh llama uniform; scripts/gpu-hybrid-47.sh strata uniform
#   scripts/gpu-hybrid-47.sh card uniform
#
# Reports (markdown + JSON, both engines and the ratios) land in $OUT (else bench/results).
# A model's llama and Strata halves must both run before the other model's llama half: the work
# dir keeps one model's halves. Env: SHA (commit stamped on the results; the GPU machine's copy
# of the tree may have no .git), P/N/R (default 512/128/3), T (threads, default all cores).
set -euo pipefail
cd "$(dirname "$0")/.."

step=${1:?step: build | synth-h93 | synth-uniform | llama M | strata M | card M | split M (M: h93 | uniform)}
model_of() {
    case ${1:?model: h93 or uniform} in
    h93) echo /tmp/q30-q4k-h93.gguf ;;
    uniform) echo /tmp/q30-q4k-uniform.gguf ;;
    *) echo "gpu-hybrid-47.sh: unknown model $1 (h93 or uniform)" >&2 && exit 2 ;;
    esac
}
P=${P:-512} N=${N:-128} R=${R:-3} T=${T:-$(nproc)}
run=(python3 scripts/llama_side_by_side.py run --vram-budget-mib 10240 -p "$P" -n "$N" -r "$R"
    -t "$T")
commit=(--commit "${SHA:-$(git rev-parse --short HEAD 2>/dev/null || echo '?')}")

case $step in
build)
    python3 scripts/llama_side_by_side.py build --background
    ;;
synth-h93)
    python3 -m strata synth "$(model_of h93)" --shape qwen3-30b-a3b --quant Q4_K \
        --routing-entropy 0.93 --force
    ;;
synth-uniform)
    python3 -m strata synth "$(model_of uniform)" --shape qwen3-30b-a3b --quant Q4_K --skew 0 \
        --force
    ;;
llama)
    python3 scripts/llama_side_by_side.py wait --timeout 300
    "${run[@]}" --part llama --model "$(model_of "${2:-}")"
    ;;
strata)
    # car-off: the server's engine defaults (adaptive cache, prompts re-placing it, prefill
    # offload), CAR off, no --profile, no --calibrate; all-cpu: every expert in the CPU pool
    "${run[@]}" --part strata --model "$(model_of "${2:-}")" --strata-arm car-off \
        --strata-arm all-cpu "${commit[@]}"
    ;;
card)
    "${run[@]}" --part strata --model "$(model_of "${2:-}")" --strata-arm all-gpu \
        --strata-extra "--vram-budget-widen --vram-budget-mib 40000" "${commit[@]}"
    ;;
split)
    # the PCIe split of decode misses runs in eager decode windows (the graph steps keep every
    # miss in the pool): the bench prints the experts a window sent each way, the link's and
    # the gather's GB/s measured at start, and the missed experts' GB/s against host read
    m=${2:-}
    python3 -m strata.bench --arm car-off --model "$(model_of "$m")" --no-cuda-graphs \
        --vram-budget-mib 10240 -p "$P" -n "$N" -r "$R" --threads "$T" \
        --json "${OUT:-bench/results}/split-47-$m.json"
    ;;
*)
    echo "gpu-hybrid-47.sh: unknown step $step" >&2
    exit 2
    ;;
esac
