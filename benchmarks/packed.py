"""Training steps on packed rows against length-bucketed padded batches, and flex attention against a dense mask.

    python benchmarks/packed.py --toy                                          # CPU: a smoke test of the script
    python benchmarks/packed.py --device cuda --compile --json out.json       # the GPU suite's stage

The same documents (seeded review-like lengths: lognormal, median about 200 tokens, cut to the row) are trained on
as a causal language model (``GTransformer``, pre-norm RMSNorm, rotary, SwiGLU, no dropout), a training step being a
forward pass, a backward pass and an AdamW step, in three ways:

* ``padded``: length-bucketed batches of ``--batch`` documents, each padded to its batch's longest (SDPA, a
  padding mask);
* ``packed-sdpa``: rows of ``--row`` positions holding whole documents (``torchformer.data.packing``), as many rows
  per batch as hold about ``--batch`` documents; ``documents=`` masks attention at their boundaries through SDPA with
  a dense ``(b, 1, t, t)`` boolean mask;
* ``packed-flex``: the same rows through flex attention (``impl="flex"``) with a block mask, which computes only the
  128 x 128 blocks holding a pair of one document. It needs ``--compile`` to be fast and CUDA for its backward pass.

Each kind runs ``--steps`` timed steps after ``--warmup`` (the compilations), in one process, one after the other.
Printed: real (non-padding) tokens per second, the padding share of the timed batches, and each kind's ratio to
``padded`` in the same run. On CUDA the model runs in bfloat16 autocast.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from torchformer import GTransformer
from torchformer.data.batching import ClassificationBatches
from torchformer.data.packing import PackedBatches, pack

KINDS = ("padded", "packed-sdpa", "packed-flex")


def lengths_of(n: int, row: int, seed: int) -> list[int]:
    """``n`` review-like document lengths (a long tail), each cut to ``row``."""
    rng = random.Random(seed)
    return [min(row, int(rng.lognormvariate(5.3, 0.75)) + 2) for _ in range(n)]


def batches(kind: str, encoded: list[list[int]], args: argparse.Namespace, device: torch.device) -> list[tuple]:
    """``--warmup + --steps`` batches of ``kind`` as ``(ids, mask, documents)``, cycling over an epoch if needed."""
    g = torch.Generator().manual_seed(args.seed)
    if kind == "padded":
        epoch = [(ids, mask, None) for ids, mask, _ in
                 ClassificationBatches(encoded, [0] * len(encoded), batch_size=args.batch, generator=g, device=device)]
    else:
        rows = len(pack([len(e) for e in encoded], args.row))
        per_batch = max(1, round(args.batch * rows / len(encoded)))
        epoch = [(ids, mask, documents) for ids, documents, mask in
                 PackedBatches(encoded, row_length=args.row, batch_size=per_batch, generator=g, device=device)]
    need = args.warmup + args.steps
    return [epoch[i % len(epoch)] for i in range(need)]


def measure(kind: str, encoded: list[list[int]], args: argparse.Namespace) -> dict:
    """Real tokens per second of ``kind``'s timed training steps, and their padding share."""
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    impl = "flex" if kind == "packed-flex" else "sdpa"
    model = GTransformer(args.emb, args.heads, args.depth, args.row, args.vocab, norm="rms", prenorm=True,
                         activation="swiglu", positions="rotary", impl=impl).to(device)
    model.check_values = False  # the ids are in range: no host sync per step
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    fast = torch.compile(model) if args.compile else model
    steps = batches(kind, encoded, args, device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def step(ids, mask, documents):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logp = fast(ids, mask) if documents is None else fast(ids, mask, documents=documents)  # (b, t, v)
        # The next token of each real token that has one in its document (a padded position's target: ignored).
        same = mask[:, 1:] & (mask[:, :-1] if documents is None else documents[:, 1:] == documents[:, :-1])
        targets = ids[:, 1:].masked_fill(~same, -100)
        loss = F.nll_loss(logp[:, :-1].float().flatten(0, 1), targets.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for batch in steps[:args.warmup]:
        step(*batch)
    sync()
    timed = steps[args.warmup:]
    times = []
    for batch in timed:
        tic = time.perf_counter()
        step(*batch)
        sync()
        times.append(time.perf_counter() - tic)
    real = sum(int(mask.sum()) for _, mask, _ in timed)
    positions = sum(mask.numel() for _, mask, _ in timed)
    return {"kind": kind, "tok_s": real / sum(times), "ms_per_step": 1000 * statistics.median(times),
            "padding": 1 - real / positions, "rows_per_step": statistics.mean(ids.size(0) for ids, _, _ in timed),
            "steps": len(timed)}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    p.add_argument("--row", type=int, default=1024, help="positions of a packed row (and the longest document)")
    p.add_argument("--batch", type=int, default=32, help="documents per step (packed: about as many)")
    p.add_argument("--documents", type=int, default=4000, help="documents in the pool the batches come from")
    p.add_argument("--emb", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--steps", type=int, default=20, help="timed steps per kind")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (the compilations)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (flex attention needs it)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--toy", action="store_true", help="tiny sizes for a CPU smoke test (padded and packed-sdpa)")
    p.add_argument("--json", help="also write the rows to this file")
    args = p.parse_args(argv)
    if args.toy:
        args.row, args.batch, args.documents, args.emb, args.heads, args.depth, args.vocab = 256, 8, 200, 32, 2, 1, 64
        args.steps, args.warmup = min(args.steps, 3), min(args.warmup, 1)
        args.kinds = [k for k in args.kinds if k != "packed-flex"]
    if args.device == "cpu" and "packed-flex" in args.kinds:
        p.error("packed-flex: flex attention has no backward pass on the CPU; leave it out of --kinds (or --toy)")
    return args


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed + 1)
    encoded = [[rng.randrange(args.vocab) for _ in range(n)] for n in lengths_of(args.documents, args.row, args.seed)]
    print(f"device {args.device}, torch {torch.__version__}, {'compiled' if args.compile else 'eager'}; "
          f"GTransformer emb {args.emb}, {args.heads} heads, depth {args.depth}; {len(encoded):,} documents "
          f"(median {statistics.median(len(e) for e in encoded):.0f} tokens), rows of {args.row}, about "
          f"{args.batch} documents per step")
    print(f"{'kind':>12} {'real tok/s':>12} {'ms/step':>9} {'rows':>6} {'padding':>8} {'x padded':>9}")
    rows = []
    for kind in args.kinds:
        torch._dynamo.reset()  # each kind compiles for itself
        row = measure(kind, encoded, args)
        base = next((r["tok_s"] for r in rows if r["kind"] == "padded"), None)
        row["ratio"] = None if base is None else row["tok_s"] / base
        rows.append(row)
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}"
        print(f"{kind:>12} {row['tok_s']:>12,.0f} {row['ms_per_step']:>9.1f} {row['rows_per_step']:>6.1f} "
              f"{row['padding']:>8.1%} {ratio:>9}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "torch": torch.__version__, "rows": rows}, f, indent=2)
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
