"""Data-parallel training throughput: DDP and FSDP2 (``torchformer.train.distributed``) on 1 and 2 processes.

Each (strategy, processes) setting is its own ``torchrun --standalone`` launch. The global batch is fixed
(``--tokens`` per step, split evenly over the processes), so the tokens/s of 2 processes against 1 is the speed-up
of spreading the same work. On a CPU the processes talk over gloo and share the machine's cores: give each its
threads with ``--threads`` (processes x threads <= cores), or the comparison measures contention, not scaling.

    python benchmarks/distributed.py                                   # CPU: DDP and FSDP2 at 1 and 2 processes
    python benchmarks/distributed.py --device cuda --processes 1 2 4 8 --bf16
    python benchmarks/distributed.py --depth 1 --emb 32 --tokens 512 --context 64 --steps 2   # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F


def worker(args) -> None:
    """One process of a torchrun launch: time ``args.steps`` steps; rank 0 prints the result as JSON."""
    from torchformer import GTransformer
    from torchformer.train.distributed import setup_distributed, teardown_distributed, wrap_model

    if args.threads:
        torch.set_num_threads(args.threads)
    run = setup_distributed(device=args.device)
    torch.manual_seed(0)
    model = GTransformer(args.emb, args.heads, args.depth, args.context, 256, prenorm=True).to(run.device)
    model = wrap_model(model, strategy=args.strategy)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = args.tokens // args.context // run.world_size
    if batch < 1:
        raise SystemExit(f"--tokens {args.tokens} is too few for {run.world_size} processes at context {args.context}")
    x = torch.randint(0, 256, (batch, args.context), device=run.device)
    y = torch.randint(0, 256, (batch, args.context), device=run.device)
    # DDP: autocast in the loop. FSDP2 on CUDA: wrap_model's MixedPrecisionPolicy already computes in bf16.
    amp = args.bf16 and args.strategy == "ddp"

    def step() -> None:
        with torch.autocast(run.device.type, dtype=torch.bfloat16, enabled=amp):
            loss = F.nll_loss(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if run.device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    if run.is_main:
        tokens = batch * args.context * run.world_size
        print(json.dumps({"strategy": args.strategy, "processes": run.world_size, "ms": 1000 * seconds,
                          "tok_s": tokens / seconds}))
    teardown_distributed()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--bf16", action="store_true", help="bf16 (CUDA)")
    p.add_argument("--strategies", nargs="+", default=["ddp", "fsdp"], choices=["ddp", "fsdp"])
    p.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    p.add_argument("--emb", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--tokens", type=int, default=4096, help="tokens per step, over all processes")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads per process (default 1, as torchrun sets)")
    p.add_argument("--timeout", type=int, default=600, help="seconds one launch may take")
    p.add_argument("--strategy", help=argparse.SUPPRESS)  # internal: this process is a torchrun worker
    args = p.parse_args()
    if args.strategy:
        worker(args)
        return

    print(f"# GTransformer training throughput: emb {args.emb}, heads {args.heads}, depth {args.depth}, context "
          f"{args.context}, {args.tokens} tokens/step in all, device {args.device}, "
          f"{args.threads or 'default'} thread(s) per process, torch {torch.__version__}, "
          f"median of {args.steps} steps after {args.warmup} warm-up")
    print("| strategy | processes | ms/step | tokens/s |")
    print("| --- | ---: | ---: | ---: |")
    for strategy in args.strategies:
        for n in args.processes:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
                   __file__, *sys.argv[1:], "--strategy", strategy]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=args.timeout,
                                 env={**os.environ, "OMP_NUM_THREADS": str(args.threads or 1)}).stdout
            row = json.loads(out.strip().splitlines()[-1])
            print(f"| {strategy} | {n} | {row['ms']:.1f} | {row['tok_s']:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
