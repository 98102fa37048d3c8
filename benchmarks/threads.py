"""CPU threads on a machine that is not idle: PyTorch's default against fewer threads, and the examples' choice.

PyTorch's CPU default is one thread per core. Its parallel regions end at a barrier where every thread waits for
the slowest, so when another program holds one core, each region waits for the thread that shares that core: the
whole step runs at the pace of its unluckiest thread. This benchmark trains the README's quickstart model (emb 128,
4 heads, depth 2, context 64, batch 16; seeded) for a few steps, each setting in its own subprocess, under two loads:

* ``idle``: nothing else running;
* ``busy``: ``--busy`` other processes, each spinning on one core (a Python ``while True: pass``).

and three thread settings: ``1``, ``all`` (the cores this process may use: PyTorch's default) and ``auto``
(:func:`torchformer.scripts.cli.choose_threads`, what the example scripts use without ``--threads``: the cores that
other programs leave idle, measured over a quarter of a second at the start). It prints seconds per step (median
over the measured steps), the ratio to 1 thread under the same load, the threads ``auto`` picked, and the loss
after the last step, so one can also see whether the thread count changes the numbers, not only the speed.

    python benchmarks/threads.py                      # 3 warm-up + 20 measured steps, 2 rounds
    python benchmarks/threads.py --steps 40 --rounds 3 --busy 1
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

from torchformer import GTransformer
from torchformer.scripts.cli import choose_threads


def run(threads: str, warmup: int, steps: int) -> dict:
    """The quickstart's training loop with ``threads`` torch threads; seconds per measured step and the last loss."""
    if threads == "auto":
        n, why = choose_threads()
    else:
        n, why = (1 if threads == "1" else len(os.sched_getaffinity(0))), threads
    torch.set_num_threads(n)
    torch.manual_seed(0)
    model = GTransformer(emb=128, heads=4, depth=2, seq_length=64, num_tokens=256)
    text = torch.tensor(list(b"hello transformers! " * 20))  # (t,) byte ids
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    times = []
    for step in range(warmup + steps):
        began = time.perf_counter()
        start = torch.randint(0, len(text) - 65, (16,))
        batch = torch.stack([text[s:s + 65] for s in start])  # (b, t + 1)
        loss = F.nll_loss(model(batch[:, :-1]).transpose(1, 2), batch[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step >= warmup:
            times.append(time.perf_counter() - began)
    return {"threads": n, "why": why, "s_per_step": statistics.median(times), "loss": loss.item()}


def measure(threads: str, load: int, args: argparse.Namespace) -> dict:
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
    try:
        if spinners:
            time.sleep(0.5)  # let them get going, so that `auto` sees them
        out = subprocess.run([sys.executable, __file__, "--child", threads, "--warmup", str(args.warmup),
                              "--steps", str(args.steps)], capture_output=True, text=True, check=True).stdout
    finally:
        for s in spinners:
            s.kill()
            s.wait()
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20, help="measured training steps per setting (default: 20)")
    p.add_argument("--warmup", type=int, default=3, help="unmeasured steps first (default: 3)")
    p.add_argument("--rounds", type=int, default=2, help="times each setting runs, in turn (default: 2)")
    p.add_argument("--busy", type=int, default=1, help="spinning processes for the busy load (default: 1)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(run(args.child, args.warmup, args.steps)))
        return
    cores = len(os.sched_getaffinity(0))
    print(f"torch {torch.__version__}, {cores} cores available, {args.steps} steps after {args.warmup} warm-up, "
          f"busy load: {args.busy} spinning process(es)\n")
    print("| load | round | threads | s/step | vs 1 thread | loss after the last step |")
    print("| --- | ---: | --- | ---: | ---: | ---: |")
    for load_name, load in (("idle", 0), ("busy", args.busy)):
        for r in range(1, args.rounds + 1):
            results = {t: measure(t, load, args) for t in ("1", "all", "auto")}
            one = results["1"]["s_per_step"]
            for t, res in results.items():
                label = f"{t} ({res['threads']})" if t != "1" else "1"
                print(f"| {load_name} | {r} | {label} | {res['s_per_step']:.4f} | {res['s_per_step'] / one:.2f}x | "
                      f"{res['loss']:.6f} |", flush=True)


if __name__ == "__main__":
    main()
