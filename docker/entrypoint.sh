#!/usr/bin/env bash
# Container start: guard -> device -> VRAM budget -> model/pack -> engine config -> server.
# All tuning comes by environment (STRATA_*, the lines run.sh passes with --env-file). The engine
# config is written once to $STRATA_STATE_DIR/engine.env and the server gets exactly those lines.
#   entrypoint.sh [--dry-run]   (--dry-run: every check, the config on stdout; no fetch, no server)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=${STRATA_PYTHON:-python3}
VENDOR=${STRATA_VENDOR:-rocm}
VALIDATED_GFX="gfx1100 gfx1101"
STATE=${STRATA_STATE_DIR:-/tmp/strata}
DRY=0
[[ "${1:-}" == --dry-run ]] && DRY=1

log() { echo "entrypoint: $*" >&2; }
die() {
    echo "entrypoint: error: $*" >&2
    exit 2
}

# 1. guard
[[ -z "${HSA_OVERRIDE_GFX_VERSION:-}" ]] ||
    die "HSA_OVERRIDE_GFX_VERSION=$HSA_OVERRIDE_GFX_VERSION is set: refused (unvalidated card spoofing)"
budget=${STRATA_VRAM_BUDGET_MIB:-10240}
[[ "$budget" =~ ^[0-9]+$ ]] && ((budget >= 1281 && budget <= 10240)) ||
    die "STRATA_VRAM_BUDGET_MIB=$budget is outside the contract's 1281..10240 MiB"

# 2. device
case "$VENDOR" in
rocm)
    gpu=$("$PY" "$HERE/hipinfo.py" --shell) ||
        die "no AMD GPU visible (run with --device /dev/kfd --device /dev/dri/renderD<N>)"
    eval "$gpu" # ARCH VRAM RESERVE RENDER
    arch=$ARCH vram=$VRAM reserve=$RESERVE
    [[ " $VALIDATED_GFX " == *" $arch "* ]] ||
        die "AMD $arch is not on the validated list (${VALIDATED_GFX// /, })"
    guard_vendor=amd
    ;;
cuda)
    q=$(nvidia-smi --id="${STRATA_PRIMARY_DEVICE:-0}" --query-gpu=compute_cap,memory.total,memory.used \
        --format=csv,noheader,nounits 2>/dev/null | head -n1) && [[ -n "$q" ]] ||
        die "no NVIDIA GPU visible (run with --gpus)"
    IFS=', ' read -r cc vram used <<<"$q"
    arch="sm_${cc/./}"
    ((${arch#sm_} >= 80)) || die "NVIDIA $arch is not supported: compute capability 8.0+ needed"
    reserve=$((used + ${STRATA_VRAM_RUNTIME_RESERVE_MIB:-512}))
    guard_vendor=nvidia
    ;;
*) die "STRATA_VENDOR=$VENDOR: rocm or cuda" ;;
esac
log "device $arch, $vram MiB"

# 3. VRAM budget
((budget + reserve <= vram)) ||
    die "budget $budget MiB + $reserve MiB reserve exceeds the card's $vram MiB"
log "VRAM budget $budget MiB (reserve $reserve MiB)"

# 4. model and pack: check, then fetch (free-space gated) only what is missing
vars=$("$PY" -m strata resolve --device gpu --print shell) || exit 2
eval "$vars" # RELEASE QUANT LICENSE PACK_DIR MODEL_PATH ENGINE_ENV ...
log "release $RELEASE $QUANT; license: $LICENSE"
if [[ -z "$MODEL_PATH" ]]; then
    if ((DRY)); then
        "$PY" -m strata resolve --check || log "would fetch the files above"
    else
        "$PY" -m strata resolve --fetch || exit 2
        vars=$("$PY" -m strata resolve --device gpu --print shell) || exit 2
        eval "$vars"
    fi
fi
if [[ -d "$PACK_DIR" && ! -f "$PACK_DIR/experts.bin.src.json" ]]; then
    log "warning: pack $PACK_DIR has no experts.bin.src.json (provenance unknown)"
fi

# 5. engine config: what the resolver writes is what the server reads
port=${STRATA_PORT:-8000}
if ((DRY)); then
    printf '%s\n' "$ENGINE_ENV"
    log "would run: $PY -m strata serve --host 0.0.0.0 --port $port (+ vram-guard.py --pid)"
    exit 0
fi
mkdir -p "$STATE"
printf '%s\n' "$ENGINE_ENV" >"$STATE/engine.env.tmp"
mv "$STATE/engine.env.tmp" "$STATE/engine.env"

# 6. server, watched by the guard: a breach stops the server; the server's end ends the guard
sysroot=${STRATA_SYSFS_ROOT:-/}
while IFS= read -r name; do unset "$name"; done < <(compgen -e | grep '^STRATA_' || true)
while IFS= read -r line; do
    [[ -n "$line" ]] && export "${line?}"
done <"$STATE/engine.env"
"$PY" -m strata serve --host 0.0.0.0 --port "$port" &
server=$!
"$PY" "$HERE/vram-guard.py" --vendor "$guard_vendor" --budget-mib "$budget" --pid "$server" \
    --root "$sysroot" &
guard=$!
trap 'kill "$server" "$guard" 2>/dev/null || true' TERM INT
set +e
wait -n -p ended "$server" "$guard"
rc=$?
if [[ "$ended" == "$guard" ]]; then
    if ((rc != 0)); then
        log "the VRAM guard stopped the server (exit $rc)"
        kill "$server" 2>/dev/null
        wait "$server"
        exit "$rc"
    fi
    wait "$server" # the guard ends cleanly only once the server has gone
    exit $?
fi
kill "$guard" 2>/dev/null
wait "$guard"
exit "$rc"
