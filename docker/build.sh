#!/usr/bin/env bash
# Build the runtime image: strata-<vendor>:<arch>, :<arch>-<gitsha>, :<arch>-latest, labelled
# io.strata.vram-budget=<guard version> (run.sh refuses images without it).
#   docker/build.sh [--vendor rocm|cuda] [--arch gfx1101|sm_89|...] [--dry-run]
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PY=${STRATA_PYTHON:-python3}
die() {
    echo "build.sh: error: $*" >&2
    exit 2
}

VENDOR=rocm ARCH="" DRY=0
while (($#)); do
    case "$1" in
    --vendor) VENDOR=${2:-}; shift 2 || die "--vendor needs a value" ;;
    --arch) ARCH=${2:-}; shift 2 || die "--arch needs a value" ;;
    --dry-run) DRY=1; shift ;;
    -h | --help) sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1" ;;
    esac
done
case "$VENDOR" in
rocm) ARCH=${ARCH:-$("$PY" docker/hipinfo.py --arch 2>/dev/null || echo gfx1101)} ;;
cuda) ARCH=${ARCH:-sm_$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d .)} ;;
*) die "--vendor must be rocm or cuda, got '$VENDOR'" ;;
esac
[[ "$ARCH" =~ ^(gfx[0-9a-f]+|sm_[0-9]+)$ ]] || die "--arch must look like gfx1101 or sm_89, got '$ARCH'"

guard=$("$PY" -c 'from strata.releases import table; print(table()["vram_guard_version"])')
sha=$(git rev-parse --short HEAD 2>/dev/null || echo nogit)
name="strata-$VENDOR"
cmd=(docker build -f "docker/Dockerfile.$VENDOR" --build-arg "VRAM_GUARD=$guard"
    --label "io.strata.vram-budget=$guard"
    -t "$name:$ARCH" -t "$name:$ARCH-$sha" -t "$name:$ARCH-latest" .)
if ((DRY)); then
    echo "${cmd[*]}"
    exit 0
fi
exec "${cmd[@]}"
