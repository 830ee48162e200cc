#!/usr/bin/env python3
"""Fails when an #include points the wrong way between Tessera's layers.

The layers and their arrows are those of docs/architecture.md: a file in a
layer may include its own layer's headers and those of the layers listed for
it, nothing else. Outside transport/, a backend's headers (transport/ucx/,
transport/tcp/, transport/verbs/) are private: tools and the layers above ask
the Context interface (transport/transport.h, transport/probe.h). So are
the libraries behind them: <ucp/...> only in transport/ucx/, <infiniband/...>
and <rdma/...> only in transport/verbs/ (and the RDMA probe), CUDA's headers
only in src/gpu/ and kernels/cuda/, NCCL's only in NodeGroup, IPsec-MB's only
in transport/tcp/. Inside server/, only HostedCoordinator includes coord/:
the shard reaches the coordinator through server/coordinator_port.h.

  check_layers.py ROOT              check the tree at ROOT
  check_layers.py --self-test ROOT  check that wrong-way includes planted in a
                                    copy of the tree at ROOT are caught
"""
import os
import re
import shutil
import sys
import tempfile

# layer: (directory, the layers below it that it may include)
LAYERS = {
    "tessera": ("include/tessera", []),
    "core": ("src/core", ["tessera"]),
    "gpu": ("src/gpu", ["core", "tessera"]),
    "transport": ("transport", ["gpu", "core", "tessera"]),
    "kernels": ("kernels", ["gpu", "core", "tessera"]),
    "wire": ("src/wire", ["core", "tessera"]),
    "ckpt": ("src/ckpt", ["core", "tessera"]),
    "rendezvous": ("src/rendezvous", ["core", "tessera"]),
    "coord": ("src/coord", ["wire", "ckpt", "core", "tessera"]),
    "server": ("src/server",
               ["coord", "wire", "ckpt", "kernels", "transport", "gpu", "core", "tessera"]),
    "client": ("src/client", ["wire", "ckpt", "transport", "gpu", "core", "tessera"]),
    # The C API is written against the public C++ API only, as any consumer would be.
    "capi": ("src/capi", ["tessera"]),
    # So is the Python extension (python/tessera's _tessera).
    "python": ("src/python", ["tessera"]),
    "tools": ("tools", ["client", "server", "coord", "wire", "ckpt", "rendezvous", "kernels",
                        "transport", "gpu", "core", "tessera"]),
}
BACKENDS = ("transport/ucx/", "transport/tcp/", "transport/verbs/")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
ANGLE_INCLUDE = re.compile(r'^\s*#\s*include\s+<([^>]+)>')
# A library's headers: (what they look like, where they may be included, whose).
LIBRARY_HEADERS = [
    (re.compile(r"^(ucp|uct|ucs|ucm)/"), ("transport/ucx/",), "UCX"),
    (re.compile(r"^(infiniband|rdma)/"), ("transport/verbs/", "transport/rdma_probe.cc"),
     "libibverbs and rdma_cm"),
    (re.compile(r"^(cuda[A-Za-z_0-9]*\.h|cuda/|cuda_runtime|nvrtc|cublas|cufft)"),
     ("src/gpu/", "kernels/cuda/"), "CUDA"),
    (re.compile(r"^nccl"), ("src/client/node_group.cc",), "NCCL"),
    (re.compile(r"^intel-ipsec-mb\.h$"), ("transport/tcp/",), "IPsec-MB"),
]


def library_problem(rel, number, target):
    """The complaint about <target> included at rel:number, or None."""
    for pattern, places, whose in LIBRARY_HEADERS:
        if pattern.match(target) and not rel.startswith(places):
            return (f'{rel}:{number}: includes <{target}>, {whose}\'s header, which only '
                    f'{", ".join(places)} may include (docs/architecture.md)')
    return None
SOURCES = (".h", ".cc", ".cu")
# Inside a layer: (the files, the include they may not make unless they are
# one of `except`, why).
INNER_WALLS = [
    ("src/server/", "coord/", ("src/server/hosted_coordinator.",),
     "only HostedCoordinator hosts coord/; the shard reaches the coordinator through "
     "server/coordinator_port.h"),
]


def inner_wall_problem(rel, number, target):
    for files, forbidden, allowed, why in INNER_WALLS:
        if rel.startswith(files) and target.startswith(forbidden) and not rel.startswith(allowed):
            return f'{rel}:{number}: includes "{target}": {why} (docs/architecture.md)'
    return None


def check(root):
    problems = []
    for layer, (directory, allowed) in LAYERS.items():
        for dirpath, _, files in os.walk(os.path.join(root, directory)):
            for name in sorted(files):
                if not name.endswith(SOURCES):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        angle = ANGLE_INCLUDE.match(line)
                        if angle:
                            problem = library_problem(rel, number, angle.group(1))
                            if problem:
                                problems.append(problem)
                            continue
                        m = INCLUDE.match(line)
                        if not m or "/" not in m.group(1):
                            continue
                        target = m.group(1)
                        wall = inner_wall_problem(rel, number, target)
                        if wall:
                            problems.append(wall)
                            continue
                        to = target.split("/", 1)[0]
                        if to not in LAYERS:
                            continue
                        if to != layer and to not in allowed:
                            problems.append(
                                f'{rel}:{number}: includes "{target}", but {layer} may include '
                                f'only {", ".join([layer] + allowed)} (docs/architecture.md)')
                        elif layer != "transport" and target.startswith(BACKENDS):
                            problems.append(
                                f'{rel}:{number}: includes "{target}", a transport backend\'s own '
                                f'header; ask the Context interface instead (transport/transport.h, '
                                f'transport/probe.h)')
    return problems


def self_test(tree):
    """Plants wrong-way includes in a copy of the tree's sources."""
    with tempfile.TemporaryDirectory() as root:
        for directory, _ in LAYERS.values():
            src = os.path.join(tree, directory)
            if os.path.isdir(src):
                shutil.copytree(src, os.path.join(root, directory),
                                ignore=lambda d, names: [n for n in names if n == "__pycache__"])
        if check(root):
            print("self-test: the copy of the tree was refused before anything was planted:",
                  check(root))
            return 1
        plants = {
            "src/core/status.cc": '#include "server/shard.h"\n',
            "tools/main.cc": '#include "transport/ucx/ucx_context.h"\n',
            "tools/doctor.cc": "#include <ucp/api/ucp.h>\n",
            "src/server/server.cc": "#include <infiniband/verbs.h>\n",
            "src/client/client.cc": "#include <cuda_runtime_api.h>\n",
            "transport/tcp/tcp_endpoint.cc": "#include <rdma/rdma_cma.h>\n",
            "src/server/shard.h": '#include "coord/service.h"\n',
        }
        for rel, line in plants.items():
            path = os.path.join(root, rel)
            if not os.path.exists(path):
                print("self-test: no", rel, "in the tree to plant into")
                return 1
            with open(path, encoding="utf-8") as f:
                text = f.read()
            with open(path, "w", encoding="utf-8") as f:
                f.write(line + text)
        found = check(root)
        for rel, line in plants.items():
            if not any(p.startswith(rel + ":1: ") for p in found):
                print(f"self-test: not caught: {line.strip()} in {rel}; found: {found}")
                return 1
        if len(found) != len(plants):
            print("self-test: more was refused than was planted:", found)
            return 1
    print(f"self-test: {len(plants)} wrong-way includes planted in a copy of the tree are caught")
    return 0


def main(argv):
    if len(argv) == 3 and argv[1] == "--self-test":
        return self_test(argv[2])
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    problems = check(argv[1])
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} include(s) against the layers")
        return 1
    print("every include points down the layers")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
