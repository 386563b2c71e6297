#!/usr/bin/env bash
# Reproduce .llama/llama.cpp-src-<version>.tar.xz: the llama.cpp source vendored in the
# llama-cpp-python sdist, cut down to what a CUDA (or CPU) build of `llama-bench` needs, small
# enough to carry to the GPU machine (which has no network).
#
#   scripts/llama_src.sh                 # pip-downloads the sdist of the installed version
#   scripts/llama_src.sh SDIST.tar.gz    # or uses one you already have
#
# Env: STRATA_LLAMA_CPP_PY_VERSION (default: the installed llama_cpp_python, else 0.3.36).
set -euo pipefail

die() { echo "llama_src.sh: error: $*" >&2; exit 1; }

root=$(cd "$(dirname "$0")/.." && pwd)
out_dir="$root/.llama"
version=${STRATA_LLAMA_CPP_PY_VERSION:-$(python3 -c \
    'import importlib.metadata as m; print(m.version("llama_cpp_python"))' 2>/dev/null || echo 0.3.36)}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [[ $# -ge 1 ]]; then
    sdist=$1
    [[ -f $sdist ]] || die "no such sdist: $sdist"
else
    python3 -m pip download --quiet --no-deps --no-binary :all: \
        "llama-cpp-python==$version" -d "$work/dl" \
        || die "pip download of llama-cpp-python==$version failed"
    sdist=$(ls "$work"/dl/llama_cpp_python-*.tar.gz 2>/dev/null | head -1)
    [[ -n $sdist ]] || die "pip download produced no sdist"
fi
base=$(basename "$sdist" .tar.gz)
version=${base#llama_cpp_python-}

tar -xzf "$sdist" -C "$work" "$base/vendor/llama.cpp" || die "$sdist has no vendor/llama.cpp"
src="$work/$base/vendor/llama.cpp"
[[ -f $src/tools/llama-bench/llama-bench.cpp ]] || die "vendored llama.cpp lacks llama-bench"

# Not needed to configure or build llama-bench: vocab/model files, docs, CI, Python converters,
# tests/examples (built only when LLAMA_BUILD_TESTS/EXAMPLES are on; we turn them off), the
# server's web UI (LLAMA_BUILD_SERVER off) and every ggml backend other than CPU and CUDA.
rm -rf "$src"/{models,docs,media,.github,.devops,ci,gguf-py,conversion,scripts,requirements} \
    "$src"/{tests,examples,pocs,benches,app,grammars,skills} \
    "$src"/tools/{ui,server,cli} "$src"/.git*
for d in "$src"/ggml/src/ggml-*/; do
    case $(basename "$d") in ggml-cpu | ggml-cuda) ;; *) rm -rf "$d" ;; esac
done
find "$src" -name '*.gguf' -delete

mkdir -p "$out_dir"
archive="$out_dir/llama.cpp-src-$version.tar.xz"
tar -C "$work/$base/vendor" --sort=name --owner=0 --group=0 --numeric-owner \
    --mtime='2000-01-01 00:00Z' -cJf "$archive.partial" llama.cpp
mv "$archive.partial" "$archive"
{
    echo "llama-cpp-python $version sdist: $(basename "$sdist")"
    echo "sdist sha256: $(sha256sum "$sdist" | cut -d' ' -f1)"
    echo "archive sha256: $(sha256sum "$archive" | cut -d' ' -f1)"
    echo "made by scripts/llama_src.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$out_dir/SOURCE.txt"
echo "$archive ($(du -h "$archive" | cut -f1))"
