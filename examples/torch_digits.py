#!/usr/bin/env python3
"""A PyTorch model trained on Tessera's shards: scikit-learn's digits (1,797
8x8 images of handwritten digits, shipped inside scikit-learn), an MLP, and
synchronous Adam running on the ps tasks.

    tessera launch --ps 2 --workers 2 --checkpoint-dir /tmp/digits \\
        --checkpoint-steps 50 -- python3 examples/torch_digits.py

Each worker trains on its own share of the training images; the optimizer
state lives on the shards, so the loop below is an ordinary PyTorch loop.
Killed and started again with the same checkpoint directory, the cluster
resumes from the last checkpoint's global step. The chief prints the
held-out accuracy at the end.

Started as an evaluator (a TF_CONFIG task of type "evaluator", such as
deploy/k8s/tfjob.yaml's), it trains nothing: a read-only client, it pulls
the weights as the workers train them and prints their held-out accuracy
each time the global step moved, until the last step's weights are in.
"""

import argparse
import time

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import tessera
import tessera.torch


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300, help="global steps to train")
    p.add_argument("--batch", type=int, default=32, help="images per worker per step")
    p.add_argument("--lr", type=float, default=0.01, help="Adam's learning rate")
    p.add_argument("--no-overlap", action="store_true",
                   help="push every gradient after backward instead of as it is made")
    p.add_argument("--ms-per-step", type=float, default=0,
                   help="pause this long each step (to watch, or to kill it midway)")
    p.add_argument("--eval-every-s", type=float, default=1.0,
                   help="the evaluator: how often it looks at the global step")
    # TensorFlow 1's cluster flags (--ps_hosts, --job_name, ...) are read by
    # Client.from_env; let them through.
    args, _ = p.parse_known_args(argv)
    return args


def digits_split():
    """The training and held-out images, the same on every task."""
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target, dtype=torch.int64)
    return train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)


def make_model():
    torch.manual_seed(0)  # the chief's initial weights go to the shards
    return torch.nn.Sequential(
        torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def held_out_accuracy(model, x_test, y_test):
    with torch.no_grad():
        return (model(x_test).argmax(1) == y_test).float().mean().item()


def evaluate(client, args):
    """The evaluator's loop; returns the accuracy of the last step's weights."""
    _, x_test, _, y_test = digits_split()
    model = make_model()
    client.wait_for_init(timeout=300)  # the workers have declared the tensors
    # A reader declares by looking up: the names DistributedOptimizer gave.
    weights = {client.declare("digits/" + name, tuple(p.shape), "f32"): p.data
               for name, p in model.named_parameters()}
    seen = None
    while True:
        step = client.global_step()
        done = step >= args.steps
        if step != seen:
            # The last time, the weights with the last step applied.
            client.pull(weights, min_step=args.steps if done else 0)
            accuracy = held_out_accuracy(model, x_test, y_test)
            print(f"evaluator: held-out accuracy {accuracy:.4f} at global step {step}",
                  flush=True)
            seen = step
        if done:
            return accuracy
        time.sleep(args.eval_every_s)


def train(argv=None):
    """Trains as TF_CONFIG (or the TF1 flags) says; returns the chief's
    held-out accuracy (None on the other workers; the evaluator's, on an
    evaluator). tessera.spark's main_fn calls it on each worker (tests/spark)."""
    args = parse_args(argv)
    torch.set_num_threads(1)  # the shards and the other workers share the cores
    client = tessera.Client.from_env()
    if client.read_only:
        accuracy = evaluate(client, args)
        client.close()
        return accuracy
    rank, workers = client.worker_rank, client.num_workers

    x_train, x_test, y_train, y_test = digits_split()
    x_mine, y_mine = x_train[rank::workers], y_train[rank::workers]
    model = make_model()
    opt = tessera.torch.DistributedOptimizer(
        client, model, "adam", mode="sync", lr=args.lr, prefix="digits/",
        overlap=not args.no_overlap)
    start = opt.step_count
    if client.is_chief:
        if opt.restored_step is not None:
            print(f"resuming from the checkpoint of global step {opt.restored_step}", flush=True)
        else:
            print(f"training from global step {start}: {len(x_train)} images over "
                  f"{workers} workers, {len(x_test)} held out", flush=True)

    loss_fn = torch.nn.CrossEntropyLoss()
    loss = torch.tensor(0.0)
    for step in range(start, args.steps):
        # The batch depends on the step only: a resumed run sees the same.
        g = torch.Generator().manual_seed(step * workers + rank)
        idx = torch.randint(0, len(x_mine), (args.batch,), generator=g)
        opt.zero_grad()
        loss = loss_fn(model(x_mine[idx]), y_mine[idx])
        loss.backward()
        opt.step()
        if client.is_chief and (step % 50 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {loss.item():.4f}", flush=True)
        if args.ms_per_step > 0:
            time.sleep(args.ms_per_step / 1e3)

    accuracy = None
    if client.is_chief:
        accuracy = held_out_accuracy(model, x_test, y_test)
        print(f"held-out accuracy {accuracy:.4f} after {args.steps} steps", flush=True)
    client.close()
    if not np.isfinite(loss.item()):
        raise RuntimeError(f"training diverged: loss {loss.item()}")
    return accuracy


def main():
    try:
        train()
    except RuntimeError as e:  # a diverged run fails
        print(e, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
