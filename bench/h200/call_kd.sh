#!/usr/bin/env bash
# Session 17, call KD: the resident-first A/B again, where most of a prompt's picks are staged:
# a 12-layer Qwen3-30B-A3B-shaped IQ3_XXS model at 2048 MiB (A B B A twice), and the 48-layer
# model at 10240 MiB once more (A B B A); one process a run.
. bench/h200/lib.sh
O=/tmp/kdout; rm -rf $O && mkdir -p $O
M12=/tmp/q12.gguf
[ -f $M12 ] || timeout 120 python3 -m strata synth $M12 --shape qwen3-30b-a3b --quant IQ3_XXS \
  --skew 1 --layers 12 --vocab 32000 > $O/synth.txt 2>&1
run() {  # model budget extra... ; resident-first from $a
  STRATA_PREFILL_RESIDENT_FIRST=$a timeout 120 python3 -m strata.bench --arm car-on --model $1 \
    --vram-budget-widen --vram-budget-mib $2 "${@:3}" -p 512 -n 64 -r 3 \
    --json $O/car-on-$(basename $1 .gguf)-rf$a-$SECONDS.json > /dev/null 2>&1; echo "rc=$?"
}
for a in 1 0 0 1 1 0 0 1; do el "q12 2048 rf=$a"; run $M12 2048; done
for a in 0 1 1 0; do el "q30 10240 rf=$a"; run /tmp/q30.gguf 10240 --pack /tmp/q30-pack --calibrate; done
python3 - $O <<'PY'
import glob, json, sys
for p in sorted(glob.glob(sys.argv[1] + "/car-on-*.json")):
    r = json.load(open(p))["results"][0]
    keys = ("prefill_tps", "decode_tps", "hit_rate", "prefill_offloaded_picks", "resident_experts")
    print(p.rsplit("/", 1)[1], {k: round(r[k], 3) for k in keys if k in r})
PY
cp $O/* $OUT/
el "done"
