#!/usr/bin/env python3
"""Tessera's CUDA Adam against PyTorch's fused Adam (torch.optim.Adam(fused=True))
on the same tensors: the largest difference after a few steps, and the time per
step of each, measured in the same run. Prints one JSON object; exits 77 (skip)
where PyTorch or a GPU is missing.

    adam_vs_torch.py --bench build/tools/tessera-gpu-bench [--elements N] [--steps K]
"""
import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True, help="the tessera-gpu-bench binary")
    ap.add_argument("--elements", type=int, default=1 << 24)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--iters", type=int, default=10)
    a = ap.parse_args()
    try:
        import numpy as np
        import torch
    except ImportError as e:
        print(json.dumps({"mode": "adam_vs_torch", "skipped": f"not installed: {e.name}"}))
        return 77
    if not torch.cuda.is_available():
        print(json.dumps({"mode": "adam_vs_torch", "skipped": "torch sees no GPU"}))
        return 77
    lr, b1, b2, eps = 1e-3, 0.9, 0.999, 1e-8
    rng = np.random.default_rng(0)
    p0 = rng.standard_normal(a.elements).astype(np.float32)
    grads = (rng.standard_normal((a.steps, a.elements)) * 0.1).astype(np.float32)

    with tempfile.TemporaryDirectory() as d:
        Path(d, "param.f32").write_bytes(p0.tobytes())
        Path(d, "grad.f32").write_bytes(grads.tobytes())
        run = subprocess.run(
            [a.bench, "--iters", str(a.iters), "adam", "--dir", d, "--elements", str(a.elements),
             "--steps", str(a.steps), "--lr", str(lr), "--beta1", str(b1), "--beta2", str(b2),
             "--eps", str(eps)], capture_output=True, text=True, check=True)
        tessera = json.loads(run.stdout)
        ours = np.frombuffer(Path(d, "tessera.f32").read_bytes(), dtype=np.float32)

    g_dev = torch.from_numpy(grads).cuda()

    def torch_run():
        p = torch.nn.Parameter(torch.from_numpy(p0).cuda())
        opt = torch.optim.Adam([p], lr=lr, betas=(b1, b2), eps=eps, fused=True)
        for s in range(a.steps):
            p.grad = g_dev[s]
            opt.step()
        return p

    theirs = torch_run().detach().cpu().numpy()
    # Time per step: the same sequence, minus making the parameter and optimizer.
    times = []
    for _ in range(a.iters + 2):
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        p = torch.nn.Parameter(torch.from_numpy(p0).cuda())
        opt = torch.optim.Adam([p], lr=lr, betas=(b1, b2), eps=eps, fused=True)
        torch.cuda.synchronize()
        start.record()
        for s in range(a.steps):
            p.grad = g_dev[s]
            opt.step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1000 / a.steps)
    torch_step = float(np.median(times[2:]))

    diff = np.abs(ours.astype(np.float64) - theirs.astype(np.float64))
    scale = np.maximum(np.abs(theirs.astype(np.float64)), 1e-3)
    max_abs, max_rel = float(diff.max()), float((diff / scale).max())
    # Same formula (PyTorch's), both in f32; they may differ in fused
    # multiply-adds and in how bias corrections are computed, so a few ulp.
    ok = max_rel <= 1e-5
    print(json.dumps({
        "mode": "adam_vs_torch", "elements": a.elements, "steps": a.steps,
        "torch": torch.__version__, "max_abs_diff": max_abs, "max_rel_diff": max_rel,
        "rel_tolerance": 1e-5, "agree": ok,
        "tessera_step_s": tessera["step_s"], "torch_fused_step_s": torch_step,
        "tessera_speed_vs_torch": torch_step / tessera["step_s"] if tessera["step_s"] > 0 else None,
    }, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
