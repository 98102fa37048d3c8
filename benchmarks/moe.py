"""A mixture of experts against the dense network of its active width, in turn in one process.

Three generators of the same shape (pre-norm RMSNorm blocks, rotary positions, SwiGLU networks; emb 256, 8 heads,
depth 4, context 256, 4,096 tokens per step by default), differing in their feed-forward networks only:

* ``dense``: one gated network of hidden size ``2 h``, as wide as the two experts a token uses together;
* ``moe``: 8 experts of hidden size ``h``, 2 per token, the fast path (compute-sparse dispatch);
* ``every``: the same mixture on its readable path, every expert on every token (``MoEFeedForward.reference``).

The steps are taken in turn (dense, moe, every, dense, ...; rotating), so each round's ratios compare steps a few
seconds apart; the table gives each model's median time and the median over the rounds of its ratio to ``dense``.
``--backward`` times a training step (forward, backward, AdamW), else a forward pass under ``no_grad``:

    python benchmarks/moe.py --threads 1
    python benchmarks/moe.py --threads 1 --backward
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
import torch.nn.functional as F

from torchformer import GTransformer, MoETransformer
from torchformer.nn.moe import MoEBlock, MoEFeedForward, MoEOptions


class EveryExpert(MoEFeedForward):
    """The mixture's readable path: every expert on every token."""

    def forward(self, x, mask=None):
        return self.reference(x, mask)


class EveryExpertBlock(MoEBlock):
    def feedforward_for(self, config):
        return EveryExpert


class EveryExpertTransformer(GTransformer):
    block_class = EveryExpertBlock


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--hidden", type=int, default=344, help="an expert's hidden size h (the dense network's: k h)")
    p.add_argument("--emb", type=int, default=256)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--backward", action="store_true", help="time a training step instead of a forward pass")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    shape = dict(prenorm=True, norm="rms", positions="rotary", activation="swiglu")
    options = (MoEOptions(experts=args.experts, top_k=args.top_k, expert_hidden=args.hidden),)
    torch.manual_seed(0)
    models = {
        "dense": GTransformer(args.emb, 8, args.depth, args.context, 256, ff_hidden=args.top_k * args.hidden, **shape),
        "moe": MoETransformer(args.emb, 8, args.depth, args.context, 256, options=options, **shape),
        "every": EveryExpertTransformer(args.emb, 8, args.depth, args.context, 256, options=options, **shape),
    }
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=1e-4) for name, m in models.items()}
    x = torch.randint(0, 256, (args.tokens // args.context, args.context), generator=torch.Generator().manual_seed(1))

    def step(name: str) -> float:
        model = models[name]
        start = time.perf_counter()
        if args.backward:
            loss = F.nll_loss(model(x).flatten(0, 1), x.flatten())
            optimizers[name].zero_grad(set_to_none=True)
            loss.backward()
            optimizers[name].step()
        else:
            with torch.no_grad():
                model(x)
        return time.perf_counter() - start

    names = list(models)
    for name in names:
        models[name].train(args.backward)
        step(name), step(name)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in names}
    ratios: dict[str, list[float]] = {name: [] for name in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        got = {name: step(name) for name in order}
        for name in names:
            times[name].append(got[name])
            ratios[name].append(got[name] / got["dense"])
    active = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    print(f"# {'training step' if args.backward else 'forward pass'}, {args.rounds} rounds in turn: emb {args.emb}, "
          f"depth {args.depth}, context {args.context}, {args.tokens} tokens; {args.experts} experts of {args.hidden}, "
          f"top {args.top_k}; {args.threads} thread(s), {platform.machine()} CPU, torch {torch.__version__}")
    print("| model | parameters | ms (median) | vs dense (median of rounds) |")
    print("| --- | ---: | ---: | ---: |")
    for name in names:
        print(f"| {name} | {active[name]:,} | {1000 * statistics.median(times[name]):.1f} | "
              f"{statistics.median(ratios[name]):.2f}x |")


if __name__ == "__main__":
    main()
