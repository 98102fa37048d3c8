"""Time and memory of causal attention at long contexts: dense, and the sparse transformer's fixed pattern (#30).

    python benchmarks/long_context.py                                   # CPU: contexts 1024-8192, forward only
    python benchmarks/long_context.py --device cuda --backward --json out.json   # the GPU suite's stage

One attention call, ``(b, h, n, s)`` queries, keys and values, causal, in three ways:

* ``dense``: ``scaled_dot_product_attention(is_causal=True)``, no mask tensor (the fused kernels);
* ``fixed-mask``: the fixed pattern (blocks of ``l = round(sqrt(n))``, one summary position each) as a dense
  boolean mask through the same function: the scores of every pair are computed, then most are thrown away;
* ``fixed-flex``: the same pattern through ``torch.compile(flex_attention)`` with a block mask (128 x 128 blocks),
  which computes only the blocks holding an allowed pair.

Each measurement runs in a fresh process. On CUDA the peak memory is ``torch.cuda.max_memory_allocated`` during
the calls, over what the inputs hold; on the CPU it is not reported (the process's peak resident memory is a
high-water mark that the warm-up, and flex attention's compilation, set before the timed calls). Times are medians of ``--repeats`` calls after warm-up,
and ratios are against ``dense`` in the same run. The CPU has no flex backward, so ``--backward`` (a forward and a
backward pass) is for CUDA. Also printed: the share of the ``n * (n + 1) / 2`` causal pairs the pattern keeps, and
the share of blocks the block mask keeps (what flex attention computes).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

KINDS = ("dense", "fixed-mask", "fixed-flex")


def fixed_rule(n: int):
    """The pattern's stride and its rule as flex attention's mask_mod, from the library's FixedPattern."""
    from torchformer.nn.masks import FixedPattern

    stride = max(1, round(math.sqrt(n)))
    pattern = FixedPattern(stride, 1)

    def mask_mod(b, h, i, j):
        return (j <= i) & pattern.rule(i, j)

    return stride, pattern, mask_mod


def measure(kind: str, n: int, args: argparse.Namespace) -> dict:
    """One kind at one context, in this process: median ms per call, peak memory in MB, pattern statistics."""
    device = torch.device(args.device)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    q, k, v = (torch.randn(args.batch, args.heads, n, args.head_size, device=device, dtype=dtype,
                           requires_grad=args.backward) for _ in range(3))
    stride, pattern, mask_mod = fixed_rule(n)
    positions = torch.arange(n, device=device)
    row: dict = {"kind": kind, "context": n, "stride": stride}
    if kind == "dense":
        def call():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    elif kind == "fixed-mask":
        allowed = (positions[None, :] <= positions[:, None]) & pattern.allows(positions, positions)  # (n, n)
        row["pairs_kept"] = allowed.sum().item() / (n * (n + 1) / 2)

        def call():
            return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    else:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        block_mask = create_block_mask(mask_mod, None, None, n, n, device=device)
        row["blocks_kept"] = 1 - block_mask.sparsity() / 100  # of all n/128 x n/128 blocks
        compiled = torch.compile(flex_attention)

        def call():
            return compiled(q, k, v, block_mask=block_mask)

    def step():
        out = call()
        if args.backward:
            out.sum().backward()
        return out

    step()  # warm-up (and compilation)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    times = []
    for _ in range(args.repeats):
        tic = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - tic)
    peak_mb = round((torch.cuda.max_memory_allocated() - base) / 2**20, 1) if device.type == "cuda" else None
    row.update(ms=1000 * statistics.median(times), peak_mb=peak_mb)
    return row


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    p.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--backward", action="store_true", help="time a forward and a backward pass (CUDA)")
    p.add_argument("--json", help="also write the rows to this file")
    p.add_argument("--one", nargs=2, metavar=("KIND", "CONTEXT"), help=argparse.SUPPRESS)  # a child's measurement
    return p.parse_args(argv)


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.one:
        print(json.dumps(measure(args.one[0], int(args.one[1]), args)))
        return []
    if args.backward and args.device == "cpu" and "fixed-flex" in args.kinds:
        sys.exit("--backward: flex attention has no backward pass on the CPU; leave out fixed-flex or --backward")
    rows = []
    child_args = ["--device", args.device, "--batch", str(args.batch), "--heads", str(args.heads), "--head-size",
                  str(args.head_size), "--repeats", str(args.repeats), "--threads", str(args.threads),
                  *(["--backward"] if args.backward else [])]
    print(f"device {args.device}, batch {args.batch}, heads {args.heads}, head size {args.head_size}, "
          f"{'forward + backward' if args.backward else 'forward'}, {args.threads} thread(s), torch {torch.__version__}")
    print(f"{'context':>8} {'kind':>11} {'stride':>6} {'ms':>9} {'x dense':>8} {'peak MB':>9} {'kept':>14}")
    for n in args.contexts:
        dense_ms = None
        for kind in args.kinds:
            done = subprocess.run([sys.executable, __file__, *child_args, "--one", kind, str(n)], capture_output=True,
                                  text=True, env={**os.environ})
            if done.returncode != 0:
                row = {"kind": kind, "context": n, "error": done.stderr.strip().splitlines()[-1][:200]}
                print(f"{n:>8} {kind:>11} failed: {row['error']}")
            else:
                row = json.loads(done.stdout.strip().splitlines()[-1])
                dense_ms = row["ms"] if kind == "dense" else dense_ms
                ratio = f"{row['ms'] / dense_ms:.2f}" if dense_ms else "-"
                kept = (f"{row['pairs_kept']:.1%} pairs" if "pairs_kept" in row
                        else f"{row['blocks_kept']:.1%} blocks" if "blocks_kept" in row else "")
                peak = "-" if row["peak_mb"] is None else f"{row['peak_mb']:.1f}"
                print(f"{n:>8} {kind:>11} {row['stride']:>6} {row['ms']:>9.1f} {ratio:>8} {peak:>9} {kept:>14}")
            rows.append(row)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"rows": rows, "device": args.device, "torch": torch.__version__}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
