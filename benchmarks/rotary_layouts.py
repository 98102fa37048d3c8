"""The two rotary layouts' cost: rotating queries of shape (b, h, t, s) with torchformer's Rotary (halves of each
head) and InterleavedRotary (adjacent pairs), in one process, alternating rounds, median of each; 1 thread.

    python benchmarks/rotary_layouts.py
"""

from __future__ import annotations

import statistics
import time

import torch

from torchformer.nn.relative import InterleavedRotary, Rotary


def main(shape: tuple[int, int, int, int] = (16, 8, 256, 32), rounds: int = 7, calls: int = 50) -> None:
    torch.set_num_threads(1)
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


if __name__ == "__main__":
    main()
