#!/usr/bin/env bash
# The open issues' GPU rows in as few device calls as possible: each call runs the steps not yet
# done (markers in /tmp/done on the GPU machine, which keeps /tmp while it stays warm) within
# BUDGET seconds and returns what it has as $OUT/res.tgz.
#
#   scripts/gpu-rows.sh prepare   # here: wheels (.whl) and the A/B trees (.gpucheck/{old,new})
#   scripts/gpu-rows.sh run       # on the GPU machine, carry [".gpucheck", ".whl"] (+ ".llama"
#                                 # with WITH_LLAMA=1 for issue 47's llama.cpp rows)
#
# Steps, in order: synth the Qwen3-30B-A3B-shaped IQ3_XXS file (background), `pytest -m gpu`
# (45), issue 45's A/B (OLD vs NEW layout: warm-up each, then A B B A, each arm run from inside
# its own tree: `python -m` puts the working directory ahead of PYTHONPATH), issue 49's CAR
# rows (ratio vs slack at skew 0.5 and 0), issue 47's rows (scripts/gpu-hybrid-47.sh).
# Env: OLD/NEW (commits, prepare), BUDGET (seconds, run), SHA (stamp), WITH_LLAMA.
set -u
cd "$(dirname "$0")/.."
OLD=${OLD:-bf3675c} NEW=${NEW:-2a89852}
if [ "${1:-}" = prepare ]; then
    set -e
    bash ../shared/tools/device-wheels.sh > /dev/null
    grep -qx '/.gpucheck/' .git/info/exclude || echo '/.gpucheck/' >> .git/info/exclude
    rm -rf .gpucheck && mkdir -p .gpucheck/old .gpucheck/new
    git archive "$OLD" strata | tar -x -C .gpucheck/old
    git archive "$NEW" strata | tar -x -C .gpucheck/new
    rm -f .gpucheck/*/strata/data/*.gguf # the embedded model is not needed; stays under 64 MiB
    exit 0
fi
[ "${1:-}" = run ] || { echo "gpu-rows.sh: prepare | run" >&2 && exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
    .whl/*.whl || exit 1
SITE=/tmp/site ROOT=$PWD
mkdir -p /tmp/done /tmp/res
T0=$(date +%s) BUDGET=${BUDGET:-560}
left() { echo $((BUDGET - ($(date +%s) - T0))); }
done_() { [ -e "/tmp/done/$1" ]; }
mark() { touch "/tmp/done/$1"; }
log() { echo "[$(($(date +%s) - T0))s] $*" | tee -a /tmp/res/steps.log; }
finish() {
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > /tmp/res/gpu.txt 2>&1
    lscpu | grep -E 'Model name|^CPU\(s\)' >> /tmp/res/gpu.txt
    tar -czf "$OUT/res.tgz" -C /tmp res
    ls /tmp/done
    exit 0
}
here() { PYTHONPATH=$SITE:$ROOT "$@"; }
if ! done_ synth && [ ! -e /tmp/synth.pid ]; then
    (here python3 -m strata synth /tmp/q30.gguf --shape qwen3-30b-a3b --quant IQ3_XXS --skew 1 \
        --force > /tmp/res/synth.log 2>&1 && touch /tmp/done/synth) &
    echo $! > /tmp/synth.pid
fi
if [ -n "${WITH_LLAMA:-}" ] && ! done_ llamabuild && [ ! -e /tmp/llbuild.pid ]; then
    (here python3 scripts/llama_side_by_side.py build > /tmp/res/llama-build.log 2>&1 &&
        touch /tmp/done/llamabuild) &
    echo $! > /tmp/llbuild.pid
fi
if ! done_ pytest; then
    log pytest start
    here timeout 420 python3 -m pytest -m gpu -q -p no:cacheprovider --durations=15 tests \
        > /tmp/res/pytest-gpu.log 2>&1
    echo "rc=$?" >> /tmp/res/pytest-gpu.log
    mark pytest
    log "pytest done $(tail -2 /tmp/res/pytest-gpu.log | head -1)"
fi
[ "$(left)" -lt 120 ] && finish
# nothing timed while a synth or a build runs
for p in /tmp/synth.pid /tmp/llbuild.pid; do
    while [ -e $p ] && kill -0 "$(cat $p)" 2> /dev/null; do
        [ "$(left)" -lt 60 ] && finish
        sleep 5
    done
done
done_ synth || { log "synth failed" && finish; }
ab() { # ab NAME TREE bench-flags...
    local name=$1 tree=$2
    shift 2
    log "$name start"
    (cd "$ROOT/.gpucheck/$tree" && PYTHONPATH=$SITE:$PWD timeout $(($(left) - 10)) \
        python3 -m strata.bench --arm car-on --model /tmp/q30.gguf --vram-budget-mib 10240 "$@") \
        > "/tmp/res/$name.log" 2>&1
    echo "rc=$?" >> "/tmp/res/$name.log"
    log "$name done: $(grep -E '^car-on' "/tmp/res/$name.log" | tail -1)"
}
for s in "warm-old old -p 64 -n 16 -r 1" "warm-new new -p 64 -n 16 -r 1" \
    "A1 old -p 512 -n 128 -r 3" "B1 new -p 512 -n 128 -r 3" "B2 new -p 512 -n 128 -r 3" \
    "A2 old -p 512 -n 128 -r 3"; do
    set -- $s
    done_ "$1" && continue
    [ "$(left)" -lt 170 ] && finish
    ab "$@"
    mark "$1"
done
for SKEW in 0.5 0; do
    for MODE in ratio slack; do
        n=car49-$SKEW-$MODE
        done_ $n && continue
        [ "$(left)" -lt 200 ] && finish
        log "$n start"
        here timeout $(($(left) - 10)) python3 -m strata.bench --synthetic qwen3-30b-a3b \
            --quant Q4_K --skew $SKEW --vram-budget-mib 10240 --arm car-off --arm car-on \
            --car-mode $MODE -p 64 -n 128 -r 3 --json /tmp/res/$n.json > /tmp/res/$n.log 2>&1
        echo "rc=$?" >> /tmp/res/$n.log
        mark $n
        log "$n done"
    done
done
if done_ llamabuild; then
    for st in synth-h93 "llama h93" "strata h93" "split h93" "card h93" synth-uniform \
        "llama uniform" "strata uniform" "card uniform"; do
        n=h47-${st// /-}
        done_ "$n" && continue
        [ "$(left)" -lt 200 ] && finish
        log "$n start"
        OUT=/tmp/res here timeout $(($(left) - 10)) bash scripts/gpu-hybrid-47.sh $st \
            > "/tmp/res/$n.log" 2>&1
        echo "rc=$?" >> "/tmp/res/$n.log"
        mark "$n"
        log "$n done"
    done
fi
log "all done"
finish
