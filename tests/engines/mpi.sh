#!/usr/bin/env bash
# tessera run under Open MPI's mpirun, as a user starts a job there:
#   mpirun -np 4 tessera run --ps 2 -- integration_worker
# (no address given: every rank is on this node, so rank 0 is found on
# loopback). The job trains to exact sums; then a SIGKILLed worker ends the
# job with an error naming it, and no process of the job is left.
# Exit 77 (skipped) where Open MPI is not installed.
set -uo pipefail
: "${TESSERA_BIN:?}" "${INTEGRATION_WORKER:?}"
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"
if ! command -v mpirun > /dev/null; then
  echo "mpi: SKIPPED: Open MPI's mpirun is not installed (Debian: openmpi-bin)"
  exit 77
fi
dir=$(mktemp -d)
trap 'kill_job mpi-train-$$; kill_job mpi-kill-$$; rm -rf "$dir"' EXIT
"$TESSERA_BIN" secret --out "$dir/secret" 2> /dev/null
export TESSERA_SECRET_FILE=$dir/secret
unset TESSERA_SECRET
fails=0
# Open MPI refuses root without these; --oversubscribe: 4 ranks on 2 cores.
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none)

echo "== mpi: 2 ps tasks, 2 workers, exact sums"
job=mpi-train-$$
if TESSERA_TEST_JOB=$job timeout 300 "${MPIRUN[@]}" -np 4 -x TESSERA_SECRET_FILE -x TESSERA_TEST_JOB \
  "$TESSERA_BIN" run --ps 2 -- "$INTEGRATION_WORKER" --tensors 40 > "$dir/train.log" 2>&1; then
  verified=$(grep -c "verified 40 tensors" "$dir/train.log")
  if [ "$verified" -ne 2 ]; then
    echo "FAIL: $verified of 2 workers verified their sums"
    fails=$((fails + 1))
  fi
  grep -q "(openmpi): is /job:ps/task:1" "$dir/train.log" ||
    { echo "FAIL: no rank said it serves as ps task 1"; fails=$((fails + 1)); }
else
  echo "FAIL: the job failed (exit $?)"
  fails=$((fails + 1))
fi
no_orphans "$job" 30 || fails=$((fails + 1))
[ $fails -eq 0 ] || cat "$dir/train.log"

echo "== mpi: a worker SIGKILLed in the middle of sync training"
job=mpi-kill-$$
start=$SECONDS
TESSERA_TEST_JOB=$job timeout 300 "${MPIRUN[@]}" -np 4 -x TESSERA_SECRET_FILE -x TESSERA_TEST_JOB \
  "$TESSERA_BIN" run --ps 2 -- "$INTEGRATION_WORKER" --sync-steps 1000000 > "$dir/kill.log" 2>&1 &
launched=$!
if wait_for_step "$dir/kill.log" 20 120; then
  killed_at=$SECONDS
  kill_one "$job" integration_worker || fails=$((fails + 1))
  wait "$launched"
  rc=$?
  echo "the job ended $((SECONDS - killed_at)) s after the kill, exit $rc"
  if [ "$rc" -eq 0 ]; then
    echo "FAIL: the job ended well although a worker was killed"
    fails=$((fails + 1))
  fi
  # mpirun aborts the job when it sees a rank killed, and says so.
  killed_worker_named "$dir/kill.log" "exited on signal 9" || fails=$((fails + 1))
else
  kill "$launched" 2> /dev/null
  wait "$launched"
  fails=$((fails + 1))
fi
no_orphans "$job" 30 || fails=$((fails + 1))
if [ $fails -ne 0 ]; then
  tail -n 40 "$dir/kill.log"
  exit 1
fi
echo "mpi: all passed ($((SECONDS - start)) s for the kill case)"
