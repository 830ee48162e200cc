#!/usr/bin/env python3
"""What a call costs from Python beside the same call from C++, in one
process, on one cluster, with the same arrays.

Run as the one worker of a cluster (bench/python_overhead.sh runs it over
tcp and over ucx's shared memory):

    tessera launch --ps 1 --workers 1 --transport tcp -- \\
        python3 bench/python_overhead.py --label tcp

For each size (8 B, 1 MiB) and call (push, pull) it times three things, in
alternating rounds, and prints the median of each as one markdown row:

- Python: `tessera.Client.push/pull` on a NumPy array, each call timed
  from Python: the Python layer, the binding, the array's import and the
  call.
- C++, spaced as Python spaces them: the same `tessera::Client` call on the
  same buffer, made by the extension (`Client._time_calls(kind, items, 1)`,
  which times only the C++ call), once per turn of the same Python loop.
  Python's share of a call is the first minus this.
- C++ back to back: the extension's own loop of `--calls` calls. A call
  made right after the previous one can cost less than one made after the
  caller did something else (the fabric's and the shard's threads may have
  gone to sleep meanwhile); the last column is that difference, which a C++
  trainer working between its calls pays as well. `--pauses` measures it
  for a C++ caller that spins the given µs between calls.
"""

import argparse
import statistics
import time

import numpy as np

import tessera


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--label", default="", help="the transport, for the table")
    p.add_argument("--calls", type=int, default=2000, help="calls per round")
    p.add_argument("--rounds", type=int, default=21, help="rounds of each (median)")
    p.add_argument("--pauses", default="",
                   help="comma-separated µs: also time C++ calls with that busy pause between them")
    args, _ = p.parse_known_args()
    pauses = [float(x) for x in args.pauses.split(",") if x]
    client = tessera.Client.from_env(argv=[])
    sizes = {"8 B": 2, "1 MiB": (1 << 20) // 4}
    tensors = {label: client.declare(f"overhead/{label}", (n,), "f32", "assign")
               for label, n in sizes.items()}
    client.initialize()
    clock = time.perf_counter
    for label, n in sizes.items():
        t = tensors[label]
        array = np.ones(n, np.float32)
        calls = args.calls if n < 1024 else max(50, args.calls // 20)
        for kind in ("push", "pull"):
            call = client.push if kind == "push" else client.pull
            items = ((t, array),)
            time_calls = client._c._time_calls
            call(t, array)  # warm: registration, first contact
            time_calls(kind, items, 10)
            py, spaced, back_to_back = [], [], []
            paused = {pause: [] for pause in pauses}
            for _ in range(args.rounds):
                # Python and the spaced C++ call alternate call by call, so
                # that both see the same machine. Each round's mean, as the
                # back-to-back loop gives it.
                py_sum = spaced_sum = 0.0
                for _ in range(calls):
                    start = clock()
                    call(t, array)
                    py_sum += clock() - start
                    spaced_sum += time_calls(kind, items, 1)
                py.append(py_sum / calls)
                spaced.append(spaced_sum / calls)
                back_to_back.append(time_calls(kind, items, calls))
                for pause in pauses:
                    paused[pause].append(time_calls(kind, items, calls, pause) - pause * 1e-6)
            mp, ms, mb = (statistics.median(x) * 1e6 for x in (py, spaced, back_to_back))
            print(f"| {args.label} | {label} | {kind} | {mp:.2f} | {ms:.2f} | {mp - ms:.2f} | "
                  f"{mb:.2f} | {ms - mb:.2f} |", flush=True)
            for pause, times in paused.items():
                print(f"| {args.label} | {label} | {kind} | C++, {pause:g} µs between calls | "
                      f"{statistics.median(times) * 1e6:.2f} |", flush=True)
    client.close()


if __name__ == "__main__":
    main()
