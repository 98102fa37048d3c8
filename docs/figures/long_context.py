"""The long-context figure: which keys each query sees under dense causal attention, the sparse transformer's two
patterns, and Transformer-XL's segment memory, each from the library's own masks and caches."""

from __future__ import annotations

import pathlib

import torch

from torchformer import SelfAttention
from torchformer.nn.cache import RingKVCache
from torchformer.nn.masks import AttentionMask, FixedPattern, StridedPattern

from figures.canvas import new_figure, save

N, L = 36, 6  # positions shown; the patterns' stride, the segments' length and the memory


def memory_visibility(n: int, segment: int, memory: int) -> torch.Tensor:
    """``(n, n)`` bool: which positions a query saw when a stream went through a ``SelfAttention`` segment by
    segment with a ring cache of ``memory + segment`` slots: the keys it gave a weight above 0."""
    torch.manual_seed(0)
    layer = SelfAttention(8, 1, causal=True, positions="rotary").double().eval()
    ring = RingKVCache(memory + segment)
    seen = torch.zeros(n, n, dtype=torch.bool)
    x = torch.randn(1, n, 8, dtype=torch.float64)
    with torch.no_grad():
        for start in range(0, n, segment):
            positions = torch.arange(start, start + segment)
            first = ring.empty
            _, weights = layer(x[:, start:start + segment], positions=positions, cache=ring, return_weights=True)
            keys = positions if first else ring.slots  # the first call attends over its own keys alone
            for row, query in enumerate(positions.tolist()):
                seen[query, keys[weights[0, 0, row] > 0]] = True
    return seen


def draw_long_context(path: pathlib.Path, quick: bool = False) -> str:
    """Four (n, n) visibility matrices in a 2 x 2 grid, with the number of pairs each keeps: readable at a phone's
    width as well as a page's."""
    from matplotlib.colors import ListedColormap

    positions = torch.arange(N)
    dense = AttentionMask(positions, positions, causal=True).allowed()
    strided = AttentionMask(positions, positions, causal=True, pattern=StridedPattern(L)).allowed()
    fixed = AttentionMask(positions, positions, causal=True, pattern=FixedPattern(L, 1)).allowed()
    memory = memory_visibility(N, L, L)
    panels = [(f"dense causal\n{int(dense.sum())} pairs", dense),
              (f"strided, stride {L}\n{int(strided.sum())} pairs", strided),
              (f"fixed, block {L}, summary 1\n{int(fixed.sum())} pairs", fixed),
              (f"segment memory\n(segments of {L}, memory {L})", memory)]
    figure = new_figure(6.2, 6.9)
    axes = figure.subplots(2, 2)
    colours = ListedColormap(["#f2f2f2", "#4c72b0"])
    for k, (ax, (title, allowed)) in enumerate(zip(axes.flat, panels)):
        ax.imshow(allowed.int().numpy(), cmap=colours, vmin=0, vmax=1, interpolation="nearest")
        ax.set_xticks(range(0, N, L))
        ax.set_yticks(range(0, N, L))
        ax.tick_params(labelsize=11)
        if k >= 2:  # the bottom row: one axis label per column is enough
            ax.set_xlabel("key j", fontsize=12.5)
        if k % 2 == 0:
            ax.set_ylabel("query i", fontsize=12.5)
        ax.set_title(title, fontsize=13.5)
    figure.subplots_adjust(left=0.11, right=0.98, top=0.9, bottom=0.08, wspace=0.22, hspace=0.42)
    save(figure, path)
    return "from AttentionMask.allowed() (patterns) and a RingKVCache's attention weights (memory)"
