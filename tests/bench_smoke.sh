#!/usr/bin/env bash
# A few seconds of `tessera bench` so the tool cannot rot: every scenario on
# tcp with --check, its JSON read back, and the plot drawn where matplotlib
# is installed (.venv, made by tools/dev.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
server=
trap '[ -n "$server" ] && kill "$server" 2>/dev/null; rm -rf "$out"' EXIT
plot=()
if "$here/../.venv/bin/python" -c "import matplotlib" 2>/dev/null; then
  plot=(--plot "$out/bench.png")
fi
"$TESSERA_BIN" bench fabric push pull push_pull step --transport tcp --sizes 8,64K \
  --batch 1,4 --iters 5 --warmup 1 --check --baseline --model "$here/bench_smoke_model.txt" \
  --json "$out/bench.json" "${plot[@]}"
python3 - "$out/bench.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
seen = {r["scenario"] for r in rows}
want = {"fabric-put", "fabric-get", "fabric-put-read", "fabric-msg-rtt", "push", "pull",
        "push_pull", "step"}
assert want <= seen, f"missing scenarios: {want - seen}"
for r in rows:
    assert r["p50_us"] > 0, r
    if r["scenario"] in ("push", "pull", "push_pull"):
        assert r["allocs_per_op"] >= 0, r
batches = {r["batch"] for r in rows if r["scenario"] == "push"}
assert batches == {1, 4}, batches
# Tessera's tcp beside plain sockets doing the same exchange (--baseline).
want_baseline = {"fabric-put": "socket push", "fabric-get": "socket pull",
                 "fabric-msg-rtt": "socket echo", "push": "socket push",
                 "pull": "socket pull", "push_pull": "socket echo"}
compared = [r for r in rows if r["scenario"] in want_baseline and r["batch"] == 1]
assert compared, "no row to compare"
for r in compared:
    assert r["baseline"] == want_baseline[r["scenario"]], r
    assert r["baseline_us"] > 0 and r["ratio"] > 0, r
print(f"bench smoke: {len(rows)} rows, scenarios {sorted(seen)}")
PY
if [ ${#plot[@]} -gt 0 ]; then
  test -s "$out/bench.png" || { echo "no plot written"; exit 1; }
  echo "bench smoke: plot drawn"
else
  echo "bench smoke: no matplotlib in .venv; plot not drawn"
fi

# bench/ab.sh, as docs/PERFORMANCE.md runs it, with one build on both sides:
# a row per point, its ratio of medians and that ratio's interval.
N=2 "$here/../bench/ab.sh" "$TESSERA_BIN" "$TESSERA_BIN" push --transport tcp --sizes 8 \
  --iters 5 --warmup 1 > "$out/ab.md"
python3 - "$out/ab.md" <<'PY'
import re, sys
rows = [line.split("|") for line in open(sys.argv[1]) if line.startswith("| push | tcp | 8 |")]
assert len(rows) == 1, open(sys.argv[1]).read()
ratio, interval = rows[0][7].strip(), rows[0][8].strip()
assert re.fullmatch(r"\d+\.\d\d", ratio), ratio
lo, hi = (float(x) for x in interval.split("-"))
assert 0 < lo <= hi, interval
print(f"ab.sh: push tcp 8 B new/old {ratio}, 90% interval {interval}")
PY

# Against a running cluster (--cluster): one `tessera server` started here.
port=$(python3 -c '
import random, socket
for _ in range(100):
    p = random.randrange(20000, 30000)
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", p)); print(p); break
        except OSError:
            pass')
printf '{"ps": ["127.0.0.1:%s"], "worker": ["127.0.0.1:%s"]}\n' "$port" "$((port + 1))" \
  > "$out/cluster.json"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$out/secret"
chmod 600 "$out/secret"
TESSERA_LOG_LEVEL=warn "$TESSERA_BIN" server --cluster "$out/cluster.json" --job ps --task 0 \
  --secret-file "$out/secret" &
server=$!
"$TESSERA_BIN" bench push pull --cluster "$out/cluster.json" --secret-file "$out/secret" \
  --transport tcp --sizes 8,64K --iters 5 --warmup 1 --check --json "$out/given.json"
python3 - "$out/given.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
assert {r["scenario"] for r in rows} == {"push", "pull"}, rows
print(f"bench smoke: {len(rows)} rows against a given cluster")
PY

# `tessera status` against the same server: what it holds and has done.
"$TESSERA_BIN" status --cluster "$out/cluster.json" --secret-file "$out/secret" \
  --json > "$out/status.json"
python3 - "$out/status.json" <<'PY'
import json, sys
tasks = json.load(open(sys.argv[1]))
assert [t["task"] for t in tasks] == ["/job:ps/task:0"], tasks
t = tasks[0]
assert t["memory"] == "host memory" and t["staged_through_host"] is False, t
assert t["stats"]["pushes_applied"] > 0 and t["stats"]["pulls_served"] > 0, t
assert t["coordinator"] is True and t["global_step"] > 0, t
# The shards count steps: the coordinator heard of them from its ps task only.
reports = t["step_reports"]
assert reports["from_workers"] == 0 and sum(reports["from_ps_tasks"]) > 0, t
print(f"status: {t['stats']['pushes_applied']} pushes, global step {t['global_step']}, "
      f"{sum(reports['from_ps_tasks'])} step reports from ps tasks")
PY
# A wrong secret: the task is named unreachable, and the exit code says so.
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$out/wrong"
chmod 600 "$out/wrong"
if "$TESSERA_BIN" status --cluster "$out/cluster.json" --secret-file "$out/wrong" \
    > "$out/wrong.txt"; then
  echo "status with a wrong secret succeeded"; exit 1
fi
grep -q "does not know the cluster secret" "$out/wrong.txt" ||
  { cat "$out/wrong.txt"; echo "status did not say why"; exit 1; }
echo "status: a wrong secret is refused, naming why"

# Shards and workers in network namespaces of their own, as bench/scaling.sh
# runs its tcp-netns points (bench/netns_cluster.sh): every byte crosses the
# veth pairs, the step's fabric peer runs in the shard's namespace, the shard
# ends by itself once the worker has left (exit 0), and nothing is left
# behind. Needs root for ip netns; says so where it cannot.
if [ "$(id -u)" -eq 0 ] && ip netns add "tsmoke$$" 2>/dev/null; then
  ip netns del "tsmoke$$"
  (
    tessera=$TESSERA_BIN
    source "$here/../bench/netns_cluster.sh"
    trap netns_down EXIT
    netns_up 1
    netns_bench 1 1 push pull --sizes 64K,1M --iters 5 --warmup 1 --check \
      --json "$out/netns.json" >/dev/null
    netns_bench 1 1 step --iters 3 --warmup 1 --model "$here/bench_smoke_model.txt" \
      --json "$out/netns-step.json" >/dev/null
    rx=$(ip -n "${netns_id}wk" -s -j link show eth0 |
      python3 -c 'import json, sys; print(json.load(sys.stdin)[0]["stats64"]["rx"]["bytes"])')
    python3 - "$out/netns.json" "$rx" "$out/netns-step.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
assert {r["scenario"] for r in rows} == {"push", "pull"}, rows
# The step's bound came from a fabric peer listening in the shard's namespace.
step = json.load(open(sys.argv[3]))
assert [r["scenario"] for r in step] == ["step"] and step[0]["baseline_us"] > 0, step
pulled = sum(r["bytes"] * r["batch"] for r in rows if r["scenario"] == "pull") * 6
rx = int(sys.argv[2])
assert rx >= pulled, f"the workers' namespace received {rx} bytes, less than the {pulled} pulled"
print(f"bench smoke: {len(rows)} rows across network namespaces, {rx} bytes over the veth")
PY
  )
  leftover=$(ip netns list | grep -c "^ts$(($$ % 100000))" || true)
  [ "$leftover" -eq 0 ] || { ip netns list; echo "network namespaces left behind"; exit 1; }
else
  echo "bench smoke: network namespaces not tried (needs root and ip netns)"
fi

# GPU buffers: measured where a GPU is (tools/device-check.sh); elsewhere the
# bench refuses, saying why.
if "$TESSERA_BIN" bench push --memory cuda --sizes 8 --iters 2 --warmup 0 \
    > "$out/gpu.txt" 2>&1; then
  echo "bench: --memory cuda ran (a GPU is here)"
else
  grep -q "bench: --memory cuda: " "$out/gpu.txt" || { cat "$out/gpu.txt"; exit 1; }
  echo "bench: --memory cuda refused: $(head -c 200 "$out/gpu.txt")"
fi
