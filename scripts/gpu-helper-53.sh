#!/usr/bin/env bash
# Issue 53's Must-show row on a two-GPU machine (H100 x2 + its cores), one step a call (each
# under the 10-minute limit), from the repo root:
#
#   scripts/gpu-helper-53.sh synth      # Qwen3-30B-A3B-shaped Q4_K, usage entropy 0.93
#   scripts/gpu-helper-53.sh test       # the helper tests on the real cards (tokens = 1 GPU)
#   scripts/gpu-helper-53.sh alone      # primary alone at 10240 MiB (the product's default step)
#   scripts/gpu-helper-53.sh one        # + a 1-slot helper: the host-routed step's own cost
#   scripts/gpu-helper-53.sh n          # + helper GPU 1 with $SLOTS slots (default 1536)
#   scripts/gpu-helper-53.sh auto       # + helper GPU 1 sized auto (its free memory)
#
# Each row: decode tok/s (median, min-max), CPU experts a decode layer-window, the helper's
# slots and hits. JSON lands in $OUT (else bench/results). Env: P/N/R (default 512/128/3),
# T (threads, default all cores), SLOTS.
set -euo pipefail
cd "$(dirname "$0")/.."
export CUDA_DEVICE_ORDER=PCI_BUS_ID # ordinals as nvidia-smi numbers the cards

step=${1:?step: synth | test | alone | one | n | auto}
M=/tmp/q30-q4k-h93.gguf
P=${P:-512} N=${N:-128} R=${R:-3} T=${T:-$(nproc)} SLOTS=${SLOTS:-1536}
bench() { # bench NAME [bench flags...]
    local name=$1
    shift
    python3 -m strata.bench --arm car-off --model "$M" --vram-budget-mib 10240 -p "$P" -n "$N" \
        -r "$R" --threads "$T" "$@" --json "${OUT:-bench/results}/helper-53-$name.json"
}
case $step in
synth) python3 -m strata synth "$M" --shape qwen3-30b-a3b --quant Q4_K --routing-entropy 0.93 \
    --force ;;
test) python3 -m pytest -q -m gpu tests/test_helper_cards.py tests/test_gpu_budget.py ;;
alone) bench alone ;;
one) bench one --helper-cache 1=1 ;;
n) bench "n$SLOTS" --helper-cache "1=$SLOTS" ;;
auto) bench auto --helper-cache 1=auto ;;
*)
    echo "gpu-helper-53.sh: unknown step $step" >&2
    exit 2
    ;;
esac
