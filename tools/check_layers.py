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
  check_layers.py --search-paths ROOT BUILD
                                    check that the build gives each layer's
                                    library only its own include root and those
                                    of the layers below (meson.build): compiled
                                    with a library's own flags, a header of any
                                    layer it may not use is not found
"""
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

# layer: (directory, the layers below it that it may include)
LAYERS = {
    "tessera": ("include/tessera", []),
    "core": ("src/core", ["tessera"]),
    "gpu": ("src/gpu", ["core", "tessera"]),
    "transport": ("transport", ["gpu", "core", "tessera"]),
    "kernels": ("kernels", ["gpu", "core", "tessera"]),
    "embed": ("src/embed", ["kernels", "core", "tessera"]),
    "wire": ("src/wire", ["core", "tessera"]),
    "ckpt": ("src/ckpt", ["core", "tessera"]),
    "rendezvous": ("src/rendezvous", ["core", "tessera"]),
    "coord": ("src/coord", ["wire", "ckpt", "core", "tessera"]),
    "server": ("src/server",
               ["coord", "wire", "ckpt", "embed", "kernels", "transport", "gpu", "core",
                "tessera"]),
    "client": ("src/client", ["wire", "ckpt", "transport", "gpu", "core", "tessera"]),
    # The C API is written against the public C++ API only, as any consumer would be.
    "capi": ("src/capi", ["tessera"]),
    # So is the Python extension (python/tessera's _tessera).
    "python": ("src/python", ["tessera"]),
    "tools": ("tools", ["client", "server", "coord", "wire", "ckpt", "rendezvous", "embed", "kernels",
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


def a_header(root, layer):
    """One header of `layer`, as an include names it ("core/status.h")."""
    directory = os.path.join(root, LAYERS[layer][0])
    for name in sorted(os.listdir(directory)):
        if name.endswith(".h"):
            return f"{layer}/{name}"
    return None


def a_compile_command(root, layer, commands):
    """The flags the layer's library compiled one of its sources with, as an
    argument list, and where it ran; None when the build compiles none (a
    layer this build leaves out). A library's objects go to its own
    directory (libtessera_LAYER.a.p/), also where it is compiled as one
    unit (-Dunity_layers), whose source is then generated in the build; a
    layer that is no such library (tools, python) is found by its sources."""
    library = f"libtessera_{layer}.a.p/"
    for c in commands:
        args = shlex.split(c["command"])
        if "-o" in args and args[args.index("-o") + 1].startswith(library):
            return args, c["directory"]
    directory = os.path.join(os.path.realpath(root), LAYERS[layer][0]) + os.sep
    for c in commands:
        path = os.path.realpath(os.path.join(c["directory"], c["file"]))
        if path.startswith(directory) and path.endswith(".cc"):
            return shlex.split(c["command"]), c["directory"]
    return None


def search_paths(root, build, planted=()):
    """Each layer's library, asked with its own flags which layers' headers
    it finds (__has_include): its own, and none it may not include."""
    with open(os.path.join(build, "compile_commands.json"), encoding="utf-8") as f:
        commands = json.load(f)
    problems, checked, walled = [], 0, 0
    with tempfile.TemporaryDirectory() as tmp:
        probe = os.path.join(tmp, "probe.cc")
        for layer, (_, allowed) in LAYERS.items():
            found = a_compile_command(root, layer, commands)
            if layer == "tessera" or found is None:
                continue
            args, cwd = found
            forbidden = [to for to in LAYERS if to not in allowed + [layer, "tessera"]]
            own = a_header(root, layer)
            lines = [f'#if !__has_include("{own}")\n#error "OWN {layer}"\n#endif\n'] if own else []
            walled += any(a_header(root, to) for to in forbidden)
            for to in forbidden:
                header = a_header(root, to)
                if header is None:
                    continue
                lines.append(f'#if __has_include("{header}")\n#error "FOUND {header}"\n#endif\n')
            with open(probe, "w", encoding="utf-8") as f:
                f.writelines(lines)
            # The library's command, preprocessing the probe instead of its
            # source, and nothing written.
            argv = [a for a in args if a != "ccache"]
            out = argv.index("-o")
            argv[out + 1] = os.devnull
            argv[argv.index("-c") + 1] = probe
            argv = [a for a in argv if a not in ("-MD",)]
            if "-MF" in argv:
                i = argv.index("-MF")
                del argv[i:i + 2]
            if "-MQ" in argv:
                i = argv.index("-MQ")
                del argv[i:i + 2]
            run = subprocess.run(argv + list(planted) + ["-E"], cwd=cwd, capture_output=True, text=True, check=False)
            for m in re.finditer(r'#error "(OWN|FOUND) ([^"]+)"', run.stderr):
                if m.group(1) == "OWN":
                    problems.append(f"{layer}: its library does not find its own headers")
                else:
                    problems.append(f"{layer}: its library finds {m.group(2)}, which {layer} may "
                                    f"not include (only {', '.join([layer] + allowed)})")
            if run.returncode != 0 and not problems:
                problems.append(f"{layer}: the probe did not preprocess: {run.stderr.strip()}")
            checked += 1
    if checked == 0:
        problems.append(f"no layer's library found in {build}/compile_commands.json")
    return problems, checked, walled


def main(argv):
    if len(argv) == 3 and argv[1] == "--self-test":
        return self_test(argv[2])
    if len(argv) == 4 and argv[1] == "--search-paths":
        problems, checked, walled = search_paths(argv[2], argv[3])
        for p in problems:
            print(p)
        if problems:
            return 1
        # The check itself, shown able to fail: every library given the
        # whole tree's search path (as one include directory for all gave
        # it) finds what it may not.
        tree = os.path.realpath(argv[2])
        planted, _, _ = search_paths(argv[2], argv[3], ["-I" + os.path.join(tree, "src"), "-I" + tree])
        wrong = [p for p in planted if "finds" not in p]
        if wrong or len({p.split(":")[0] for p in planted}) != walled:
            print(f"self-test: with the whole tree on every search path, expected each of the "
                  f"{walled} layers with a wall to find a header it may not include; got:", planted)
            return 1
        print(f"{checked} layers' libraries find only their own headers and those below them "
              f"(and, given the whole tree's search path, {len(planted)} wrong-way headers were "
              f"found)")
        return 0
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
