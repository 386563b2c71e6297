# Sourced by the session-4 call scripts: unbuffered Python, elapsed-time log lines, the synthetic
# Qwen3-30B-A3B-shaped IQ3_XXS model started in the background and waited for.
set -u
export PYTHONUNBUFFERED=1
M=/tmp/q30.gguf
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
start_model() {
  [ -f $M ] || (setsid nohup python3 -m strata synth $M --shape qwen3-30b-a3b --quant IQ3_XXS --skew 1 \
    > /tmp/synth.log 2>&1 < /dev/null &)
}
wait_model() {
  for _ in $(seq 1 90); do [ -f $M ] && ! pgrep -f "strata synth" > /dev/null && return 0; sleep 2; done
  return 1
}
# the all-resident engine on $M, 512-token prompts (name, then env assignments): files
# $O/all-gpu-NAME.{json,txt} (session 28's calls; older scripts define their own run_arm)
run_arm() {
  local name=$1; shift
  el "all-gpu $name"
  env "$@" timeout 80 python3 -m strata.bench --arm all-gpu --model $M --vram-budget-widen \
    --vram-budget-mib 40000 -p 512 -n 128 -r 3 --json $O/all-gpu-$name.json > $O/all-gpu-$name.txt 2>&1
  echo "rc=$?"; grep -E "^all-gpu|rror" $O/all-gpu-$name.txt | tail -1
}
