#!/usr/bin/env python3
"""Kubernetes without Kubernetes: the pods of deploy/k8s's manifests, each a
process in its own network namespace ("pod") on a bridge, with the names a
cluster's DNS would give them resolvable (/etc/netns/POD/hosts, which
`ip netns exec` mounts over /etc/hosts), their environment rendered as the
kubelet does (fieldRef, $(VAR) expansion, secrets as files), and a TFJob's
TF_CONFIG written as Kubeflow's training operator writes it.

What is simulated, and what is not: the images. A container's `tessera`
is this build's, and the trainer's command (python3 /app/train.py) is
replaced by tests/integration_worker, which checks exact sums; the image's
ENV is the test's sanitizer and UCX settings (image_env). Volume
mounts are mapped to directories of the test (a secret's keys as files, a
claim as one directory every pod shares), and paths in the environment
and command follow them.

  k8s_sim.py --scenario plain|tfjob|kill DEPLOY_DIR TESSERA_BIN INTEGRATION_WORKER

Exit 0 when the scenario holds, 1 when it does not, 77 when network
namespaces cannot be made here.
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import yaml

NAMESPACE = "default"


class Pod:
    def __init__(self, name, hostname, subdomain, labels, annotations, spec, role):
        self.name, self.hostname, self.subdomain = name, hostname, subdomain
        self.labels, self.annotations, self.spec, self.role = labels, annotations, spec, role
        self.extra_env = {}  # what the controller adds (TF_CONFIG from the operator)
        self.ip = None
        self.netns = None
        self.proc = None
        self.output = []

    def dns_names(self):
        names = [self.hostname]
        if self.subdomain:
            names += [f"{self.hostname}.{self.subdomain}",
                      f"{self.hostname}.{self.subdomain}.{NAMESPACE}.svc",
                      f"{self.hostname}.{self.subdomain}.{NAMESPACE}.svc.cluster.local"]
        else:  # a Service per pod, named as the pod (Kubeflow's operator)
            names += [f"{self.hostname}.{NAMESPACE}.svc",
                      f"{self.hostname}.{NAMESPACE}.svc.cluster.local"]
        return names


def documents(deploy_dir, files):
    docs = []
    for f in files:
        with open(os.path.join(deploy_dir, f)) as stream:
            docs += [d for d in yaml.safe_load_all(stream) if d]
    return docs


def statefulset_pods(doc):
    spec = doc["spec"]
    name = doc["metadata"]["name"]
    pods = []
    for i in range(spec.get("replicas", 1)):
        t = spec["template"]
        labels = dict(t["metadata"].get("labels", {}), **{"apps.kubernetes.io/pod-index": str(i)})
        pods.append(Pod(f"{name}-{i}", f"{name}-{i}", spec["serviceName"], labels,
                        dict(t["metadata"].get("annotations", {})), t["spec"], f"{name}-{i}"))
    return pods


def indexed_job_pods(doc):
    spec = doc["spec"]
    assert spec.get("completionMode") == "Indexed", "an Indexed Job"
    name = doc["metadata"]["name"]
    pods = []
    for i in range(spec["completions"]):
        t = spec["template"]
        ann = dict(t["metadata"].get("annotations", {}),
                   **{"batch.kubernetes.io/job-completion-index": str(i)})
        pod = Pod(f"{name}-{i}", f"{name}-{i}", t["spec"].get("subdomain"),
                  dict(t["metadata"].get("labels", {})), ann, t["spec"], f"{name}-{i}")
        pod.extra_env["JOB_COMPLETION_INDEX"] = str(i)
        pods.append(pod)
    return pods


def tfjob_pods(doc):
    """The pods of a TFJob and their TF_CONFIG, as Kubeflow's training
    operator makes them: a pod and a Service NAME-TYPE-I per replica, the
    cluster of every type but the evaluator's, addresses NAME-TYPE-I.NS.svc
    on the tfjob-port."""
    name = doc["metadata"]["name"]
    specs = doc["spec"]["tfReplicaSpecs"]
    cluster = {}
    for rtype, rspec in specs.items():
        if rtype.lower() == "evaluator":
            continue  # not part of the training cluster
        port = 2222
        for c in rspec["template"]["spec"]["containers"]:
            for p in c.get("ports", []):
                if p.get("name") == "tfjob-port":
                    port = p["containerPort"]
        cluster[rtype.lower()] = [f"{name}-{rtype.lower()}-{i}.{NAMESPACE}.svc:{port}"
                                  for i in range(rspec.get("replicas", 1))]
    pods = []
    for rtype, rspec in specs.items():
        for i in range(rspec.get("replicas", 1)):
            host = f"{name}-{rtype.lower()}-{i}"
            pod = Pod(host, host, None, {}, {}, rspec["template"]["spec"], host)
            pod.extra_env["TF_CONFIG"] = json.dumps(
                {"cluster": cluster, "task": {"type": rtype.lower(), "index": i},
                 "environment": "cloud"})
            pods.append(pod)
    return pods


def expand(text, env):
    """Kubernetes' $(VAR) expansion: defined names are replaced, $$ is a $,
    anything else stays as written."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def field(pod, path):
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        return (pod.labels if m.group(1) == "labels" else pod.annotations)[m.group(2)]
    return {"metadata.name": pod.name, "metadata.namespace": NAMESPACE,
            "status.podIP": pod.ip}[path]


class Cluster:
    def __init__(self, work, secrets, tessera, substitutes):
        self.work, self.secrets, self.tessera = work, secrets, tessera
        self.substitutes = substitutes  # pod name prefix -> the command run instead
        self.id = f"k{os.getpid() % 100000}"
        self.switch = f"{self.id}sw"
        self.pods = []

    # --- the network ---------------------------------------------------------
    def up(self, pods):
        self.pods = pods
        run(["ip", "netns", "add", self.switch])
        run(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
        run(["ip", "-n", self.switch, "link", "set", "br0", "up"])
        subnet = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}."
        for n, pod in enumerate(pods, start=1):
            pod.netns = f"{self.id}p{n}"
            pod.ip = f"{subnet}{n}"
            run(["ip", "netns", "add", pod.netns])
            run(["ip", "link", "add", f"{self.id}v{n}", "type", "veth", "peer", "name",
                 f"{self.id}b{n}"])
            run(["ip", "link", "set", f"{self.id}v{n}", "netns", pod.netns])
            run(["ip", "link", "set", f"{self.id}b{n}", "netns", self.switch])
            run(["ip", "-n", self.switch, "link", "set", f"{self.id}b{n}", "master", "br0", "up"])
            run(["ip", "-n", pod.netns, "link", "set", f"{self.id}v{n}", "name", "eth0"])
            run(["ip", "-n", pod.netns, "addr", "add", f"{pod.ip}/24", "dev", "eth0"])
            run(["ip", "-n", pod.netns, "link", "set", "eth0", "up"])
            run(["ip", "-n", pod.netns, "link", "set", "lo", "up"])
        # The cluster's DNS: every pod's names, in every pod's /etc/hosts.
        hosts = "127.0.0.1 localhost\n" + "".join(
            f"{p.ip} {' '.join(p.dns_names())}\n" for p in pods)
        for pod in pods:
            d = f"/etc/netns/{pod.netns}"
            os.makedirs(d, exist_ok=True)
            with open(f"{d}/hosts", "w") as f:
                f.write(hosts)

    def down(self):
        for pod in self.pods:
            if pod.netns:
                pids = subprocess.run(["ip", "netns", "pids", pod.netns], capture_output=True,
                                      text=True).stdout.split()
                for pid in pids:
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                subprocess.run(["ip", "netns", "del", pod.netns], capture_output=True)
                shutil.rmtree(f"/etc/netns/{pod.netns}", ignore_errors=True)
        subprocess.run(["ip", "netns", "del", self.switch], capture_output=True)

    def left_over(self):
        """Processes still running in the pods' namespaces."""
        out = []
        for pod in self.pods:
            pids = subprocess.run(["ip", "netns", "pids", pod.netns], capture_output=True,
                                  text=True).stdout.split()
            out += [f"{pod.name}:{pid}" for pid in pids]
        return out

    # --- a pod's container, as the kubelet starts it --------------------------
    def render(self, pod):
        c = pod.spec["containers"][0]
        mounts = {}  # container path -> directory here
        volumes = {v["name"]: v for v in pod.spec.get("volumes", [])}
        for m in c.get("volumeMounts", []):
            v = volumes[m["name"]]
            if "secret" in v:
                d = os.path.join(self.work, pod.name, m["name"])
                os.makedirs(d, exist_ok=True)
                for key, value in self.secrets[v["secret"]["secretName"]].items():
                    with open(os.path.join(d, key), "w") as f:
                        f.write(value)
                    os.chmod(os.path.join(d, key), 0o400)
            elif "persistentVolumeClaim" in v:
                d = os.path.join(self.work, "claims", v["persistentVolumeClaim"]["claimName"])
                os.makedirs(d, exist_ok=True)
            else:
                d = os.path.join(self.work, pod.name, m["name"])
                os.makedirs(d, exist_ok=True)
            mounts[m["mountPath"]] = d

        def paths(text):
            for inside, here in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
                text = re.sub(re.escape(inside) + r"(?=/|$|\s)", here, text)
            return text

        env = dict(pod.extra_env)
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = paths(expand(str(e["value"]), env))
            else:
                ref = e["valueFrom"]
                if "fieldRef" in ref:
                    env[e["name"]] = field(pod, ref["fieldRef"]["fieldPath"])
                else:
                    s = ref["secretKeyRef"]
                    env[e["name"]] = self.secrets[s["name"]][s["key"]]
        command = [paths(expand(a, env)) for a in c.get("command", []) + c.get("args", [])]
        for prefix, substitute in self.substitutes.items():
            if pod.name.startswith(prefix):
                command = substitute
        if command and command[0] == "tessera":
            command[0] = self.tessera
        env["HOSTNAME"] = pod.hostname
        env["PATH"] = os.environ.get("PATH", "/usr/bin:/bin")
        return dict(image_env(), **env), command

    def start(self, pod):
        env, command = self.render(pod)
        pod.proc = subprocess.Popen(
            ["ip", "netns", "exec", pod.netns, "env", "-i"] +
            [f"{k}={v}" for k, v in env.items()] + command,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

        def forward():
            for line in pod.proc.stdout:
                pod.output.append(line.rstrip("\n"))
                print(f"[{pod.role}] {line}", end="", flush=True)
        threading.Thread(target=forward, daemon=True).start()

    def wait(self, pods, limit):
        end = time.monotonic() + limit
        for pod in pods:
            try:
                pod.proc.wait(timeout=max(1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                return f"{pod.name} did not end within {limit} s"
        time.sleep(0.2)  # let the forwarding threads print what is left
        return None

    def stop(self, pods, limit=60):
        """Deletes the pods as Kubernetes does: SIGTERM, then SIGKILL."""
        for pod in pods:
            if pod.proc.poll() is None:
                for pid in subprocess.run(["ip", "netns", "pids", pod.netns], capture_output=True,
                                          text=True).stdout.split():
                    try:
                        os.kill(int(pid), signal.SIGTERM)
                    except ProcessLookupError:
                        pass
        return self.wait(pods, limit)


# What an image's ENV would hold, taken from the test's own environment:
# the build under test is "the image". A sanitizer build's image sets its
# runtime's options, and a TSan one must turn UCX's memory hooks off
# (UCX_MEM_MMAP_HOOK_MODE=none; libucm's hooks crash a TSan process when its
# threads exit, whichever backend it uses), as tools/dev.sh does for every
# other TSan test; LD_LIBRARY_PATH finds the UCX the build was linked with.
# The pod spec's own variables come on top, as the kubelet puts them.
IMAGE_ENV_NAMES = ("ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS", "TSAN_OPTIONS",
                   "LD_LIBRARY_PATH")


def image_env():
    return {k: v for k, v in os.environ.items()
            if k in IMAGE_ENV_NAMES or k.startswith("UCX_")}


def run(cmd):
    subprocess.run(cmd, check=True, capture_output=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", choices=["plain", "tfjob", "kill"], required=True)
    ap.add_argument("deploy_dir")
    ap.add_argument("tessera")
    ap.add_argument("integration_worker")
    a = ap.parse_args()
    try:
        subprocess.run(["ip", "netns", "add", "tessera-k8s-probe"], check=True, capture_output=True)
        subprocess.run(["ip", "netns", "del", "tessera-k8s-probe"], capture_output=True)
        os.makedirs("/etc/netns", exist_ok=True)
    except (subprocess.CalledProcessError, PermissionError, FileNotFoundError):
        print("k8s: SKIPPED: cannot make network namespaces here (needs root and iproute2)")
        return 77
    work = tempfile.mkdtemp(prefix="tessera-k8s-")
    secret = subprocess.run([a.tessera, "secret"], capture_output=True, text=True,
                            check=True).stdout.strip()
    with open(os.path.join(work, "secret"), "w") as f:
        f.write(secret)
    reader = subprocess.run([a.tessera, "secret", "--reader", "--secret-file",
                             os.path.join(work, "secret")], capture_output=True, text=True,
                            check=True).stdout.strip()
    # kubectl create secret generic tessera --from-file=secret (and the reader's)
    secrets = {"tessera": {"secret": secret}, "tessera-reader": {"secret": reader}}
    failures = []
    worker = [a.integration_worker, "--tensors", "40"]
    if a.scenario == "kill":
        worker = [a.integration_worker, "--sync-steps", "1000000"]
    if a.scenario in ("plain", "kill"):
        docs = documents(a.deploy_dir, ["ps.yaml", "workers.yaml"])
        ps = [p for d in docs if d["kind"] == "StatefulSet" for p in statefulset_pods(d)]
        workers = [p for d in docs if d["kind"] == "Job" for p in indexed_job_pods(d)]
        cluster = Cluster(work, secrets, a.tessera, {"tessera-worker-": worker})
    else:
        docs = documents(a.deploy_dir, ["tfjob.yaml"])
        pods = [p for d in docs if d["kind"] == "TFJob" for p in tfjob_pods(d)]
        ps = [p for p in pods if "-ps-" in p.name]
        workers = [p for p in pods if "-chief-" in p.name or "-worker-" in p.name]
        evaluators = [p for p in pods if "-evaluator-" in p.name]
        cluster = Cluster(work, secrets, a.tessera, {"tessera-train-chief-": worker,
                                                     "tessera-train-worker-": worker,
                                                     "tessera-train-evaluator-": worker})
    try:
        everyone = ps + workers + (evaluators if a.scenario == "tfjob" else [])
        cluster.up(everyone)
        for pod in everyone:
            cluster.start(pod)
        if a.scenario == "kill":
            victim = workers[0]
            # Training is under way once the survivor has pushed: wait for the
            # global step through `tessera status`, as a user would ask.
            spec = os.path.join(work, "cluster.json")
            with open(spec, "w") as f:
                json.dump(json.loads(cluster.render(ps[0])[0]["TF_CONFIG"])["cluster"], f)
            end = time.monotonic() + 120
            step = 0
            while step < 20 and time.monotonic() < end:
                out = subprocess.run(["ip", "netns", "exec", ps[0].netns, a.tessera, "status",
                                      "--cluster", spec, "--json"],
                                     env=dict(os.environ, TESSERA_SECRET=secret),
                                     capture_output=True, text=True)
                try:
                    step = max(t.get("global_step", 0) for t in json.loads(out.stdout))
                except (ValueError, TypeError):
                    step = 0
                time.sleep(0.2)  # the next look at the cluster
            if step < 20:
                failures.append("training did not reach global step 20")
            for pid in subprocess.run(["ip", "netns", "pids", victim.netns], capture_output=True,
                                      text=True).stdout.split():
                os.kill(int(pid), signal.SIGKILL)
            killed = time.monotonic()
            problem = cluster.wait([w for w in workers if w is not victim], 120)
            if problem:
                failures.append(problem)
            survivors = "\n".join(line for w in workers for line in w.output)
            print(f"k8s: the other worker ended {time.monotonic() - killed:.1f} s after the kill")
            task = json.loads(cluster.render(victim)[0]["TF_CONFIG"])["task"]
            name = f"/job:{task['type']}/task:{task['index']}"
            if f"{name} disconnected" not in survivors:
                failures.append(f"the surviving worker did not name {name} ({victim.name})")
            problem = cluster.stop(ps)
            if problem:
                failures.append(problem)
        else:
            problem = cluster.wait(workers + (evaluators if a.scenario == "tfjob" else []), 300)
            if problem:
                failures.append(problem)
            finished = workers + (evaluators if a.scenario == "tfjob" else [])
            for pod in finished:
                if pod.proc.returncode != 0:
                    failures.append(f"{pod.name} exited {pod.proc.returncode}")
                if not any("verified 40 tensors" in line for line in pod.output):
                    failures.append(f"{pod.name} did not verify its sums")
            # Deleting the ps pods (kubectl delete statefulset; the training
            # operator's cleanPodPolicy): SIGTERM, a clean stop.
            problem = cluster.stop(ps)
            if problem:
                failures.append(problem)
            for pod in ps:
                if pod.proc.returncode != 0:
                    failures.append(f"{pod.name} did not stop cleanly: exit {pod.proc.returncode}")
            # The coordinator's final checkpoint, on SIGTERM, complete (its
            # manifest is written last) and past the start's step 0.
            claim = os.path.join(work, "claims", "tessera-checkpoints")
            final = sorted(d for d in (os.listdir(claim) if os.path.isdir(claim) else [])
                           if d.startswith("step-") and d != "step-00000000" and
                           os.path.exists(os.path.join(claim, d, "tessera.json")))
            if not final:
                failures.append("no final checkpoint in the claim tessera-checkpoints")
            else:
                print(f"k8s: final checkpoint {final[-1]} in the claim")
        left = cluster.left_over()
        if left:
            failures.append("processes left in the pods: " + " ".join(left))
    finally:
        cluster.down()
        shutil.rmtree(work, ignore_errors=True)
    for f in failures:
        print(f"FAIL: {f}")
    if not failures:
        print(f"k8s: {a.scenario}: passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
