"""The rotary layouts' cost, in one process, alternating rounds, median of each:

1. rotating queries of shape (b, h, t, s) with torchformer's Rotary (halves of each head) and InterleavedRotary
   (adjacent pairs), 1 thread;
2. ``--rows``: the two paths of the halves layout on queries as attention makes them (a transposed view, the heads
   side by side), forward only, for several batch sizes and lengths: ``RotateHalves.rotate_rows`` (whole rows of
   ``h * s`` numbers, and rows of angles built per call) against ``RotateHalves.by_halves``. ``rotate`` takes the
   rows from ``RotateHalves.rows_from`` numbers on.

    python benchmarks/rotary_layouts.py
    python benchmarks/rotary_layouts.py --rows --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from torchformer.nn.relative import InterleavedRotary, Rotary, RotateHalves


def layouts(shape: tuple[int, int, int, int] = (16, 8, 256, 32), rounds: int = 7, calls: int = 50) -> None:
    x = torch.randn(*shape)
    positions = torch.arange(shape[2])
    layouts = {"halves (Rotary)": Rotary(shape[3]), "pairs (InterleavedRotary)": InterleavedRotary(shape[3])}
    times = {name: [] for name in layouts}
    for _ in range(rounds):
        for name, rotary in layouts.items():
            rotary.rotate(x, positions)  # warm
            tic = time.perf_counter()
            for _ in range(calls):
                rotary.rotate(x, positions)
            times[name].append((time.perf_counter() - tic) / calls * 1e3)
    medians = {name: statistics.median(t) for name, t in times.items()}
    for name, ms in medians.items():
        print(f"{name}: {ms:.2f} ms per call, shape {shape}")
    print(f"pairs / halves: {medians['pairs (InterleavedRotary)'] / medians['halves (Rotary)']:.2f}x; "
          f"torch {torch.__version__}")


def rows_or_halves(heads: int = 8, head_size: int = 32, calls: int = 60) -> None:
    print(f"| b | t | numbers | rows (us) | halves (us) | rows / halves | # {heads} heads of {head_size}, "
          f"{torch.get_num_threads()} thread(s), torch {torch.__version__}, rows_from {RotateHalves.rows_from:,}")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for b, t in [(1, 1), (8, 1), (1, 256), (4, 256), (8, 256), (16, 128), (16, 256), (2, 1024)]:
        x = torch.randn(b, t, heads * head_size).view(b, t, heads, head_size).transpose(1, 2)  # as split_heads
        cos, sin = Rotary(head_size).angles(torch.arange(t), x.dtype)
        paths = {"rows": RotateHalves.rotate_rows, "halves": RotateHalves.by_halves}
        times = {name: [] for name in paths}
        for k in range(calls + 10):
            for name, path in paths.items():  # alternating: both see the same state of the machine
                tic = time.perf_counter()
                path(x, cos, sin)
                if k >= 10:
                    times[name].append(time.perf_counter() - tic)
        rows, halves = (1e6 * statistics.median(times[name]) for name in paths)
        print(f"| {b} | {t} | {x.numel():,} | {rows:.1f} | {halves:.1f} | {rows / halves:.2f} |")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", action="store_true", help="the rows path against the halves path, by size")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rows_or_halves() if args.rows else layouts()
