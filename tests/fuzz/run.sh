#!/usr/bin/env bash
# Fuzzes one libFuzzer target for a bounded time, starting from its seed
# corpus in the repo (which it does not modify), and says how many inputs it
# ran. A crash, leak, timeout or broken invariant fails it, printing the
# report and where the input that caused it was kept.
#   run.sh FUZZER SEED_DIR SECONDS ARTIFACT_DIR
set -euo pipefail
fuzzer=$1 seeds=$2 seconds=$3 artifacts=$4
name=$(basename "$fuzzer")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$artifacts"
rc=0
# -timeout: one input running over 10 s is a hang. -rss_limit_mb bounds
# what any input may make a decoder allocate.
"$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=1024 -print_final_stats=1 \
  -artifact_prefix="$artifacts/$name-" "$work" "$seeds" >"$work.log" 2>&1 || rc=$?
runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work.log")
if [ "$rc" -ne 0 ]; then
  tail -n 60 "$work.log"
  echo "$name: FAILED (exit $rc) after ${runs:-?} inputs; the input is kept under $artifacts"
  echo "reproduce: $fuzzer $artifacts/$name-<crash|leak|timeout>-*"
  rm -f "$work.log"
  exit 1
fi
found=$(find "$work" -type f | wc -l)
seeded=$(find "$seeds" -type f | wc -l)
rm -f "$work.log"
echo "$name: ${runs:-?} inputs in $seconds s, no failure; $seeded seeds, $found new inputs kept"
[ -n "$runs" ] && [ "$runs" -gt 0 ]
