"""Reads `tessera doctor --json` from stdin and checks that it tells the truth
about this machine: RDMA devices as /sys/class/infiniband lists them, the
locked-memory limit as resource.getrlimit reports it, UCX's version."""
import json
import os
import resource
import sys

findings = {f["check"]: f for f in json.load(sys.stdin)}
want = {"rdma-devices", "locked-memory", "ucx", "tcp-congestion", "session-protection",
        "gpu-registration", "addresses"}
assert set(findings) == want, f"checks: {sorted(findings)}"

sys_devices = sorted(os.listdir("/sys/class/infiniband")) if os.path.isdir(
    "/sys/class/infiniband") else []
rdma = findings["rdma-devices"]
if sys_devices:
    named = sorted(d["name"] for d in rdma["data"].get("devices", []))
    assert named == sys_devices, (named, sys_devices)
    assert rdma["level"] == "ok", rdma
else:
    assert rdma["level"] in ("problem", "info"), rdma  # none, or a build without verbs

soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
limit = findings["locked-memory"]["data"]["limit_bytes"]
assert limit == (-1 if soft == resource.RLIM_INFINITY else soft), (limit, soft)

assert findings["ucx"]["data"]["version"].startswith("1."), findings["ucx"]
cc = findings["tcp-congestion"]
host = open("/proc/sys/net/ipv4/tcp_congestion_control").read().strip()
assert cc["data"]["host_default"] == host, (cc, host)
if "TESSERA_TCP_CONGESTION" not in os.environ:
    assert cc["data"]["tessera"] == host and cc["level"] == ("warn" if host == "bbr" else "ok"), cc
sp = findings["session-protection"]
setting = os.environ.get("TESSERA_SESSION_PROTECTION") or "auto"
assert sp["data"]["setting"] == setting and sp["data"]["seal_gbps_one_core"] > 0, sp
assert sp["level"] == ("warn" if setting == "off" else "ok"), sp
ifaces = {i["name"] for i in findings["addresses"]["data"].get("interfaces", [])}
assert "lo" in ifaces, ifaces
print(f"doctor: {len(findings)} checks agree with this machine (RDMA devices: {sys_devices})")
