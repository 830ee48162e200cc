#!/bin/sh
# The tests that need a real kernel RDMA stack. tests/rdma-vm/run starts this
# inside the Soft-RoCE VM (meson test --suite rdma-vm); BUILD is the build
# directory. Each step must pass; the first failure ends the run.
set -eu
BUILD=$1
# A sanitizer build under software emulation is slow: its run may ask for
# longer steps and a smaller integration test (see tools/dev.sh).
T="timeout ${TESSERA_VM_STEP_TIMEOUT:-300}"
WORKER_ARGS=${TESSERA_VM_WORKER_ARGS:-}
# Each step says when it starts (seconds since the suite began), so that a
# slow run shows where its time went.
started=$(date +%s)
step() { echo "=== rdma-vm (+$(($(date +%s) - started)) s): $*"; }
# TESSERA_VM_ONLY=cluster: only the cluster runs (CI repeats those beside a
# CPU hog); unset: every step.
only=${TESSERA_VM_ONLY:-}
# TESSERA_VM_SANITIZED=1 (tools/dev.sh, the ASan/UBSan run): under a
# sanitizer and emulation each process takes seconds just to start, so the
# steps that add no instrumented code of Tessera's are left out there, and
# the optimised build's run keeps them all:
# - tessera doctor: its checks run under ASan in the doctor test outside;
# - the cluster over UCX on rxe: its Tessera side is the UCX backend, which
#   the contract step runs on rc_verbs here and the cluster tests outside
#   run over UCX's tcp and shm; the rest is UCX's, not instrumented;
# - the bench: its figures mean nothing here, and its code is the
#   transport's and the client's, checked by the steps that do run.
sanitized=${TESSERA_VM_SANITIZED:-}
if [ -n "$only" ] && [ "$only" != cluster ]; then
  echo "rdma-vm: TESSERA_VM_ONLY='$only': expected 'cluster' or nothing" >&2
  exit 2
fi
if [ -z "$only" ]; then

step "transport contract on verbs and on UCX over rxe (rc_verbs)"
$T "$BUILD/tests/transport_test" --gtest_filter='*/verbs:*/ucx_rc_verbs:VerbsSelection.*'

step "a peer killed mid-transfer (alone: it forks before opening RDMA resources)"
$T "$BUILD/tests/transport_test" --gtest_filter='VerbsFailure.PeerKilledMidTransferFailsWithinBound'

step "registration past a 1 MiB locked-memory limit, without CAP_IPC_LOCK"
(
  ulimit -l 1024
  TESSERA_TEST_MEMLOCK_LIMITED=1 $T setpriv --inh-caps=-ipc_lock --bounding-set=-ipc_lock \
    "$BUILD/tests/transport_test" \
    --gtest_filter='VerbsFailure.RegistrationBeyondTheLockedMemoryLimitNamesUlimit'
)

step "the hardening cases over verbs: strangers, limits, refused calls, stuck and failed steps"
$T "$BUILD/tests/hardening_test" --gtest_filter='*/verbs'

step "a staging slot's key writes from its worker's queue pair only (a memory window)"
TESSERA_BIN="$BUILD/tools/tessera" $T "$BUILD/tests/security_test" \
  --gtest_filter='*AStagingKeyWritesFromItsOwnConnectionOnly/verbs'

if [ -z "$sanitized" ]; then
  step "tessera doctor sees rxe0 and tells the truth about it"
  "$BUILD/tools/tessera" doctor --json | python3 "$(dirname "$0")/doctor_check.py"
fi

fi

step "2 shards, 3 workers, mixed tensors, exact sums: verbs"
$T "$BUILD/tools/tessera" launch --ps 2 --workers 3 --transport verbs --host "$RDMA_VM_ADDR" \
  -- "$BUILD/tests/integration_worker" $WORKER_ARGS

if [ -n "$sanitized" ]; then
  step "all passed (doctor, the UCX cluster and the bench left out: TESSERA_VM_SANITIZED)"
  exit 0
fi

step "the same over UCX on rxe (rc_verbs)"
UCX_TLS=rc_verbs UCX_NET_DEVICES=rxe0:1 UCX_IB_GID_INDEX=1 \
  $T "$BUILD/tools/tessera" launch --ps 2 --workers 3 --transport ucx --host "$RDMA_VM_ADDR" \
  -- "$BUILD/tests/integration_worker" $WORKER_ARGS

if [ "$only" = cluster ]; then
  step "the cluster runs passed"
  exit 0
fi

step "tessera bench over verbs beside perftest (ib_write_bw, ib_read_bw, ib_send_lat)"
out=$(mktemp)
$T "$BUILD/tools/tessera" bench fabric push pull --transport verbs --host "$RDMA_VM_ADDR" \
  --sizes 8,64K --iters 3 --warmup 1 --baseline --check --json "$out"
python3 - "$out" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
compared = [r for r in rows if r["baseline"].startswith(("ib_", "2 x ib_"))]
assert len(compared) >= 6, [r["scenario"] for r in rows]
for r in compared:
    assert r["baseline_us"] > 0 and r["ratio"] > 0, r
print(f"bench: {len(compared)} rows beside perftest (figures are functional only here)")
PY

rm -f "$out"
step "all passed"
