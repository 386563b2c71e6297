#!/usr/bin/env bash
# run.sh: the one launcher. A release and quant become a served model under the VRAM contract,
# in a container where there is a GPU and Docker, natively otherwise (same config either way).
#
#   ./run.sh [--release qwen|coder|gpt-oss-20b|gpt-oss-120b|swift] [--quant Q] [--vram-budget-mib N]
#            [--max-context N] [--port N] [--device auto|gpu|host] [--primary-device N]
#            [--helper-cache DEV=auto|N,..] [--image NAME] [--native] [--dry-run]
#
# Every refusal happens before a container sees anything. The config is asked of
# `strata resolve` (flags > STRATA_* > per-release tuning > defaults) and written as STRATA_*
# lines; the server is started with exactly those lines as its engine environment.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$ROOT"
PY=${STRATA_PYTHON:-python3}
VALIDATED_GFX="gfx1100 gfx1101"

say() { echo "run.sh: $*" >&2; }
die() {
    echo "run.sh: error: $*" >&2
    exit 2
}
usage() { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; }

RELEASE="" QUANT="" BUDGET="" CTX="" PORT="${STRATA_PORT:-8000}" DEVICE="${STRATA_DEVICE:-auto}"
IMAGE="${STRATA_IMAGE:-}" NATIVE=0 DRY=0
value() { # value FLAG "$@": the flag's argument, or a refusal
    [[ $# -ge 2 && -n "$2" && "$2" != --* ]] || die "$1 needs a value"
    printf '%s' "$2"
}
while (($#)); do
    arg=$1
    if [[ "$arg" == --*=* ]]; then
        set -- "${arg%%=*}" "${arg#*=}" "${@:2}"
        arg=$1
    fi
    case "$arg" in
    --release) RELEASE=$(value "$@"); shift 2 ;;
    --quant) QUANT=$(value "$@"); shift 2 ;;
    --vram-budget-mib) BUDGET=$(value "$@"); shift 2 ;;
    --max-context) CTX=$(value "$@"); shift 2 ;;
    --port) PORT=$(value "$@"); shift 2 ;;
    --device) DEVICE=$(value "$@"); shift 2 ;;
    --primary-device) export STRATA_PRIMARY_DEVICE; STRATA_PRIMARY_DEVICE=$(value "$@"); shift 2 ;;
    --helper-cache) export STRATA_HELPER_CACHE; STRATA_HELPER_CACHE=$(value "$@"); shift 2 ;;
    --image) IMAGE=$(value "$@"); shift 2 ;;
    --native) NATIVE=1; shift ;;
    --dry-run) DRY=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument $arg (see ./run.sh --help)" ;;
    esac
done
for pair in "--vram-budget-mib:$BUDGET" "--max-context:$CTX" "--port:$PORT" \
    "--primary-device:${STRATA_PRIMARY_DEVICE:-}"; do
    v=${pair#*:}
    [[ -z "$v" || "$v" =~ ^[0-9]+$ ]] || die "${pair%%:*} must be a whole number, got '$v'"
done
((PORT >= 1 && PORT <= 65535)) || die "--port must be in 1..65535, got $PORT"
case "$DEVICE" in auto | gpu | host) ;; *) die "--device must be auto, gpu or host, got '$DEVICE'" ;; esac

# guard: a spoofed architecture would run kernels on a card nobody validated
if [[ -n "${HSA_OVERRIDE_GFX_VERSION:-}" ]]; then
    die "HSA_OVERRIDE_GFX_VERSION=$HSA_OVERRIDE_GFX_VERSION is set: Strata runs only on cards it validates as they are; unset it"
fi

# device: AMD from the KFD topology, NVIDIA from nvidia-smi. CUDA numbers the cards fastest first
# unless told otherwise; nvidia-smi by PCI bus: the engine counts as the probe does
export CUDA_DEVICE_ORDER=PCI_BUS_ID
VENDOR="" ARCH="" VRAM="" RESERVE="" RENDER="" GPU_INDEX="${STRATA_PRIMARY_DEVICE:-0}"
if gpu=$("$PY" docker/hipinfo.py --shell 2>/dev/null); then
    VENDOR=rocm
    eval "$gpu" # ARCH VRAM RESERVE RENDER
elif command -v nvidia-smi >/dev/null 2>&1 &&
    q=$(nvidia-smi --id="$GPU_INDEX" --query-gpu=compute_cap,memory.total,memory.used \
        --format=csv,noheader,nounits 2>/dev/null) && [[ -n "$q" ]]; then
    VENDOR=cuda
    IFS=', ' read -r cc VRAM used <<<"$(head -n1 <<<"$q")"
    ARCH="sm_${cc/./}"
    RESERVE=$((used + ${STRATA_VRAM_RUNTIME_RESERVE_MIB:-512}))
fi

NO_GPU_LINE="no GPU found (no AMD GPU in the KFD topology, no working nvidia-smi): a GPU start is refused"
if [[ -z "$VENDOR" ]]; then
    case "$DEVICE" in
    gpu) ((DRY)) && say "$NO_GPU_LINE" || die "$NO_GPU_LINE" ;;
    auto) say "$NO_GPU_LINE; the host tier serves"; DEVICE=host ;;
    esac
elif [[ "$DEVICE" != host ]]; then
    if [[ $VENDOR == rocm && " $VALIDATED_GFX " != *" $ARCH "* ]]; then
        die "AMD $ARCH is not on the validated list (${VALIDATED_GFX// /, })"
    fi
    if [[ $VENDOR == cuda ]] && ((${ARCH#sm_} < 80)); then
        die "NVIDIA $ARCH is not supported: compute capability 8.0 or newer is needed"
    fi
    DEVICE=gpu
fi

# release, quant, model, pack and the engine config, with their refusals (budget, context,
# the disk gate before any download); one answer from the resolver
RARGS=()
[[ -n "$RELEASE" ]] && RARGS+=(--release "$RELEASE")
[[ -n "$QUANT" ]] && RARGS+=(--quant "$QUANT")
[[ -n "$BUDGET" ]] && RARGS+=(--vram-budget-mib "$BUDGET")
[[ -n "$CTX" ]] && RARGS+=(--max-context "$CTX")
vars=$("$PY" -m strata resolve "${RARGS[@]}" --device "$DEVICE" --gate --print shell) || exit 2
eval "$vars" # RELEASE QUANT REPO MODEL_ID PACK_DIR LICENSE HUB_CACHE MODEL_PATH GUARD_VERSION ENGINE_ENV
say "release $RELEASE, quant $QUANT, model id $MODEL_ID; license: $LICENSE"
if [[ -z "$MODEL_PATH" && "${HF_HUB_OFFLINE:-}" =~ ^(1|ON|on|YES|yes|TRUE|true)$ ]]; then
    "$PY" -m strata resolve "${RARGS[@]}" --print files >/dev/null || exit 2
fi
env_lines=$ENGINE_ENV
budget=$(sed -n 's/^STRATA_VRAM_BUDGET_MIB=//p' <<<"$env_lines")
budget=${budget:-10240}
if [[ "$DEVICE" == gpu && -n "$VENDOR" ]] && ((budget + RESERVE > VRAM)); then
    die "budget $budget MiB + $RESERVE MiB reserve exceeds the card's $VRAM MiB ($ARCH); pass --vram-budget-mib $((VRAM - RESERVE)) or less"
fi
# helper cards (--helper-cache; the resolver checked its form): each probed as the primary is
HELPERS=$(sed -n 's/^STRATA_HELPER_CACHE=//p' <<<"$env_lines")
HELPER_DEVS=()
if [[ -n "$HELPERS" && "$DEVICE" == gpu ]]; then
    IFS=',' read -r -a entries <<<"${HELPERS// /}"
    for entry in "${entries[@]}"; do
        d=${entry%%=*}
        HELPER_DEVS+=("$d")
        if [[ $VENDOR == cuda ]]; then
            hq=$(nvidia-smi --id="$d" --query-gpu=compute_cap --format=csv,noheader,nounits \
                2>/dev/null | head -n1) && [[ -n "$hq" ]] || die "helper GPU $d: nvidia-smi finds no such card"
            ((${hq/./} >= 80)) || die "helper GPU $d: NVIDIA sm_${hq/./} is not supported: compute capability 8.0 or newer is needed"
        fi
    done
    say "helper cards: $HELPERS (beside primary GPU $GPU_INDEX)"
fi

MODE=native
if [[ "$DEVICE" == gpu && $NATIVE == 0 ]] && command -v docker >/dev/null 2>&1 &&
    docker info >/dev/null 2>&1; then
    MODE=container
fi

if [[ $MODE == container ]]; then
    IMAGE=${IMAGE:-strata-$VENDOR:$ARCH}
    if ! label=$(docker image inspect --format '{{ index .Config.Labels "io.strata.vram-budget" }}' "$IMAGE" 2>/dev/null); then
        die "image $IMAGE not found; build it: docker/build.sh --vendor $VENDOR --arch $ARCH"
    fi
    if ! [[ "$label" =~ ^[0-9]+$ ]] || ((label < GUARD_VERSION)); then
        die "image $IMAGE is too old: its io.strata.vram-budget label is '${label}', $GUARD_VERSION or newer carries the budget guard; rebuild: docker/build.sh --vendor $VENDOR --arch $ARCH"
    fi
    # the container resolves its own paths; it gets the inputs, not this host's paths
    cenv=$(grep -v -E '^STRATA_(MODEL|PACK|PRIMARY_DEVICE|HELPER_CACHE)=' <<<"$env_lines")
    # the container sees only the cards it is given, numbered 0.. in PCI order (their order
    # here): the primary and helper ordinals are renumbered to what it sees
    gpus=$(printf '%s\n' "$GPU_INDEX" "${HELPER_DEVS[@]}" | sort -n | paste -sd, -)
    inner() { tr ',' '\n' <<<"$gpus" | grep -n -x -- "$1" | cut -d: -f1 | awk '{print $1 - 1}'; }
    cenv+=$'\n'"STRATA_PRIMARY_DEVICE=$(inner "$GPU_INDEX")"
    if ((${#HELPER_DEVS[@]})); then
        [[ $VENDOR == rocm ]] && die "helper cards in the ROCm container are not wired (one render node is passed); start with --native"
        spec=""
        for entry in "${entries[@]}"; do
            spec+="${spec:+,}$(inner "${entry%%=*}")=${entry#*=}"
        done
        cenv+=$'\n'"STRATA_HELPER_CACHE=$spec"$'\n'"CUDA_DEVICE_ORDER=PCI_BUS_ID"
    fi
    [[ -n "${HF_HUB_OFFLINE:-}" ]] && cenv+=$'\n'"HF_HUB_OFFLINE=$HF_HUB_OFFLINE"
    packs_abs=$(dirname "$PACK_DIR")
    [[ "$packs_abs" == /* ]] || packs_abs="$ROOT/$packs_abs"
    cmd=(docker run --rm --user "$(id -u):$(id -g)" -p "127.0.0.1:$PORT:8000"
        -v "$HUB_CACHE:/models/hub" -v "$packs_abs:/models/packs"
        -e HF_HUB_CACHE=/models/hub -e STRATA_PACKS_DIR=/models/packs)
    [[ -n "${HF_TOKEN:-}" ]] && cmd+=(-e HF_TOKEN) # passed by name: never written to a file
    if [[ $VENDOR == rocm ]]; then
        for dev in /dev/kfd "$RENDER"; do
            cmd+=(--device "$dev" --group-add "$(stat -c %g "$dev" 2>/dev/null || echo video)")
        done
    elif [[ "$gpus" == *,* ]]; then
        cmd+=(--gpus "\"device=$gpus\"") # a list: docker reads --gpus as CSV, hence the quotes
    else
        cmd+=(--gpus "device=$GPU_INDEX")
    fi
    say "mode container ($IMAGE on $ARCH), VRAM budget $budget MiB, http://127.0.0.1:$PORT/v1"
    if ((DRY)); then
        printf '%s\n' "$cenv"
        say "would run: ${cmd[*]} --env-file ENV $IMAGE"
        exit 0
    fi
    mkdir -p "$HUB_CACHE" "$packs_abs"
    envfile=$(mktemp "${TMPDIR:-/tmp}/strata-env.XXXXXX")
    trap 'rm -f "$envfile"' EXIT
    printf '%s\n' "$cenv" >"$envfile"
    "${cmd[@]}" --env-file "$envfile" "$IMAGE"
    exit $?
fi

say "mode native, device $DEVICE, http://127.0.0.1:$PORT/v1"
if [[ -z "$MODEL_PATH" ]]; then
    if ((DRY)); then
        say "would fetch first: $("$PY" -m strata resolve "${RARGS[@]}" --check 2>&1 | sed 's/.*fetch it with: //')"
    else
        "$PY" -m strata resolve "${RARGS[@]}" --fetch || exit 2
        env_lines=$("$PY" -m strata resolve "${RARGS[@]}" --device "$DEVICE" --print env) || exit 2
    fi
fi
printf '%s\n' "$env_lines"
serve=("$PY" -m strata serve --host 127.0.0.1 --port "$PORT")
if ((DRY)); then
    say "would run: ${serve[*]} (with exactly the STRATA_* lines above)"
    exit 0
fi
# exactly the config above: no stray STRATA_* from this shell
while IFS= read -r name; do unset "$name"; done < <(compgen -e | grep '^STRATA_' || true)
while IFS= read -r line; do
    [[ -n "$line" ]] && export "${line?}"
done <<<"$env_lines"
exec "${serve[@]}"
