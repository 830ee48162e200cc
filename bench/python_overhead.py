#!/usr/bin/env python3
"""What a call costs from Python beside the same call from C++, in one
process, on one cluster, with the same arrays.

Run as the one worker of a cluster (bench/python_overhead.sh runs it over
tcp and over ucx's shared memory):

    tessera launch --ps 1 --workers 1 --transport tcp -- \\
        python3 bench/python_overhead.py --label tcp

For each size (8 B, 1 MiB) and call (push, pull) it alternates rounds of
`--calls` blocking calls made from Python (tessera.Client.push/pull on a
NumPy array) with rounds of the same calls made by a C++ loop inside the
extension (Client._time_calls: tessera::Client::Push/Pull on the same
buffer), and prints the median time per call of each, their difference
(Python's share) and their ratio, as one markdown row per case.
"""

import argparse
import statistics
import time

import numpy as np

import tessera


def python_loop(call, n):
    start = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - start) / n


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--label", default="", help="the transport, for the table")
    p.add_argument("--calls", type=int, default=2000, help="calls per round")
    p.add_argument("--rounds", type=int, default=21, help="rounds of each (median)")
    args, _ = p.parse_known_args()
    client = tessera.Client.from_env(argv=[])
    sizes = {"8 B": 2, "1 MiB": (1 << 20) // 4}
    tensors = {label: client.declare(f"overhead/{label}", (n,), "f32", "assign")
               for label, n in sizes.items()}
    client.initialize()
    for label, n in sizes.items():
        t = tensors[label]
        array = np.ones(n, np.float32)
        calls = args.calls if n < 1024 else max(50, args.calls // 20)
        for kind in ("push", "pull"):
            if kind == "push":
                def from_python():
                    client.push(t, array)
            else:
                def from_python():
                    client.pull(t, array)
            items = ((t, array),)
            from_python()  # warm: registration, first contact
            client._c._time_calls(kind, items, 10)
            py, cc = [], []
            for _ in range(args.rounds):
                py.append(python_loop(from_python, calls))
                cc.append(client._c._time_calls(kind, items, calls))
            mp, mc = statistics.median(py) * 1e6, statistics.median(cc) * 1e6
            print(f"| {args.label} | {label} | {kind} | {mp:.2f} | {mc:.2f} | {mp - mc:.2f} | "
                  f"{mp / mc:.2f} |", flush=True)
    client.close()


if __name__ == "__main__":
    main()
