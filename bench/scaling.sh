#!/usr/bin/env bash
# Issue 17 item 5: aggregate push and pull bandwidth and the training step's
# time as parties are added on one host: 1 shard x 1-4 workers, and 1-4
# shards x 2 workers, over shm, Tessera's tcp on loopback, and Tessera's tcp
# with every shard and the workers in network namespaces of their own
# ("tcp-netns": veth pairs on a bridge, bench/netns_cluster.sh; needs root),
# each point a separate `tessera bench` run with shards of its own. Beside
# them, in the same run: single-thread memcpy's bandwidth from kernels_bench
# at the same size (a push over shm costs at least two copies of every byte,
# into the shard's staging, then applied into the parameter; a pull one),
# and for tcp one iperf3 stream each way.
#   bench/scaling.sh OUT_PREFIX      (writes OUT_PREFIX.json and OUT_PREFIX.png)
# Each point is run ROUNDS times (rounds outermost, so a noisy spell of the
# machine hits every point) and the median of the rounds' figures is kept.
# Environment: ROUNDS (3), TESSERA (default build/tools/tessera), KERNELS_BENCH
# (build/bench/kernels_bench), PYTHON (.venv/bin/python3), SIZE (64M, memcpy's size),
# ITERS (20), MODEL (resnet50), TRANSPORTS ("shm tcp tcp-netns"), MAX (4).
set -euo pipefail
if [ $# -ne 1 ]; then
  sed -n '2,17p' "$0" >&2
  exit 2
fi
prefix=$1
tessera=${TESSERA:-build/tools/tessera}
kernels=${KERNELS_BENCH:-build/bench/kernels_bench}
python=${PYTHON:-.venv/bin/python3}
size=${SIZE:-64M}
iters=${ITERS:-20}
model=${MODEL:-resnet50}
max=${MAX:-4}
transports=${TRANSPORTS:-shm tcp tcp-netns}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if [[ " $transports " == *" tcp-netns "* ]]; then
  source "$(dirname "$0")/netns_cluster.sh"
  trap 'netns_down; rm -rf "$out"' EXIT
  netns_up "$max"
fi

point() {  # round transport shards workers
  echo "scaling: round $1, $2, $3 shard(s) x $4 worker(s)" >&2
  if [ "$2" = tcp-netns ]; then
    netns_bench "$3" "$4" push pull --sizes "$size" --iters "$iters" --warmup 3 \
      --json "$out/ops-$2-$3-$4-r$1.json" >/dev/null
    netns_bench "$3" "$4" step --model "$model" --iters 10 --warmup 2 \
      --json "$out/step-$2-$3-$4-r$1.json" >/dev/null
    return
  fi
  "$tessera" bench push pull --transport "$2" --shards "$3" --workers "$4" --sizes "$size" \
    --iters "$iters" --warmup 3 --json "$out/ops-$2-$3-$4-r$1.json" >/dev/null
  "$tessera" bench step --transport "$2" --shards "$3" --workers "$4" --model "$model" \
    --iters 10 --warmup 2 --json "$out/step-$2-$3-$4-r$1.json" >/dev/null
}
# The raw fabric under Tessera's tcp: one iperf3 stream (a Debian package)
# of 1 MiB writes (its largest), worker to shard ("push") and back (-R, "pull"), on
# loopback and across the namespaces; the shard side on the first core and
# the worker side on the last, as the bench pins them. Skipped, saying so,
# where iperf3 is not installed.
iperf_point() {  # round transport
  local in_shard=() in_workers=() host=127.0.0.1 port=$((5201 + $1)) dir
  if [ "$2" = tcp-netns ]; then
    in_shard=(netns_in_shard 0)
    in_workers=(netns_in_workers)
    host=$(netns_shard_ip 0)
  fi
  local last=$(($(nproc) - 1))
  for dir in push pull; do
    "${in_shard[@]}" taskset -c 0 iperf3 --server --one-off --port "$port" >/dev/null &
    local server=$! deadline=$((SECONDS + 30))
    # iperf3's client does not retry: wait for the listener first.
    until "${in_shard[@]}" ss -ltnH "sport = :$port" | grep -q .; do
      ((SECONDS < deadline)) || { echo "scaling: iperf3 server did not listen" >&2; return 1; }
      sleep 0.05
    done
    "${in_workers[@]}" taskset -c "$last" iperf3 --client "$host" --port "$port" --time 3 \
      --len 1M $([ "$dir" = pull ] && echo --reverse) --json >"$out/iperf3_$2_${dir}_r$1.raw"
    wait "$server"
  done
}
have_iperf=0
if command -v iperf3 >/dev/null; then
  have_iperf=1
else
  echo "scaling: iperf3 not installed; the tcp rows go without their raw-socket bandwidth" >&2
fi
for r in $(seq "${ROUNDS:-3}"); do
  for t in $transports; do
    if ((have_iperf)) && [ "$t" != shm ]; then iperf_point "$r" "$t"; fi
    for w in $(seq "$max"); do point "$r" "$t" 1 "$w"; done
    for s in $(seq 2 "$max"); do point "$r" "$t" "$s" 2; done  # 1 x 2 is above
  done
done
"$kernels" --benchmark_filter='BM_Memcpy/67108864' --benchmark_repetitions=5 \
  --benchmark_report_aggregates_only=true --benchmark_format=json >"$out/memcpy.json"
"$python" - "$out" "$prefix.json" <<'PY'
import glob, json, statistics, sys
out, dst = sys.argv[1], sys.argv[2]
rounds = {}
for f in sorted(glob.glob(f"{out}/*-r*.json")):
    netns = "-tcp-netns-" in f  # the bench itself saw plain tcp
    for r in json.load(open(f)):
        if netns:
            r["transport"] = "tcp-netns"
        rounds.setdefault((r["scenario"], r["transport"], r["shards"], r["workers"]), []).append(r)
rows = []
for runs in rounds.values():
    row = dict(runs[0])
    for k in ("gbps", "p50_us", "p99_us", "baseline_us", "baseline_gbps", "ratio"):
        row[k] = statistics.median(r[k] for r in runs)
    row["rounds"] = [{k: r[k] for k in ("gbps", "p50_us", "ratio")} for r in runs]
    rows.append(row)
iperf = {}
for f in sorted(glob.glob(f"{out}/iperf3_*.raw")):
    _, transport, direction, _ = f.rsplit("/", 1)[1].split("_")
    end = json.load(open(f))["end"]
    iperf.setdefault((transport, direction), []).append(
        end["sum_received"]["bits_per_second"] / 8e9)
for (transport, direction), gbps in iperf.items():
    rows.append({"scenario": f"iperf3-{direction}", "transport": transport, "bytes": 64 << 20,
                 "gbps": statistics.median(gbps), "rounds": gbps, "shards": 0, "workers": 0})
for b in json.load(open(f"{out}/memcpy.json"))["benchmarks"]:
    if b.get("aggregate_name") == "median":
        rows.append({"scenario": "memcpy", "transport": "host", "bytes": 64 << 20,
                     "gbps": b["bytes_per_second"] / 1e9, "shards": 0, "workers": 0})
# Tessera's tcp figures depend on the host's congestion control (bbr over
# veth reorders and retransmits; see docs/PERFORMANCE.md, "Across network namespaces, and bbr"): say which.
cc = open("/proc/sys/net/ipv4/tcp_congestion_control").read().strip()
for r in rows:
    if r["transport"].startswith("tcp"):
        r["tcp_congestion_control"] = cc
json.dump(rows, open(dst, "w"), indent=1)
PY
"$python" tools/plot_bench.py --scaling "$prefix.json" "$prefix.png"
"$python" - "$prefix.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
memcpy = [r["gbps"] for r in rows if r["scenario"] == "memcpy"]
print(f"memcpy 64 MiB, one thread: {memcpy[0]:.1f} GB/s" if memcpy else "memcpy: not measured")
print("tcp congestion control:",
      next((r["tcp_congestion_control"] for r in rows if "tcp_congestion_control" in r), "-"))
for r in rows:
    if r["scenario"].startswith("iperf3-"):
        print(f'{r["scenario"]}, {r["transport"]}, one stream: {r["gbps"]:.2f} GB/s')
print("| transport | shards | workers | push GB/s | pull GB/s | step ms | step / bound |")
print("|---|---:|---:|---:|---:|---:|---:|")
pts = {}
for r in rows:
    if r["scenario"] in ("push", "pull", "step"):
        pts.setdefault((r["transport"], r["shards"], r["workers"]), {})[r["scenario"]] = r
for (t, s, w), by in sorted(pts.items()):
    g = lambda k: f'{by[k]["gbps"]:.2f}' if k in by else "-"
    st = by.get("step")
    print(f"| {t} | {s} | {w} | {g('push')} | {g('pull')} | "
          + (f'{st["p50_us"] / 1e3:.1f} | {st["ratio"]:.2f}× |' if st else "- | - |"))
PY
