#!/usr/bin/env python3
"""Fails when an #include points the wrong way between Tessera's layers.

The layers and their arrows are those of docs/architecture.md: a file in a
layer may include its own layer's headers and those of the layers listed for
it, nothing else. Outside transport/, a backend's headers (transport/ucx/,
transport/tcp/, transport/verbs/) are private: tools and the layers above ask
the Context interface (transport/transport.h, transport/probe.h).

  check_layers.py ROOT        check the tree at ROOT
  check_layers.py --self-test check that a wrong-way include is caught
"""
import os
import re
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
SOURCES = (".h", ".cc", ".cu")


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
                        m = INCLUDE.match(line)
                        if not m or "/" not in m.group(1):
                            continue
                        target = m.group(1)
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


def self_test():
    with tempfile.TemporaryDirectory() as root:
        def write(rel, text):
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        write("src/core/a.h", '#include "tessera/status.h"\n#include "core/b.h"\n')
        write("src/client/c.cc", '#include "transport/transport.h"\n#include "wire/x.h"\n')
        if check(root):
            print("self-test: a tree whose arrows all point down was refused:", check(root))
            return 1
        write("src/core/bad.h", '#include "server/shard.h"\n')
        write("tools/peek.cc", '#include "transport/ucx/ucx_context.h"\n')
        found = check(root)
        want = ['src/core/bad.h:1: includes "server/shard.h"', 'tools/peek.cc:1: includes "transport/ucx/']
        for w in want:
            if not any(p.startswith(w) for p in found):
                print("self-test: not caught:", w, "; found:", found)
                return 1
    print("self-test: wrong-way and backend includes are caught")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
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
