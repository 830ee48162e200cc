#!/usr/bin/env python3
"""Draws `tessera bench --json` results: bandwidth against size for Tessera's
push/pull and the fabric's put/get (Tessera's transport and ucx_perftest),
one panel per transport, and round-trip times of small calls beside UCX's
active-message round trip. With --scaling (bench/scaling.sh's merged
results): aggregate push/pull bandwidth and the step's time against the
number of workers (1 shard) and of shards (2 workers), beside memcpy and,
for tcp, one iperf3 stream.
Usage: plot_bench.py [--scaling] RESULTS.json OUT.png"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator, ScalarFormatter  # noqa: E402


def main(src: str, out: str) -> None:
    rows = json.load(open(src))
    transports = sorted({r["transport"] for r in rows})
    fig, axes = plt.subplots(2, len(transports), figsize=(6.5 * len(transports), 9), squeeze=False)
    for col, tr in enumerate(transports):
        mine = [r for r in rows if r["transport"] == tr and r.get("batch", 1) == 1]
        ax = axes[0][col]
        for name in ("push", "pull", "push_pull", "fabric-put", "fabric-get"):
            pts = sorted((r["bytes"], r["gbps"]) for r in mine if r["scenario"] == name)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"tessera {name}")
        for name, base in (("push", "ucp_put_bw"), ("pull", "ucp_get")):
            pts = sorted((r["bytes"], r["baseline_gbps"]) for r in mine
                         if r["scenario"] == name and r.get("baseline") == base)
            if pts:
                ax.plot(*zip(*pts), linestyle="--", marker="x", label=f"ucx_perftest {base}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes per tensor")
        ax.set_ylabel("GB/s (median)")
        ax.set_title(f"bandwidth, {tr}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)

        ax = axes[1][col]
        small = [r for r in mine if r["bytes"] <= 65536 and r["scenario"] in
                 ("push", "pull", "push_pull", "fabric-msg-rtt")]
        labels, vals, base = [], [], []
        for r in sorted(small, key=lambda r: (r["scenario"], r["bytes"])):
            labels.append(f'{r["scenario"]}\n{r["bytes"]} B')
            vals.append(r["p50_us"])
            base.append(r["baseline_us"] if r.get("baseline", "").startswith("2 x") else 0)
        x = range(len(labels))
        ax.bar([i - 0.2 for i in x], vals, width=0.4, label="tessera round trip (p50)")
        if any(base):
            ax.bar([i + 0.2 for i in x], base, width=0.4, label="UCX AM round trip (perftest)")
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("microseconds")
        ax.set_yscale("log")
        ax.set_title(f"small calls, {tr}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def scaling(src: str, out: str) -> None:
    rows = json.load(open(src))
    memcpy = [r["gbps"] for r in rows if r["scenario"] == "memcpy"]
    transports = sorted({r["transport"] for r in rows if r["scenario"] in ("push", "pull")})
    fig, axes = plt.subplots(2, 2, figsize=(16, 9))
    # (which axis varies, the other held, its label)
    for col, (vary, held, hold_at, label) in enumerate(
            (("workers", "shards", 1, "workers (1 shard)"),
             ("shards", "workers", 2, "shards (2 workers)"))):
        ax = axes[0][col]
        for tr in transports:
            for name in ("push", "pull"):
                pts = sorted((r[vary], r["gbps"]) for r in rows if r["scenario"] == name
                             and r["transport"] == tr and r[held] == hold_at)
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=f"{name}, {tr}")
        if memcpy:
            ax.axhline(memcpy[0], color="grey", linestyle="--", label="memcpy, one thread")
        for r in rows:  # the raw tcp stream under each tcp curve, same run
            if r["scenario"].startswith("iperf3-"):
                ax.axhline(r["gbps"], linestyle=":", color="black" if r["transport"] == "tcp"
                           else "brown", alpha=0.6,
                           label=f'iperf3 {r["scenario"][7:]}, {r["transport"]}')
        ax.set_xlabel(label)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("aggregate GB/s (median call)")
        ax.set_yscale("log")  # shm's pull and tcp's push lie 10x apart
        ax.set_title(f"bandwidth against {vary}")
        ax.grid(True, which="both", alpha=0.3)
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        ax = axes[1][col]
        for tr in transports:
            pts = sorted((r[vary], r["p50_us"] / 1e3, r["baseline_us"] / 1e3) for r in rows
                         if r["scenario"] == "step" and r["transport"] == tr
                         and r[held] == hold_at)
            if pts:
                xs, ms, bound = zip(*pts)
                line, = ax.plot(xs, ms, marker="o", label=f"step, {tr}")
                ax.plot(xs, bound, linestyle="--", color=line.get_color(),
                        label=f"bound (fabric-put-read), {tr}")
        ax.set_xlabel(label)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("ms per step (p50)")
        ax.set_title(f"synchronous step against {vary}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    args = sys.argv[1:]
    draw = main
    if args and args[0] == "--scaling":
        draw, args = scaling, args[1:]
    if len(args) != 2:
        sys.exit(__doc__)
    draw(args[0], args[1])
