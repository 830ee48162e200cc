#!/usr/bin/env bash
# Issue 17 item 5: aggregate push and pull bandwidth and the training step's
# time as parties are added on one host: 1 shard x 1-4 workers, and 1-4
# shards x 2 workers, over shm and Tessera's tcp (loopback), each point a
# separate `tessera bench` run. Beside them, single-thread memcpy's
# bandwidth from kernels_bench at the same size, measured in the same run:
# a push over shm costs at least two copies of every byte (into the shard's
# staging, then applied into the parameter), a pull one.
#   bench/scaling.sh OUT_PREFIX      (writes OUT_PREFIX.json and OUT_PREFIX.png)
# Each point is run ROUNDS times (rounds outermost, so a noisy spell of the
# machine hits every point) and the median of the rounds' figures is kept.
# Environment: ROUNDS (3), TESSERA (default build/tools/tessera), KERNELS_BENCH
# (build/bench/kernels_bench), PYTHON (.venv/bin/python3), SIZE (64M, memcpy's size),
# ITERS (20), MODEL (resnet50), TRANSPORTS ("shm tcp"), MAX (4).
set -euo pipefail
if [ $# -ne 1 ]; then
  sed -n '2,12p' "$0" >&2
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
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

point() {  # round transport shards workers
  echo "scaling: round $1, $2, $3 shard(s) x $4 worker(s)" >&2
  "$tessera" bench push pull --transport "$2" --shards "$3" --workers "$4" --sizes "$size" \
    --iters "$iters" --warmup 3 --json "$out/ops-$2-$3-$4-r$1.json" >/dev/null
  "$tessera" bench step --transport "$2" --shards "$3" --workers "$4" --model "$model" \
    --iters 10 --warmup 2 --json "$out/step-$2-$3-$4-r$1.json" >/dev/null
}
for r in $(seq "${ROUNDS:-3}"); do
  for t in ${TRANSPORTS:-shm tcp}; do
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
    for r in json.load(open(f)):
        rounds.setdefault((r["scenario"], r["transport"], r["shards"], r["workers"]), []).append(r)
rows = []
for runs in rounds.values():
    row = dict(runs[0])
    for k in ("gbps", "p50_us", "p99_us", "baseline_us", "baseline_gbps", "ratio"):
        row[k] = statistics.median(r[k] for r in runs)
    row["rounds"] = [{k: r[k] for k in ("gbps", "p50_us", "ratio")} for r in runs]
    rows.append(row)
for b in json.load(open(f"{out}/memcpy.json"))["benchmarks"]:
    if b.get("aggregate_name") == "median":
        rows.append({"scenario": "memcpy", "transport": "host", "bytes": 64 << 20,
                     "gbps": b["bytes_per_second"] / 1e9, "shards": 0, "workers": 0})
json.dump(rows, open(dst, "w"), indent=1)
PY
"$python" tools/plot_bench.py --scaling "$prefix.json" "$prefix.png"
"$python" - "$prefix.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
memcpy = [r["gbps"] for r in rows if r["scenario"] == "memcpy"]
print(f"memcpy 64 MiB, one thread: {memcpy[0]:.1f} GB/s" if memcpy else "memcpy: not measured")
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
