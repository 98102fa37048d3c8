"""Training steps of several models taken in turn in one process: their time ratios, robust to a drifting machine.

``benchmarks/step.py`` measures each configuration in a process of its own, one after the other: right for peak
memory, but on a shared or throttled CPU the speed of the machine drifts by 10 to 20 % between those processes, and
the ratios with it. Here every model is built in one process and the steps are taken in turn (fast, modern, torch,
fast, modern, torch, ... in a rotating order), so the steps compared in each round ran within a few seconds of each
other. Each round gives one ratio per model (its step over the reference's step of that round); the table reports
the median step time and the median of those ratios. The models and the step are ``step.py``'s (emb 256, 8 heads,
depth 4, 4,096 tokens per step, AdamW):

    python benchmarks/step_interleaved.py --threads 1                                # fast, modern, torch at 256
    python benchmarks/step_interleaved.py --threads 2 --kinds fast modern torch rms swiglu --rounds 15
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))  # step.py, beside this file
from step import PARTS, build, device_name  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--kinds", nargs="+", default=["fast", "modern", "torch"],
                   choices=["fast", "reference", "torch", *PARTS], help="the first is the reference of 'vs'")
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--tokens", type=int, default=4096, help="tokens per step (batch = tokens // context)")
    p.add_argument("--emb", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--rounds", type=int, default=10, help="steps of each model, after 2 warm-up steps each")
    args = p.parse_args()
    args.set = []  # build()'s --set options: none here
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    batch = args.tokens // args.context
    x = torch.randint(0, 256, (batch, args.context))
    y = torch.randint(0, 256, (batch, args.context))
    models = {kind: build(kind, args, args.context) for kind in args.kinds}
    optimizers = {kind: torch.optim.AdamW(m.parameters(), lr=1e-4) for kind, m in models.items()}

    def step(kind: str) -> float:
        start = time.perf_counter()
        loss = F.nll_loss(models[kind](x).flatten(0, 1), y.flatten())
        optimizers[kind].zero_grad(set_to_none=True)
        loss.backward()
        optimizers[kind].step()
        return time.perf_counter() - start

    for kind in args.kinds:
        for _ in range(2):
            step(kind)
    times: dict[str, list[float]] = {kind: [] for kind in args.kinds}
    for r in range(args.rounds):
        order = args.kinds[r % len(args.kinds):] + args.kinds[:r % len(args.kinds)]  # each kind first in turn
        for kind in order:
            times[kind].append(step(kind))
    reference = args.kinds[0]

    def ratio(kind: str, to: str) -> str:
        return f"{statistics.median(a / b for a, b in zip(times[kind], times[to])):.2f}x"

    print(f"# steps in turn, {args.rounds} rounds: emb {args.emb}, heads {args.heads}, depth {args.depth}, context "
          f"{args.context}, batch {batch}, {args.threads} thread(s), {device_name(torch.device('cpu'))}, torch "
          f"{torch.__version__}")
    torch_column = "torch" in args.kinds
    print(f"| implementation | ms/step (median) | vs {reference} (median of rounds)"
          + (" | vs torch.nn (median of rounds) |" if torch_column else " |"))
    print("| --- | ---: | ---:" + (" | ---: |" if torch_column else " |"))
    for kind in args.kinds:
        row = f"| {kind} | {1000 * statistics.median(times[kind]):.1f} | {ratio(kind, reference)}"
        print(row + (f" | {ratio(kind, 'torch')} |" if torch_column else " |"))


if __name__ == "__main__":
    main()
