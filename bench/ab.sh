#!/usr/bin/env bash
# A/B of two builds of `tessera` in the same minutes: the same `tessera bench`
# arguments run with OLD, then NEW, N rounds alternating (so that a noisy
# spell of the machine hits both), then each point's median p50 per build and
# their ratio, with a bootstrap 90% interval of that ratio and every
# round's figure, and the median p99 per build.
#   bench/ab.sh OLD_TESSERA NEW_TESSERA [bench arguments...]     (N=3 rounds)
# e.g. build the previous main into /tmp/old (git worktree add /tmp/old-src
# main~1; meson setup /tmp/old /tmp/old-src; ninja -C /tmp/old tools/tessera),
# then: N=5 bench/ab.sh /tmp/old/tools/tessera build/tools/tessera push pull \
#   --transport shm --transport tcp --sizes 8,1M --iters 100
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n '2,10p' "$0" >&2
  exit 2
fi
old=$1 new=$2
shift 2
rounds=${N:-3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for r in $(seq "$rounds"); do
  for v in old new; do
    bin=$old
    [ "$v" = new ] && bin=$new
    "$bin" bench "$@" --json "$out/$v.$r.json" >/dev/null
  done
done
python3 - "$out" "$rounds" <<'PY'
import json, random, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])


def interval(o, n, draws=2000):
    """A bootstrap 90% interval of the ratio of medians: the rounds of each
    build drawn again with replacement. Where it straddles 1.00 the rounds
    do not tell the builds apart; where it is wide the machine needs more."""
    rng = random.Random(0)
    ratios = sorted(statistics.median(rng.choices(n, k=len(n))) /
                    statistics.median(rng.choices(o, k=len(o))) for _ in range(draws))
    return ratios[int(0.05 * draws)], ratios[int(0.95 * draws) - 1]

points = {}
for v in ("old", "new"):
    for r in range(1, rounds + 1):
        for row in json.load(open(f"{out}/{v}.{r}.json")):
            # --load: the quiet and the loaded figure of a point apart.
            key = (row["scenario"], row["transport"] + (" + hog" if row.get("load") == "hog" else ""),
                   row["bytes"], row["batch"])
            points.setdefault(key, {}).setdefault(v, []).append(row)
def us(x):
    """Two decimals below 10 µs: one would hide a 5% change at 1.3 µs."""
    return f"{x:.2f}" if x < 10 else f"{x:.1f}"


print("| scenario | transport | bytes | batch | old p50 µs | new p50 µs | new/old | 90% interval | old rounds | new rounds | p99 µs old → new | allocs/op old → new |")
print("|---|---|---:|---:|---:|---:|---:|---|---|---|---|---|")
for (scenario, transport, size, batch), by in points.items():
    o = [x["p50_us"] for x in by.get("old", [])]
    n = [x["p50_us"] for x in by.get("new", [])]
    if not o or not n:
        continue
    mo, mn = statistics.median(o), statistics.median(n)
    allocs = lambda rows: statistics.median(x.get("allocs_per_op", -1) for x in rows)
    p99 = lambda rows: statistics.median(x["p99_us"] for x in rows)
    lo, hi = interval(o, n)
    print(f"| {scenario} | {transport} | {size} | {batch} | {us(mo)} | {us(mn)} | {mn / mo:.2f} | "
          f"{lo:.2f}-{hi:.2f} | "
          f"{', '.join(us(x) for x in o)} | {', '.join(us(x) for x in n)} | "
          f"{us(p99(by['old']))} → {us(p99(by['new']))} | "
          f"{allocs(by['old']):.1f} → {allocs(by['new']):.1f} |")
PY
