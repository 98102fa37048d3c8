"""One training step (forward + backward + AdamW update) of a GTransformer, three ways, measured in one run:

* ``fast``:      torchformer's default attention (``scaled_dot_product_attention``)
* ``reference``: torchformer's readable matmul-softmax-matmul attention (``impl="reference"``)
* ``torch``:     ``torch.nn.TransformerEncoder`` of the same size with a causal mask, between the same embedding
                 and output layers

Every configuration runs in its own subprocess so that its peak memory is its own (CUDA: peak allocated;
CPU: peak resident set size of the process, which includes the ~0.3 GB of the Python + torch runtime).

    python benchmarks/step.py                       # CPU defaults: emb 256, 8 heads, depth 4, context 256 and 1024
    python benchmarks/step.py --device cuda --bf16  # on a GPU, with bf16 autocast
    python benchmarks/step.py --kinds fast rotary alibi relative rms swiglu relu2 gqa window   # the parts' cost
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
from torch import nn

from torchformer import GTransformer


class TorchEncoderLM(nn.Module):
    """The same language model as GTransformer, but with torch.nn.TransformerEncoder as its stack of blocks."""

    def __init__(self, emb: int, heads: int, depth: int, seq_length: int, num_tokens: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(num_tokens, emb)
        self.positions = nn.Embedding(seq_length, emb)
        layer = nn.TransformerEncoderLayer(emb, heads, 4 * emb, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.toprobs = nn.Linear(emb, num_tokens)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.size(1)
        h = self.tokens(x) + self.positions(torch.arange(t, device=x.device))
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=x.device)
        h = self.blocks(h, mask=mask, is_causal=True)
        return F.log_softmax(self.toprobs(h), dim=-1)


# The parts of current models (docs/relative-positions.md, docs/modern-blocks.md), each on the fast path: compare
# with "fast" in the same run to get the cost of the part.
PARTS = {
    "rotary": dict(positions="rotary"),
    "alibi": dict(positions="alibi"),
    "relative": dict(positions="relative"),
    "rms": dict(norm="rms"),
    "relu2": dict(activation="relu2"),
    "swiglu": dict(activation="swiglu"),
    "geglu": dict(activation="geglu"),
    "gqa": dict(kv_heads=2),
    "window": dict(window=128),
}


def build(kind: str, args, context: int) -> nn.Module:
    if kind == "torch":
        return TorchEncoderLM(args.emb, args.heads, args.depth, context, 256)
    if kind in PARTS:
        return GTransformer(args.emb, args.heads, args.depth, context, 256, **PARTS[kind])
    impl = "sdpa" if kind == "fast" else "reference"
    return GTransformer(args.emb, args.heads, args.depth, context, 256, impl=impl)


def run_one(args) -> dict:
    """Time ``args.steps`` training steps of one (kind, context) configuration; runs in its own process."""
    torch.manual_seed(0)
    device = torch.device(args.device)
    context, batch = args.context, args.tokens // args.context
    model = build(args.kind, args, context).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, 256, (batch, context), device=device)
    y = torch.randint(0, 256, (batch, context), device=device)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if args.bf16 else torch.autocast("cpu", enabled=False)

    def step() -> None:
        with amp:
            loss = F.nll_loss(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(args.warmup):
        step()
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    ms = 1000 * statistics.median(times)
    if device.type == "cuda":
        peak_mb = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    return {"kind": args.kind, "context": context, "batch": batch, "ms": ms, "tok_s": batch * context / ms * 1000,
            "peak_mb": peak_mb}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (CUDA)")
    p.add_argument("--emb", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--contexts", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--tokens", type=int, default=4096, help="tokens per batch (batch size = tokens // context)")
    p.add_argument("--kinds", nargs="+", default=["fast", "reference", "torch"],
                   help=f"fast, reference, torch, or a part on the fast path: {', '.join(PARTS)}")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--kind", help=argparse.SUPPRESS)  # internal: run one configuration in this process
    p.add_argument("--context", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.kind:
        print(json.dumps(run_one(args)))
        return

    print(f"# GTransformer training step: emb {args.emb}, heads {args.heads}, depth {args.depth}, "
          f"{args.tokens} tokens/step, device {args.device}{', bf16 autocast' if args.bf16 else ''}, "
          f"torch {torch.__version__}, median of {args.steps} steps after {args.warmup} warm-up")
    print("| context | batch | implementation | ms/step | tokens/s | peak memory (MB) | vs torch.nn | time vs fast |")
    print("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    forwarded = [a for a in sys.argv[1:]]
    for context in args.contexts:
        rows = []
        for kind in args.kinds:
            cmd = [sys.executable, __file__, *forwarded, "--kind", kind, "--context", str(context)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
        base = next((r["ms"] for r in rows if r["kind"] == "torch"), None)
        fast = next((r["ms"] for r in rows if r["kind"] == "fast"), None)
        for r in rows:
            ratio = f"{base / r['ms']:.2f}x" if base else "-"
            cost = f"{r['ms'] / fast:.2f}x" if fast else "-"  # > 1: the part makes the step slower
            print(f"| {r['context']} | {r['batch']} | {r['kind']} | {r['ms']:.1f} | {r['tok_s']:,.0f} | "
                  f"{r['peak_mb']:,.0f} | {ratio} | {cost} |", flush=True)


if __name__ == "__main__":
    main()
