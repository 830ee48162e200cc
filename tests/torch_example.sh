#!/usr/bin/env bash
# examples/torch_digits.py under `tessera launch`, 2 ps tasks x 2 workers,
# sync Adam on the shards: it reaches >= 95 % held-out accuracy, and the
# same script as an evaluator beside it (a read-only client) sees the
# chief's final accuracy from the weights it pulled; killed
# midway (SIGKILL to the launcher, whose children die with it) and started
# again on the same checkpoint directory, it resumes from the saved step and
# still does. Exit 77 (skip) without the Python package or torch.
set -euo pipefail
: "${TESSERA_BIN:?}"
here=$(cd "$(dirname "$0")" && pwd)
example="$here/../examples/torch_digits.py"
# shellcheck source=pypkg/python_env.sh
. "$here/pypkg/python_env.sh"
require_python_modules torch sklearn
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

accuracy_ok() {  # accuracy_ok LOG: the chief's last line says >= 0.95
  local acc
  acc=$(sed -n 's/.*held-out accuracy \([0-9.]*\).*/\1/p' "$1" | tail -1)
  [ -n "$acc" ] || { echo "FAIL: no held-out accuracy in the output"; return 1; }
  echo "held-out accuracy $acc"
  awk -v a="$acc" 'BEGIN { exit !(a >= 0.95) }' || { echo "FAIL: accuracy $acc < 0.95"; return 1; }
}

wait_for_a_checkpoint() {  # DIR PID: until DIR holds a complete checkpoint
  # past step 0 (its manifest is written last) or PID ended; at most 120 s
  for _ in $(seq 2400); do
    if ls "$1"/step-*/tessera.json 2>/dev/null | grep -qv step-00000000/; then return; fi
    if ! kill -0 "$2" 2>/dev/null; then return; fi
    sleep 0.05
  done
}

echo "== train, with an evaluator"
# The chief's command starts the evaluator too (its TF_CONFIG task made
# "evaluator", as a TFJob's would be) and waits for it, so that the cluster
# serves until the evaluator has the last step's weights.
cat > "$dir/with_evaluator.sh" <<'EOF'
set -euo pipefail
evaluator=
if [ "$("$TESSERA_PYTHON" -c 'import json, os
print(json.loads(os.environ["TF_CONFIG"])["task"]["index"])')" = 0 ]; then
  TF_CONFIG=$("$TESSERA_PYTHON" -c 'import json, os
c = json.loads(os.environ["TF_CONFIG"]); c["task"] = {"type": "evaluator", "index": 0}
print(json.dumps(c))') timeout 300 "$@" --eval-every-s 0.2 > "$EVALUATOR_LOG" 2>&1 &
  evaluator=$!
fi
"$@"
if [ -n "$evaluator" ]; then wait "$evaluator"; fi
EOF
TESSERA_PYTHON=$TESSERA_PYTHON EVALUATOR_LOG="$dir/evaluator.log" \
  "$TESSERA_BIN" launch --ps 2 --workers 2 --transport tcp -- \
  bash "$dir/with_evaluator.sh" "$TESSERA_PYTHON" "$example" --steps 300 2>&1 | tee "$dir/train.log"
accuracy_ok "$dir/train.log"
cat "$dir/evaluator.log"
chief=$(sed -n 's/.*held-out accuracy \([0-9.]*\) after.*/\1/p' "$dir/train.log" | tail -1)
seen=$(sed -n 's/^evaluator: held-out accuracy \([0-9.]*\) at global step 300$/\1/p' \
  "$dir/evaluator.log")
if [ -z "$seen" ] || [ "$seen" != "$chief" ]; then
  echo "FAIL: the evaluator saw '${seen}' at global step 300, the chief $chief"
  exit 1
fi
echo "the evaluator saw the chief's accuracy, $seen, at global step 300"

echo "== killed midway"
ckpt="$dir/ckpt"
run=("$TESSERA_BIN" launch --ps 2 --workers 2 --transport tcp --checkpoint-dir "$ckpt"
  --checkpoint-steps 40 -- "$TESSERA_PYTHON" "$example" --steps 300 --ms-per-step 20)
"${run[@]}" > "$dir/first.log" 2>&1 &
pid=$!
# Killed once a complete checkpoint past step 0 is on disk, however slow
# the machine.
wait_for_a_checkpoint "$ckpt" "$pid"
kill -KILL "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
if grep -q "held-out accuracy" "$dir/first.log"; then
  cat "$dir/first.log"
  echo "FAIL: the first run finished before it was killed"
  exit 1
fi
# The workers and shards die with the launcher; wait until the directory is free.
for _ in $(seq 600); do
  pgrep -f -- "--checkpoint-dir $ckpt" > /dev/null || pgrep -f "$ckpt" > /dev/null || break
  sleep 0.05
done

echo "== resumed"
"${run[@]}" 2>&1 | tee "$dir/second.log"
step=$(sed -n 's/.*resuming from the checkpoint of global step \([0-9]*\).*/\1/p' "$dir/second.log")
[ -n "$step" ] || { echo "FAIL: the second run did not resume"; exit 1; }
if [ "$step" -le 0 ] || [ "$step" -ge 300 ]; then
  echo "FAIL: resumed at step $step, not midway"
  exit 1
fi
echo "resumed at global step $step"
accuracy_ok "$dir/second.log"

echo "== a ps task killed and restarted in place"
# tessera launch --max-restarts starts the killed ps task again on its
# address, where it restores its part from the checkpoint; the workers'
# DistributedOptimizer makes the failed step again once it is back
# (restart_timeout), so no worker fails or is restarted.
ckpt2="$dir/ckpt2"
"$TESSERA_BIN" launch --ps 2 --workers 2 --transport tcp --max-restarts 1 \
  --checkpoint-dir "$ckpt2" --checkpoint-steps 40 -- \
  "$TESSERA_PYTHON" "$example" --steps 300 --ms-per-step 20 > "$dir/restart.log" 2>&1 &
pid=$!
wait_for_a_checkpoint "$ckpt2" "$pid"
# The newest server of this run: ps task 1, started after ps task 0.
pkill -KILL -n -f "[s]erver.*$ckpt2" || { cat "$dir/restart.log"; echo "FAIL: no ps task to kill"; exit 1; }
rc=0
wait "$pid" || rc=$?
cat "$dir/restart.log"
[ "$rc" -eq 0 ] || { echo "FAIL: the run exited $rc"; exit 1; }
grep -q "ended (killed by signal Killed); restarting it" "$dir/restart.log" ||
  { echo "FAIL: no ps task was killed and restarted"; exit 1; }
if grep -qE "worker[0-9]+ ended" "$dir/restart.log"; then
  echo "FAIL: a worker failed instead of waiting for the ps task"
  exit 1
fi
accuracy_ok "$dir/restart.log"
