# What the engine tests (tests/engines/*.sh) share: a job's cluster read
# from its tasks' output, waiting for training to be under way, killing one
# task, and checking that no process of the job is left.
#
# Every process of a job carries TESSERA_TEST_JOB=<its name> in its
# environment, so that the orphan check finds exactly the job's processes.
# The test gives it to the job's command only (never exports it itself):
# its own helpers must not carry it.

# The cluster spec `tessera run` printed for the job, into FILE; false until
# it is in LOG.
cluster_from_log() {  # cluster_from_log LOG FILE
  local line
  line=$(grep -m1 -o 'cluster {.*}$' "$1" 2>/dev/null) || return 1
  printf '%s\n' "${line#cluster }" > "$2"
}

# Waits (at most LIMIT seconds) until the job's global step reaches STEP,
# asking the running cluster (tessera status) as a user would.
wait_for_step() {  # wait_for_step LOG STEP LIMIT
  local log=$1 want=$2 limit=$3 spec step
  spec=$(mktemp)
  local end=$((SECONDS + limit))
  while ((SECONDS < end)); do
    if cluster_from_log "$log" "$spec"; then
      step=$("$TESSERA_BIN" status --cluster "$spec" --json 2> /dev/null |
        python3 -c 'import json,sys; print(max((t.get("global_step", 0) for t in json.load(sys.stdin)), default=0))' \
          2> /dev/null)
      if [[ "$step" =~ ^[0-9]+$ ]] && [ "$step" -ge "$want" ]; then
        rm -f "$spec"
        return 0
      fi
    fi
    sleep 0.2  # the next look at the cluster
  done
  rm -f "$spec"
  echo "FAIL: the job did not reach global step $want within $limit s"
  return 1
}

# The pids of the job's processes (those carrying its marker), one per line.
job_pids() {  # job_pids JOB
  local e
  for e in /proc/[0-9]*/environ; do
    if tr '\0' '\n' 2> /dev/null < "$e" | grep -qx "TESSERA_TEST_JOB=$1"; then
      e=${e#/proc/}
      echo "${e%/environ}"
    fi
  done 2> /dev/null
}

# SIGKILLs one of the job's processes whose program is NAME (its
# executable's file name: not a launcher that has NAME among its arguments).
kill_one() {  # kill_one JOB NAME
  local pid exe
  for pid in $(job_pids "$1"); do
    exe=$(readlink "/proc/$pid/exe" 2> /dev/null) || continue
    if [ "${exe##*/}" = "$2" ]; then
      echo "killing $pid: $(tr '\0' ' ' 2> /dev/null < "/proc/$pid/cmdline")"
      kill -KILL "$pid"
      return 0
    fi
  done
  echo "FAIL: no process of the job runs $2"
  return 1
}

# No process of the job is left (waits up to LIMIT seconds for them to go).
no_orphans() {  # no_orphans JOB LIMIT
  local end=$((SECONDS + $2)) left
  while true; do
    left=$(job_pids "$1" | tr '\n' ' ')
    [ -z "$left" ] && return 0
    if ((SECONDS >= end)); then
      echo "FAIL: processes of the job are left: $left"
      ps -o pid,ppid,stat,args -p "$(echo $left | tr ' ' ',')" 2> /dev/null || true
      return 1
    fi
    sleep 0.2
  done
}

# SIGKILLs whatever of the job is left (a test's cleanup, after a failure).
kill_job() {  # kill_job JOB
  local pid
  for pid in $(job_pids "$1"); do kill -KILL "$pid" 2> /dev/null; done
}

# The killed worker is named in LOG: by the survivors (the other worker's
# step, the ps tasks' verdict), or by the engine itself (ENGINE_SAYS, a
# regular expression), which may end the job before they say it. Shows the
# first lines that name it.
killed_worker_named() {  # killed_worker_named LOG ENGINE_SAYS
  local said="(/job:worker/task:[01] disconnected|left without saying bye|$2)"
  if ! grep -qE "$said" "$1"; then
    echo "FAIL: nothing named the killed worker"
    return 1
  fi
  grep -hE "$said" "$1" | head -3 || true  # only shown: head may cut grep off
  return 0
}
