#!/usr/bin/env bash
# tessera run under a real Slurm: munge, slurmctld and slurmd (Debian's
# slurm-wlm) configured in a temporary directory and started here, then
#   sbatch deploy/slurm/sync_sums.sbatch: srun tessera run --ps 2 -- integration_worker
# The job trains to exact sums and Slurm's own job-completion record says
# COMPLETED, exit 0; then a SIGKILLed worker ends the job FAILED with an
# error naming the task, and no process of the job is left. Exit 77
# (skipped) where Slurm or munge is not installed.
set -uo pipefail
: "${TESSERA_BIN:?}" "${INTEGRATION_WORKER:?}" "${BUILD_ROOT:?}"
here=$(cd "$(dirname "$0")" && pwd)
. "$here/common.sh"
for tool in munged slurmctld slurmd sbatch srun sinfo; do
  if ! command -v "$tool" > /dev/null; then
    echo "slurm: SKIPPED: $tool is not installed (Debian: slurmctld slurmd slurm-client munge)"
    exit 77
  fi
done
dir=$(mktemp -d)
chmod 700 "$dir"  # munged checks that nobody else may write its files' directory
stop_slurm() {
  local f
  kill_job "slurm-train-$$"
  kill_job "slurm-kill-$$"
  for f in slurmd slurmctld munged; do
    [ -f "$dir/$f.pid" ] && kill "$(cat "$dir/$f.pid")" 2> /dev/null
  done
  for f in slurmd slurmctld munged; do
    while kill -0 "$(cat "$dir/$f.pid" 2> /dev/null)" 2> /dev/null; do sleep 0.1; done
  done
  rm -rf "$dir"
}
trap stop_slurm EXIT
# Two ports at once, both bound while picked: two picks in a row could give
# the same one.
read -r ctld_port slurmd_port < <(python3 -c 'import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))')

# munge, with a key and a socket of this test's own.
dd if=/dev/urandom of="$dir/munge.key" bs=1024 count=1 2> /dev/null
chmod 400 "$dir/munge.key"
munged -f --key-file="$dir/munge.key" --socket="$dir/munge.sock" --pid-file="$dir/munged.pid" \
  --log-file="$dir/munged.log" --seed-file="$dir/munged.seed" || { echo "FAIL: munged"; exit 1; }

# One node, "localhost" (resolvable wherever this runs), four task slots.
mkdir -p "$dir/state" "$dir/spool"
cat > "$dir/slurm.conf" << CONF
ClusterName=tessera-test
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge.sock
CredType=cred/munge
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/linear
ReturnToService=2
KillWait=5
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/jobcomp.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SlurmdParameters=config_overrides
NodeName=localhost NodeAddr=127.0.0.1 CPUs=4 RealMemory=1000 State=UNKNOWN
PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
export SLURM_CONF=$dir/slurm.conf
slurmctld -f "$SLURM_CONF" || { echo "FAIL: slurmctld"; cat "$dir/slurmctld.log"; exit 1; }
slurmd -f "$SLURM_CONF" -N localhost || { echo "FAIL: slurmd"; cat "$dir/slurmd.log"; exit 1; }
end=$((SECONDS + 60))
until [ "$(sinfo -h -o %T 2> /dev/null)" = idle ]; do
  if ((SECONDS >= end)); then
    echo "FAIL: the Slurm node did not come up"
    sinfo
    tail -n 20 "$dir/slurmctld.log" "$dir/slurmd.log"
    exit 1
  fi
  sleep 0.2
done
echo "slurm: slurmctld and slurmd up ($(sinfo -h -o '%P %D %T'))"

"$TESSERA_BIN" secret --out "$dir/secret" 2> /dev/null
export TESSERA_SECRET_FILE=$dir/secret
unset TESSERA_SECRET
fails=0
# The job's state and exit code, from Slurm's job-completion record.
record_of() { grep "JobId=$1 " "$dir/jobcomp.log" 2> /dev/null; }
submit() {  # submit NAME WORKER_ARGS: deploy/slurm/sync_sums.sbatch; its job id printed
  TESSERA_TEST_JOB=$job WORKER_ARGS=$2 sbatch --parsable -J "$1" -o "$dir/$1.log" --export=ALL \
    "$here/../../deploy/slurm/sync_sums.sbatch"
}
wait_job() {  # wait_job ID LIMIT: until Slurm recorded its end
  local end=$((SECONDS + $2))
  until record_of "$1" > /dev/null; do
    ((SECONDS < end)) || { echo "FAIL: job $1 did not end within $2 s"; return 1; }
    sleep 0.2
  done
}

echo "== slurm: 2 ps tasks, 2 workers, exact sums"
job=slurm-train-$$
id=$(submit train "--tensors 40")
if wait_job "$id" 300; then
  record=$(record_of "$id")
  echo "$record" | grep -o "JobState=[A-Z]* .*ExitCode=[0-9:]*" | sed 's/ Partition.*Exit/ ... Exit/'
  if ! grep -q "JobState=COMPLETED" <<< "$record" || ! grep -q " ExitCode=0:0" <<< "$record"; then
    echo "FAIL: Slurm did not record the job COMPLETED with exit 0"
    fails=$((fails + 1))
  fi
  verified=$(grep -c "verified 40 tensors" "$dir/train.log")
  [ "$verified" -eq 2 ] || { echo "FAIL: $verified of 2 workers verified"; fails=$((fails + 1)); }
  grep -q "(slurm): is /job:ps/task:1" "$dir/train.log" ||
    { echo "FAIL: no rank serves as ps task 1"; fails=$((fails + 1)); }
else
  fails=$((fails + 1))
fi
no_orphans "$job" 30 || fails=$((fails + 1))
[ $fails -eq 0 ] || cat "$dir/train.log"

echo "== slurm: a worker SIGKILLed in the middle of sync training"
job=slurm-kill-$$
id=$(submit kill "--sync-steps 1000000")
if wait_for_step "$dir/kill.log" 20 120; then
  killed_at=$SECONDS
  kill_one "$job" integration_worker || fails=$((fails + 1))
  if wait_job "$id" 120; then
    record=$(record_of "$id")
    echo "the job ended $((SECONDS - killed_at)) s after the kill: $(grep -o "JobState=[A-Z]*" <<< "$record"), $(grep -o " ExitCode=[0-9:]*" <<< "$record")"
    grep -q "JobState=COMPLETED" <<< "$record" &&
      { echo "FAIL: Slurm recorded the job COMPLETED although a worker was killed"; fails=$((fails + 1)); }
    # srun says which task was killed.
    killed_worker_named "$dir/kill.log" "task [0-9]+: Killed" || fails=$((fails + 1))
  else
    fails=$((fails + 1))
  fi
else
  scancel "$id"
  fails=$((fails + 1))
fi
no_orphans "$job" 30 || fails=$((fails + 1))
if [ $fails -ne 0 ]; then
  tail -n 40 "$dir/kill.log"
  exit 1
fi
echo "== slurm: deploy.md's example, the secret in a file"
# As the docs show it: from a directory where build/ is the build, with
# the build's tessera first on PATH.
doc_dir=$dir/doc
mkdir -p "$doc_dir"
ln -s "$BUILD_ROOT" "$doc_dir/build"
block=$(python3 "$here/../docs_commands.py" --print by-engine-slurm "$here/../..")
if ! (cd "$doc_dir" && env -u TESSERA_SECRET_FILE PATH="$(dirname "$TESSERA_BIN"):$PATH" \
        timeout 180 bash -euo pipefail -c "$block") > "$dir/doc.log" 2>&1; then
  tail -n 40 "$dir/doc.log"
  echo "FAIL: deploy.md's Slurm example"
  exit 1
fi
grep -q "global step 30$" "$dir/doc.log" ||
  { tail -n 20 "$dir/doc.log"; echo "FAIL: the example did not reach global step 30"; exit 1; }
grep -m1 "global step 30$" "$dir/doc.log"
# The multi-node example at least parses.
bash -n "$here/../../deploy/slurm/train.sbatch" || { echo "FAIL: deploy/slurm/train.sbatch"; exit 1; }
echo "slurm: all passed"
