"""The operations a training step spends its time in, by ``torch.profiler`` on the CPU: where to look next.

The step of ``benchmarks/step.py`` (emb 256, 8 heads, depth 4, batch 16, context 256, AdamW), after 2 warm-up
steps, 3 steps profiled; the table lists the operations by their own time (without the operations they call), per step.

    python benchmarks/profile_step.py --threads 1                       # the plain model (GTransformer's defaults)
    python benchmarks/profile_step.py --threads 1 --modern              # the presets' parts (rotary, RMSNorm, ...)
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from torchformer import GTransformer

MODERN = dict(positions="rotary", norm="rms", activation="swiglu", prenorm=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--modern", action="store_true", help="the presets' architecture: " + ", ".join(
        f"{k}={v}" for k, v in MODERN.items()))
    p.add_argument("--rows", type=int, default=12)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = GTransformer(256, 8, 4, 256, 256, **(MODERN if args.modern else {}))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = torch.randint(0, 256, (16, 256)), torch.randint(0, 256, (16, 256))

    def step() -> None:
        loss = F.nll_loss(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(2):
        step()
    steps = 3
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events) / steps / 1000
    print(f"# {'modern' if args.modern else 'plain'} model, {args.threads} thread(s), torch {torch.__version__}: "
          f"{total:.0f} ms of operations per step (profiled)")
    print("| operation | ms per step | share | calls per step |")
    print("| --- | ---: | ---: | ---: |")
    for e in events[:args.rows]:
        ms = e.self_cpu_time_total / steps / 1000
        print(f"| `{e.key[:60]}` | {ms:.1f} | {ms / total:.1%} | {e.count // steps} |")


if __name__ == "__main__":
    main()
