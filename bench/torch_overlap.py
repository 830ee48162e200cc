#!/usr/bin/env python3
"""Pushing each gradient as backward produces it (per-parameter hooks, as
BytePS does) against pushing them all after backward, in the same run.

Run on every worker of a cluster (bench/torch_overlap.sh: 2 ps x 2 workers):

    tessera launch --ps 2 --workers 2 -- python3 bench/torch_overlap.py

Two models: the digits example's MLP (64-64-10, 4.8 K parameters) and a
larger MLP (1024-2048-2048-1024-10, 8.4 M parameters). For each, two copies
train side by side with tessera.torch.DistributedOptimizer in sync Adam, one
with overlap=True, one with overlap=False; rounds of `--steps` steps
alternate between them so that both see the same machine. The chief prints
the median step time of each (ms) and their ratio.
"""

import argparse
import statistics
import time

import torch

import tessera
import tessera.torch


def mlp(widths):
    layers = []
    for a, b in zip(widths, widths[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


MODELS = {
    "digits MLP (4.8 K params)": ([64, 64, 10], 32),
    "large MLP (8.4 M params)": ([1024, 2048, 2048, 1024, 10], 64),
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10, help="steps per round")
    p.add_argument("--rounds", type=int, default=5, help="rounds of each")
    args, _ = p.parse_known_args()
    torch.set_num_threads(1)
    client = tessera.Client.from_env()
    if client.is_chief:
        print("| model | after backward ms/step | overlapped ms/step | ratio |")
        print("|---|---:|---:|---:|")
    for label, (widths, batch) in MODELS.items():
        torch.manual_seed(0)
        models = {overlap: mlp(widths) for overlap in (False, True)}
        opts = {overlap: tessera.torch.DistributedOptimizer(
                    client, models[overlap], "adam", lr=1e-4, overlap=overlap,
                    prefix=f"overlap/{label}/{overlap}/")
                for overlap in (False, True)}
        g = torch.Generator().manual_seed(client.worker_rank)
        x = torch.randn(batch, widths[0], generator=g)
        y = torch.randint(0, widths[-1], (batch,), generator=g)
        loss_fn = torch.nn.CrossEntropyLoss()
        times = {False: [], True: []}

        def step(overlap):
            opt = opts[overlap]
            opt.zero_grad()
            loss_fn(models[overlap](x), y).backward()
            opt.step()

        for overlap in (False, True):
            step(overlap)  # warm
        for _ in range(args.rounds):
            for overlap in (False, True):
                start = time.perf_counter()
                for _ in range(args.steps):
                    step(overlap)
                times[overlap].append((time.perf_counter() - start) / args.steps * 1e3)
        for opt in opts.values():
            opt.remove_hooks()
        if client.is_chief:
            after, over = statistics.median(times[False]), statistics.median(times[True])
            print(f"| {label} | {after:.2f} | {over:.2f} | {over / after:.2f} |", flush=True)
    client.close()


if __name__ == "__main__":
    main()
