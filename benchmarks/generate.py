"""Tokens per second of ``GTransformer.generate`` with and without the KV cache.

For each context length ``C`` a randomly initialised model (``seq_length=C``) is given a prompt of ``C - new``
tokens and generates ``new`` tokens greedily, so the last token is generated with a full context. Without the
cache every token costs a forward pass over up to ``C`` positions; with it, one position. The time includes
processing the prompt (one forward pass in both cases), as a user calling ``generate`` would see it.

    python benchmarks/generate.py                     # CPU, contexts 256 and 1024
    python benchmarks/generate.py --device cuda

Cached and uncached runs alternate within one process, so their ratio is meaningful even on a busy machine.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from torchformer.models import GTransformer


def timed(fn, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="'cpu', 'cuda', 'cuda:1', ...")
    parser.add_argument("--contexts", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per setting; the median is reported")
    parser.add_argument("--emb", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for PyTorch (default: its choice)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)

    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, device {device}, "
          f"threads {torch.get_num_threads()}")
    print(f"model: emb {args.emb}, heads {args.heads}, depth {args.depth}, vocab {args.vocab}; batch {args.batch}, "
          f"{args.new_tokens} new tokens, greedy, median of {args.repeats}\n")
    print("| context | prompt | no cache (tok/s) | cache (tok/s) | speed-up |")
    print("|--:|--:|--:|--:|--:|")
    for context in args.contexts:
        if args.new_tokens >= context:
            raise ValueError(f"--new-tokens must be smaller than every context, got {args.new_tokens} >= {context}")
        model = GTransformer(args.emb, args.heads, args.depth, context, args.vocab).to(device).eval()
        prompt = torch.randint(0, args.vocab, (args.batch, context - args.new_tokens), device=device)
        for cache in (True, False):  # warm-up: allocator, kernels, lazy initialisation
            model.generate(prompt, 2, temperature=0, use_cache=cache)
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.repeats):
            for cache in (True, False):
                times[cache].append(timed(
                    lambda: model.generate(prompt, args.new_tokens, temperature=0, use_cache=cache), device))
        rate = {cache: args.batch * args.new_tokens / statistics.median(t) for cache, t in times.items()}
        print(f"| {context} | {prompt.size(1)} | {rate[False]:.1f} | {rate[True]:.1f} | "
              f"{rate[True] / rate[False]:.1f}x |", flush=True)


if __name__ == "__main__":
    main()
