#!/bin/sh
# `tessera doctor` on this machine: its JSON must agree with what the system
# reports (tests/doctor_check.py); the plain output must name every check.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
"$TESSERA_BIN" doctor --json | python3 "$here/doctor_check.py"
out=$("$TESSERA_BIN" doctor || true)
for check in rdma-devices locked-memory ucx tcp-congestion session-protection gpu-registration addresses; do
  echo "$out" | grep -q "$check:" || { echo "doctor's output lacks $check"; exit 1; }
done
# A congestion control the kernel refuses is a problem, named; one it takes is ok.
json=$(mktemp)
trap 'rm -f "$json"' EXIT
for cc in no-such-cc reno; do
  TESSERA_TCP_CONGESTION=$cc "$TESSERA_BIN" doctor --json > "$json" || true
  python3 - "$json" "$cc" <<'PY'
import json, sys
cc = sys.argv[2]
f = {f["check"]: f for f in json.load(open(sys.argv[1]))}["tcp-congestion"]
if cc == "no-such-cc":
    assert f["level"] == "problem" and f"'{cc}'" in f["detail"] and f["fix"], f
else:
    assert f["level"] == "ok" and f["data"]["tessera"] == cc and f["data"]["from_environment"], f
print(f"doctor: TESSERA_TCP_CONGESTION={cc}: {f['level']}")
PY
done
# Each session protection setting is said as what it is; one that is none is a problem.
for sp in on integrity off maybe; do
  TESSERA_SESSION_PROTECTION=$sp "$TESSERA_BIN" doctor --json > "$json.sp" || true
  python3 - "$json.sp" "$sp" <<'PY'
import json, sys
sp = sys.argv[2]
f = {f["check"]: f for f in json.load(open(sys.argv[1]))}["session-protection"]
want = {"on": "ok", "integrity": "ok", "off": "warn", "maybe": "problem"}[sp]
assert f["level"] == want, f
assert sp == "maybe" or f["data"]["setting"] == sp, f
print(f"doctor: TESSERA_SESSION_PROTECTION={sp}: {f['level']}")
PY
done
rm -f "$json.sp"
