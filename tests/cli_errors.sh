#!/bin/bash
# What `tessera` says when it is given something wrong: each case must fail
# with a message naming the actual problem (the hardening review, findings
# 16-20), never a generic one.
set -u
BIN=${TESSERA_BIN:?TESSERA_BIN names the tessera binary}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fails=0

# expect_error NAME WANT CMD...: CMD must exit non-zero and print WANT.
expect_error() {
  local name=$1 want=$2
  shift 2
  local out rc
  out=$("$@" 2>&1 </dev/null)
  rc=$?
  if [ $rc -eq 0 ]; then
    echo "FAIL $name: exited 0"; echo "$out"; fails=$((fails + 1))
  elif ! grep -qF -- "$want" <<<"$out"; then
    echo "FAIL $name: did not say '$want'"; echo "$out"; fails=$((fails + 1))
  else
    echo "ok   $name"
  fi
}

secret=$("$BIN" secret)
[ ${#secret} -eq 64 ] || { echo "FAIL secret: '$secret'"; fails=$((fails + 1)); }
"$BIN" secret --out "$dir/secret" 2>/dev/null
[ "$(stat -c %a "$dir/secret")" = 600 ] || { echo "FAIL secret --out: not mode 600"; fails=$((fails + 1)); }
expect_error "secret --out refuses to overwrite" "--force replaces it" "$BIN" secret --out "$dir/secret"
# The reader key: derived from the secret, the same every time, never the secret.
reader=$("$BIN" secret --reader --secret-file "$dir/secret")
[ "$reader" = "$("$BIN" secret --reader --secret-file "$dir/secret")" ] &&
  [ "${reader#tessera-reader-v1:}" != "$reader" ] && [ "${#reader}" -eq 82 ] &&
  ! grep -qF "$(cat "$dir/secret")" <<<"$reader" ||
  { echo "FAIL secret --reader: '$reader'"; fails=$((fails + 1)); }
echo "$reader" > "$dir/reader"
# Hostile input, refused by name (issue 43): a negative task index used to
# become task 0; a secret file that is a device was read until the OOM
# killer came; a ps address given twice was accepted.
expect_error "a negative --task" "not in range 0" \
  "$BIN" server --ps_hosts 127.0.0.1:1 --worker_hosts 127.0.0.1:2 --job ps --task -7
expect_error "a secret file that is /dev/zero" "a character device, not a regular file" \
  env -u TESSERA_SECRET TESSERA_SECRET_FILE=/dev/zero "$BIN" server --ps_hosts 127.0.0.1:1 \
  --worker_hosts 127.0.0.1:2 --job ps --task 0
# Only damaged checkpoints: starting afresh would train from step 0 and
# prune them; the server refuses, naming each, unless told --new-run.
mkdir -p "$dir/ckpt/step-00000003" && echo garbage > "$dir/ckpt/step-00000003/tessera.json"
expect_error "only damaged checkpoints" "every checkpoint in $dir/ckpt (1) is damaged" \
  env TESSERA_SECRET="$secret" "$BIN" server --ps_hosts 127.0.0.1:1 --worker_hosts 127.0.0.1:2 \
  --job ps --task 0 --checkpoint-dir "$dir/ckpt"
# --no-restore beside an earlier run's checkpoints mixed the two runs.
expect_error "--no-restore beside an earlier run" "$dir/ckpt holds 1 checkpoint(s) of an earlier run" \
  env TESSERA_SECRET="$secret" "$BIN" server --ps_hosts 127.0.0.1:1 --worker_hosts 127.0.0.1:2 \
  --job ps --task 0 --checkpoint-dir "$dir/ckpt" --no-restore
expect_error "a ps address given twice" "127.0.0.1:1 is given twice in job 'ps'" \
  "$BIN" server --ps_hosts 127.0.0.1:1,127.0.0.1:1 --worker_hosts 127.0.0.1:2 --job ps --task 0
# Session protection: a value that is none of auto, on, off; on where the
# transport cannot protect sessions.
expect_error "--session-protection maybe" "--session-protection: maybe not in {auto,on,integrity,off}" \
  "$BIN" server --ps_hosts 127.0.0.1:1 --worker_hosts 127.0.0.1:2 --job ps --task 0 \
  --session-protection maybe
expect_error "TESSERA_SESSION_PROTECTION=maybe" "session protection 'maybe' is none of auto, on, off and integrity" \
  env TESSERA_SECRET="$secret" TESSERA_SESSION_PROTECTION=maybe "$BIN" doctor
expect_error "session protection on over UCX" "session protection on needs --transport tcp" \
  env TESSERA_SECRET="$secret" "$BIN" server --ps_hosts 127.0.0.1:1 --worker_hosts 127.0.0.1:2 \
  --job ps --task 0 --transport ucx --session-protection on
expect_error "secret --reader of a reader key" "reader key already" \
  "$BIN" secret --reader --secret-file "$dir/reader"
expect_error "server with a reader key" "reader key" \
  env -u TESSERA_SECRET TESSERA_SECRET_FILE="$dir/reader" "$BIN" server --ps_hosts 127.0.0.1:1 --worker_hosts 127.0.0.1:2 --job ps --task 0

export TESSERA_SECRET=$secret
cluster='"cluster": {"ps": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223"]}'
# Finding 16: for each of these, `tessera server` said only "no cluster given".
expect_error "TF_CONFIG not JSON" "TF_CONFIG is not a JSON object" \
  env TF_CONFIG='{"cluster": ' "$BIN" server
expect_error "TF_CONFIG bad port" "has an invalid port 'x'" \
  env TF_CONFIG='{"cluster": {"ps": ["127.0.0.1:x"], "worker": ["h:1"]}, "task": {"type": "ps", "index": 0}}' "$BIN" server
expect_error "TF_CONFIG index out of range" "no task /job:ps/task:3 in the cluster spec" \
  env TF_CONFIG="{$cluster, \"task\": {\"type\": \"ps\", \"index\": 3}}" "$BIN" server
# 2^32 wrapped to task 0 before (seen while mending what fuzz_checkpoint found).
expect_error "TF_CONFIG index past int" 'no integer "index" of 0 or more' \
  env TF_CONFIG="{$cluster, \"task\": {\"type\": \"ps\", \"index\": 4294967296}}" "$BIN" server
expect_error "TF_CONFIG unknown job" "no task /job:evaluator/task:0 in the cluster spec" \
  env TF_CONFIG="{$cluster, \"task\": {\"type\": \"evaluator\", \"index\": 0}}" "$BIN" server
expect_error "a worker's TF_CONFIG to the server" "runs ps or coordinator tasks, not /job:worker/task:0" \
  env TF_CONFIG="{$cluster, \"task\": {\"type\": \"worker\", \"index\": 0}}" "$BIN" server
expect_error "no cluster at all" "no cluster given" env -u TF_CONFIG "$BIN" server
expect_error "weak secret" "at least 16 are needed" \
  env TESSERA_SECRET=short TF_CONFIG="{$cluster, \"task\": {\"type\": \"ps\", \"index\": 0}}" \
  "$BIN" server

# Finding 19: bad numbers and log levels.
tf_ps0="{$cluster, \"task\": {\"type\": \"ps\", \"index\": 0}}"
expect_error "--staging-mib abc" "--staging-mib" env TF_CONFIG="$tf_ps0" "$BIN" server --staging-mib abc
expect_error "--checkpoint-secs abc" "--checkpoint-secs" \
  env TF_CONFIG="$tf_ps0" "$BIN" server --checkpoint-secs abc
expect_error "bench --sizes abc" "'abc' is not a size" "$BIN" bench push --sizes abc
expect_error "TESSERA_LOG_LEVEL=bogus" "TESSERA_LOG_LEVEL='bogus' is not one of" \
  env TESSERA_LOG_LEVEL=bogus TF_CONFIG="$tf_ps0" "$BIN" server

# status needs only the ps tasks (it used to need a made-up --worker_hosts)
# and takes no --job/--task.
expect_error "status with ps hosts only" "connection to 127.0.0.1:1 failed" \
  "$BIN" status --ps_hosts 127.0.0.1:1 --timeout-ms 2000
expect_error "status takes no --job" "--job" "$BIN" status --ps_hosts 127.0.0.1:1 --job ps

# More busy pollers than cores: the bench warns (it measured 8 ms p50 silently).
out=$("$BIN" bench push --busy-poll --shards 2 --workers "$(( $(nproc) ))" --sizes 8 --iters 3 \
  --warmup 1 2>&1)
if grep -q "busy polling processes and threads" <<<"$out"; then
  echo "ok   bench --busy-poll oversubscribed warns"
else
  echo "FAIL bench --busy-poll oversubscribed: no warning"; echo "$out" | tail -5
  fails=$((fails + 1))
fi

# Finding 20: empty answers reported success.
mkdir -p "$dir/empty" "$dir/root/step-00000007"
expect_error "ckpt ls on an empty directory" "no checkpoints (step-N directories)" \
  "$BIN" ckpt ls "$dir/empty"
expect_error "ckpt inspect on a checkpoint root" "holds checkpoints, not files" \
  "$BIN" ckpt inspect "$dir/root"
expect_error "ckpt ls on a missing path" "does not exist" "$BIN" ckpt ls "$dir/missing"

if [ $fails -ne 0 ]; then
  echo "$fails case(s) failed"
  exit 1
fi
echo "every error named its cause"
