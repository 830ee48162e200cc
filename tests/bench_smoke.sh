#!/usr/bin/env bash
# A few seconds of `tessera bench` so the tool cannot rot: every scenario on
# tcp with --check, its JSON read back, and the plot drawn where matplotlib
# is installed (.venv, made by tools/dev.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
plot=()
if "$here/../.venv/bin/python" -c "import matplotlib" 2>/dev/null; then
  plot=(--plot "$out/bench.png")
fi
"$TESSERA_BIN" bench fabric push pull push_pull step --transport tcp --sizes 8,64K \
  --batch 1,4 --iters 5 --warmup 1 --check --model "$here/bench_smoke_model.txt" \
  --json "$out/bench.json" "${plot[@]}"
python3 - "$out/bench.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
seen = {r["scenario"] for r in rows}
want = {"fabric-put", "fabric-get", "fabric-msg-rtt", "push", "pull", "push_pull", "step"}
assert want <= seen, f"missing scenarios: {want - seen}"
for r in rows:
    assert r["p50_us"] > 0, r
    if r["scenario"] in ("push", "pull", "push_pull"):
        assert r["allocs_per_op"] >= 0, r
batches = {r["batch"] for r in rows if r["scenario"] == "push"}
assert batches == {1, 4}, batches
print(f"bench smoke: {len(rows)} rows, scenarios {sorted(seen)}")
PY
if [ ${#plot[@]} -gt 0 ]; then
  test -s "$out/bench.png" || { echo "no plot written"; exit 1; }
  echo "bench smoke: plot drawn"
else
  echo "bench smoke: no matplotlib in .venv; plot not drawn"
fi
