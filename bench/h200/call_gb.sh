#!/usr/bin/env bash
# Session 13, call GB: call GA's serve A/B again (its context was one block short), on the
# model and pack GA built: the step server against the Python round a layer, one process.
. bench/h200/lib.sh
O=/tmp/gbout; rm -rf $O && mkdir -p $O
for cfg in "all-cpu|--expert-cache 0" "6144|--expert-cache auto --vram-budget-mib 6144 --car-threshold 0.35"; do
  name=${cfg%%|*}; args=${cfg#*|}
  el "serve A/B $name"
  timeout 200 python3 bench/serve_ab.py --model $M --pack /tmp/q30-pack $args \
    --blocks 8 --steps 32 > $O/serve-ab-$name.json 2> $O/serve-ab-$name.err; echo "rc=$?"
  cat $O/serve-ab-$name.json; tail -2 $O/serve-ab-$name.err
done
tar -cf $OUT/gb.tar -C $O .
el "done"
