#!/usr/bin/env bash
# Heap allocations per call in steady state, as `tessera bench` counts them in
# the worker's process and in the shard's (its alloc/op column: worker/shard;
# the shard's count comes from its status, tools/bench_shard_allocations.cc),
# held under a ceiling so that they cannot creep back. The target is 0 (issue 17, item 3); each ceiling is
# what the call makes today plus headroom for the background's share
# (heartbeats), and comes down as the hot path loses its allocations.
set -euo pipefail
if [ "${TESSERA_SANITIZER:-none}" != none ]; then
  # Under ASan core/pool_allocator.h hands every block back to the heap, so
  # that ASan sees each free; the counts held here are the plain build's.
  echo "SKIP: allocations are counted in the build without sanitizers (this one: $TESSERA_SANITIZER)"
  exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$TESSERA_BIN" bench push pull push_pull --transport shm --transport tcp --sizes 8,1M \
  --iters 200 --warmup 20 --json "$out/bench.json" >/dev/null
python3 - "$out/bench.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
# (scenario, bytes, transport): the most allocations a call may make:
# today's figure and half an allocation, so that a single new one fails.
# A small call allocates nothing on either side (session 18: the encoded
# message from the pool, tcp's send queue a ring that keeps its storage).
today = {("push", 8, "shm"): 0, ("push", 8, "tcp"): 0,
         ("pull", 8, "shm"): 0, ("pull", 8, "tcp"): 0,
         ("push_pull", 8, "shm"): 0, ("push_pull", 8, "tcp"): 0,
         ("push", 1 << 20, "shm"): 5, ("push", 1 << 20, "tcp"): 5,
         ("pull", 1 << 20, "shm"): 2, ("pull", 1 << 20, "tcp"): 3,
         ("push_pull", 1 << 20, "shm"): 7, ("push_pull", 1 << 20, "tcp"): 8}
# A large call over UCX allocates per UCX request that does not complete at
# once (its completion's closure), which depends on the UCX version: with
# CI's UCX 1.22 (libucx-cu12) the 1 MiB shm calls make UCX_1_22_SHM where
# Debian's 1.13 makes the figures above. Both are held; the larger is the
# ceiling.
UCX_1_22_SHM = {"push": 11, "pull": 5, "push_pull": 16}
for call, n in UCX_1_22_SHM.items():
    today[(call, 1 << 20, "shm")] = max(today[(call, 1 << 20, "shm")], n)
# The shard's process, per call: nothing for a small call or a large push;
# a large pull's lease (its entry, its task's name and keys) remains.
shard_today = {("push", 8, "shm"): 0, ("push", 8, "tcp"): 0,
               ("pull", 8, "shm"): 0, ("pull", 8, "tcp"): 0,
               ("push_pull", 8, "shm"): 0, ("push_pull", 8, "tcp"): 0,
               ("push", 1 << 20, "shm"): 0, ("push", 1 << 20, "tcp"): 0,
               ("pull", 1 << 20, "shm"): 4, ("pull", 1 << 20, "tcp"): 4,
               ("push_pull", 1 << 20, "shm"): 4, ("push_pull", 1 << 20, "tcp"): 4}
ceiling = {k: v + 0.5 for k, v in today.items()}
shard_ceiling = {k: v + 0.5 for k, v in shard_today.items()}
bad = []
for r in rows:
    key = (r["scenario"], r["bytes"], r["transport"])
    if key not in ceiling:
        continue
    a = r["allocs_per_op"]
    sa = r.get("shard_allocs_per_op", -1)
    print(f'{r["scenario"]:10s} {r["transport"]:4s} {r["bytes"]:8d} B: {a:5.1f} allocations '
          f'per call in the worker (ceiling {ceiling[key]}), {sa:5.1f} in the shard '
          f'(ceiling {shard_ceiling[key]})')
    if a < 0 or a > ceiling[key]:
        bad.append(f'{r["scenario"]} of {r["bytes"]} B over {r["transport"]}: {a} allocations '
                   f'per call in the worker, above the ceiling of {ceiling[key]}')
    if sa < 0 or sa > shard_ceiling[key]:
        bad.append(f'{r["scenario"]} of {r["bytes"]} B over {r["transport"]}: {sa} allocations '
                   f'per call in the shard (-1: not counted), above the ceiling of '
                   f'{shard_ceiling[key]}')
seen = {(r["scenario"], r["bytes"], r["transport"]) for r in rows}
assert len(seen) == 12, f"expected 12 rows, got {sorted(seen)}"
if bad:
    sys.exit("allocations crept back onto the hot path:\n  " + "\n  ".join(bad))
PY
