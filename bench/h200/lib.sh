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
