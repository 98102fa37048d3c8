"""Why the masked-LM head scales its logits: the tiny model of ``tests/test_masked_lm.py`` trained two ways.

The sequences count up by one from a random start (mod 20), so a hidden token is its left neighbour plus one. The
model (width 32, 4 heads, 2 blocks, tied embedding) is trained with Adam for ``--steps`` steps, once with the head's
scale (``mlm_scale=True``: logits times ``e ** -0.5``, the default) and once without it, its tied embedding drawn
with standard deviation ``e ** -0.5`` instead (the same logits at the start). It reports the final training loss
and the accuracy on hidden tokens; guessing gets a loss of ``log 20`` (3.00) and an accuracy of 0.05.

    python benchmarks/mlm_head_scale.py --seeds 7 8 9
"""

from __future__ import annotations

import argparse
import math

import torch

from torchformer.models import MLMTransformer
from torchformer.train.masked_lm import mask_tokens, masked_lm_loss


def train(seed: int, steps: int, scaled: bool) -> tuple[float, float]:
    """The final training loss and the accuracy on hidden tokens of one run."""
    torch.manual_seed(seed)
    n, t, mask_id, emb = 21, 12, 21, 32
    model = MLMTransformer(emb, 4, 2, t, n + 1, tie_weights=True, mlm_scale=scaled)
    if not scaled:  # the same logit scale at the start, put into the embedding instead of the head
        with torch.no_grad():
            model.embedding.tokens.weight.normal_(0.0, emb ** -0.5)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(seed)

    def batch(b: int) -> torch.Tensor:
        start = torch.randint(0, 20, (b, 1), generator=g)
        return (start + torch.arange(t)) % 20 + 1  # ids 1..20

    losses = []
    for _ in range(steps):
        m = mask_tokens(batch(32), mask_id=mask_id, num_tokens=n + 1, generator=g)
        loss = masked_lm_loss(model(m.inputs), m.targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    m = mask_tokens(batch(256), mask_id=mask_id, num_tokens=n + 1, generator=g)
    with torch.no_grad():
        guess = model(m.inputs).argmax(-1)
    accuracy = (guess[m.chosen] == m.targets[m.chosen]).float().mean().item()
    return sum(losses[-20:]) / 20, accuracy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[7, 8, 9])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}; {args.steps} steps; guessing: loss {math.log(20):.2f}, accuracy 0.05\n")
    print("| seed | head scale: loss | accuracy | shrunk embedding, no scale: loss | accuracy |")
    print("|--:|--:|--:|--:|--:|")
    for seed in args.seeds:
        a, b = train(seed, args.steps, True), train(seed, args.steps, False)
        print(f"| {seed} | {a[0]:.3f} | {a[1]:.3f} | {b[0]:.3f} | {b[1]:.3f} |", flush=True)


if __name__ == "__main__":
    main()
