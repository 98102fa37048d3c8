"""Activation checkpointing (``checkpoint_blocks=True``): peak memory and time of a training step, with and without.

A GTransformer training step (forward, backward, AdamW update) at depth 12 and context 1024 by default, each
setting in its own subprocess so that its peak memory is its own. On CUDA the peak is
``torch.cuda.max_memory_allocated`` (tensors only); on the CPU it is the peak resident set size of the process,
which also counts the ~0.3 GB of the Python + torch runtime and the weights, so the saving shows as a difference.

    python benchmarks/checkpointing.py                              # CPU: depth 12, context 1024, batch 2
    python benchmarks/checkpointing.py --device cuda --bf16 --batch 8
    python benchmarks/checkpointing.py --depth 2 --context 64 --steps 1 --warmup 1   # a quick check that it runs
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from torchformer import GTransformer


def run_one(args) -> dict:
    """Time ``args.steps`` training steps with ``checkpoint_blocks=args.checkpointed``; runs in its own process."""
    torch.manual_seed(0)
    device = torch.device(args.device)
    model = GTransformer(args.emb, args.heads, args.depth, args.context, 256, prenorm=True,
                         checkpoint_blocks=args.checkpointed == "on").to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, 256, (args.batch, args.context), device=device)
    y = torch.randint(0, 256, (args.batch, args.context), device=device)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
            loss = F.nll_loss(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(args.warmup):
        step()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    if device.type == "cuda":
        peak_mb = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    ms = 1000 * statistics.median(times)
    return {"checkpointed": args.checkpointed, "ms": ms, "tok_s": args.batch * args.context / ms * 1000,
            "peak_mb": peak_mb}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast")
    p.add_argument("--emb", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--depth", type=int, default=12)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--checkpointed", choices=("on", "off"), help=argparse.SUPPRESS)  # internal: one setting
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.checkpointed:
        print(json.dumps(run_one(args)))
        return

    print(f"# GTransformer training step: emb {args.emb}, heads {args.heads}, depth {args.depth}, context "
          f"{args.context}, batch {args.batch}, device {args.device}{', bf16 autocast' if args.bf16 else ''}, "
          f"torch {torch.__version__}, median of {args.steps} steps after {args.warmup} warm-up")
    print("| checkpoint_blocks | ms/step | tokens/s | peak memory (MB) |")
    print("| --- | ---: | ---: | ---: |")
    for setting in ("off", "on"):
        cmd = [sys.executable, __file__, *sys.argv[1:], "--checkpointed", setting]
        row = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
        print(f"| {setting} | {row['ms']:.1f} | {row['tok_s']:,.0f} | {row['peak_mb']:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
