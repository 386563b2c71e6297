#!/usr/bin/env bash
# The model and pack both calls use (skipped when already there).
set -u
M=/tmp/q30.gguf P=/tmp/q30-pack
[ -f $M ] || python3 -m strata synth $M --shape qwen3-30b-a3b --quant IQ3_XXS --skew 1 || exit 1
echo MODEL-DONE
[ -f $P/experts.bin ] || python3 -m strata pack $M -o $P --force || exit 1
echo PREP-DONE
