"""The attention figure: one head of scaled dot-product attention on a tiny example, every number from the library.

Four tokens (``t = 4``), head size ``s = 3``. The queries, keys and values are small seeded integers, so that a
reader can redo a dot product by hand. The weights and the outputs drawn are what
``torchformer.nn.attention.attention_reference`` returns for them under the mask ``AttentionMask(causal=True)``
builds. Before drawing, the script recomputes every step from the formulas the picture writes (the scores
``q·k / √s``, ``-inf`` above the diagonal, softmax row by row, ``Σ w v``) and stops with an AssertionError if the
library's weights or outputs differ from them by more than 1e-6, or if the mask is not the causal rule drawn.

Registered in ``docs/make_figures.py`` (``FIGURES``), which draws it:

    python docs/make_figures.py --only attention
"""

from __future__ import annotations

import math
import pathlib
from dataclasses import dataclass

import torch
from torch import Tensor

from torchformer.nn import attention as attention_code  # looked up when called, so a test can swap the function
from torchformer.nn.masks import AttentionMask

from figures.canvas import new_figure, save

T, S = 4, 3  # tokens (queries and keys), head size
SEED = 3  # the integers it draws give weights that are neither 0 nor 1 and rows that still add to 1.00 when rounded
TOLERANCE = 1e-6
INK, GREY = "#333333", "#666666"
COLOURS = {"q": "#c9daf8", "k": "#fce5cd", "v": "#d9ead3", "out": "#eeeeee", "masked": "#e6e6e6"}
HIGHLIGHT = "#c44e52"  # the query row the figure follows (make_figures.HEAD_COLOURS[3])
ROW = 2  # that row


@dataclass
class Example:
    """The tiny example, ``(t, s)`` or ``(t, t)`` each: the library's weights and outputs, and the scores they were
    checked against."""

    q: Tensor
    k: Tensor
    v: Tensor
    scores: Tensor  # q·k / √s, -inf where the mask forbids
    allowed: Tensor  # bool (t, t): True where query i may see key j
    weights: Tensor
    out: Tensor


def attention_example(seed: int = SEED) -> Example:
    """Run ``attention_reference`` on seeded integer ``q, k, v`` (``(1, 1, t, s)``, float64) under the causal mask,
    and check its weights and outputs against the picture's formulas, step by step. Raises AssertionError if they
    differ by more than ``TOLERANCE``."""
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randint(-2, 3, (1, 1, T, S), generator=generator, dtype=torch.float64) for _ in range(3))
    positions = torch.arange(T)
    allowed = AttentionMask(positions, positions, causal=True).allowed()  # (t, t)
    below = torch.tensor([[j <= i for j in range(T)] for i in range(T)])  # the causal rule the picture draws
    if not torch.equal(allowed, below):
        raise AssertionError("AttentionMask(causal=True) is not 'query i sees keys j <= i'")
    out, weights = attention_code.attention_reference(q, k, v, allowed)
    out, weights = out[0, 0], weights[0, 0]  # (t, s), (t, t)

    # The picture's formulas, one number at a time.
    q, k, v = q[0, 0], k[0, 0], v[0, 0]
    scores = torch.full((T, T), -math.inf, dtype=torch.float64)
    by_hand = torch.zeros(T, T, dtype=torch.float64)
    for i in range(T):
        for j in range(i + 1):
            scores[i, j] = sum(q[i, c] * k[j, c] for c in range(S)) / math.sqrt(S)  # q·k / √s
        exps = [math.exp(scores[i, j] - scores[i, : i + 1].max()) for j in range(i + 1)]  # the keys j <= i
        for j in range(i + 1):
            by_hand[i, j] = exps[j] / sum(exps)  # softmax of the row; the masked keys keep weight 0
    mixed = torch.stack([sum(by_hand[i, j] * v[j] for j in range(T)) for i in range(T)])  # o_i = Σ_j w_ij v_j
    if (weights - by_hand).abs().max() > TOLERANCE:
        raise AssertionError("attention_reference's weights are not softmax(q·k / √s) under the causal mask")
    if (out - mixed).abs().max() > TOLERANCE:
        raise AssertionError("attention_reference's outputs are not Σ w v")
    if not torch.allclose(weights.sum(-1), torch.ones(T, dtype=torch.float64), atol=TOLERANCE):
        raise AssertionError("a row of attention_reference's weights does not sum to 1")
    return Example(q, k, v, scores, allowed, weights, out)


def number(x: float, decimals: int = 2) -> str:
    """``x`` with ``decimals`` decimals and a true minus sign."""
    return f"{float(x):.{decimals}f}".replace("-", "\u2212")


def draw_attention(path: pathlib.Path, quick: bool = False) -> str:
    """Q and Kᵀ give the scores (q·k / √s, causal mask), softmax the weights, the weights and V the outputs."""
    from matplotlib import colormaps
    from matplotlib.patches import FancyArrowPatch, Rectangle

    ex = attention_example()
    shown = [[number(w) for w in row] for row in ex.weights.tolist()]
    for i, row in enumerate(shown):  # what a reader adds up must make 1.00 too
        if abs(sum(float(w.replace("\u2212", "-")) for w in row) - 1) > 1e-9:
            raise AssertionError(f"row {i} of the weights, rounded as drawn, does not add up to 1.00: pick another "
                                 "SEED")

    # Data units, y upwards. The two products are laid out as on paper: the scores where Q's rows meet Kᵀ's
    # columns, the outputs where the weights' rows meet V's columns. Q's cells (integers) are 1 wide, the others
    # wider, for two decimals and a sign.
    cw = 1.4
    x_q, x_s = 0.0, S + 1.0  # room between them for the labels q_i
    x_v = x_s + T * cw + 1.1  # and for v_j, o_i
    y_w = 0.0
    y_s = y_w + T + 1.9  # room for the softmax arrow
    y_k = y_s + T + 1.0
    xlim, ylim = (x_q - 0.3, x_v + S * cw + 0.2), (y_w - 3.4, y_k + S + 0.75)
    width = 6.4  # inches; the height follows, a data unit as tall as wide
    figure = new_figure(width, width * (ylim[1] - ylim[0]) / (xlim[1] - xlim[0]))
    ax = figure.add_axes([0, 0, 1, 1])
    blues = colormaps["Blues"]

    def cell(x, y, w, text, colour, colour_text=INK, size=13):
        ax.add_patch(Rectangle((x, y), w, 1, fc=colour, ec="white", lw=2))
        ax.text(x + w / 2, y + 0.5, text, ha="center", va="center", fontsize=size, color=colour_text)

    def matrix(x, y, w, texts, colours, text_colours=None):
        """Row 0 at the top, as a matrix is written; ``colours``: one per cell, or one for all."""
        for i, row in enumerate(texts):
            for j, text in enumerate(row):
                colour = colours if isinstance(colours, str) else colours[i][j]
                ink = text_colours[i][j] if text_colours else INK
                cell(x + j * w, y + len(texts) - 1 - i, w, text, colour, ink)

    def frame(x, y, w, h):
        ax.add_patch(Rectangle((x, y), w, h, fc="none", ec=HIGHLIGHT, lw=2.8, zorder=5))

    def arrow(x, y_from, y_to):
        ax.add_patch(FancyArrowPatch((x, y_from), (x, y_to), arrowstyle="-|>", mutation_scale=20, lw=2, color=INK,
                                     shrinkA=0, shrinkB=0))

    def label(x, y, text, size=13.5, ha="center", colour=INK, **style):
        ax.text(x, y, text, ha=ha, va="center", fontsize=size, color=colour, multialignment=ha, **style)

    integers = lambda m: [[number(x, 0) for x in row] for row in m.tolist()]  # noqa: E731

    # Kᵀ on top, one column per key; Q on the left, one row per query; the scores where they meet.
    matrix(x_s, y_k, cw, integers(ex.k.T), COLOURS["k"])
    for j in range(T):
        label(x_s + (j + 0.5) * cw, y_k + S + 0.35, f"$k_{j}$", size=15)
    label(x_s - 0.3, y_k + S / 2, "Kᵀ\nkeys", ha="right", fontweight="bold")
    matrix(x_q, y_s, 1, integers(ex.q), COLOURS["q"])
    label(x_q + S / 2, y_s + T + 0.5, "Q  queries", fontweight="bold")
    for i in range(T):
        label(x_s - 0.5, y_s + T - 0.5 - i, f"$q_{i}$", size=15)
    masked = [[not bool(ex.allowed[i, j]) for j in range(T)] for i in range(T)]
    grey_if_masked = [[GREY if m else INK for m in row] for row in masked]
    matrix(x_s, y_s, cw, [["\u2212\u221e" if masked[i][j] else number(ex.scores[i, j]) for j in range(T)]
                          for i in range(T)],
           [[COLOURS["masked"] if m else "#f7f7f7" for m in row] for row in masked], grey_if_masked)
    label(x_s + T * cw / 2, y_s + T + 0.5, "scores  q·k / √s", fontweight="bold")

    # V on the right, one row per key.
    matrix(x_v, y_s, cw, integers(ex.v), COLOURS["v"])
    label(x_v + S * cw / 2, y_s + T + 0.5, "V  values", fontweight="bold")
    for j in range(T):
        label(x_v - 0.5, y_s + T - 0.5 - j, f"$v_{j}$", size=15)

    # softmax, row by row: the scores become the weights; masked keys get exactly 0.
    arrow(x_s + T * cw / 2, y_s - 0.15, y_w + T + 0.15)
    label(x_s + T * cw / 2 + 0.25, y_w + T + 0.95, "softmax\nof each row", ha="left")
    weights = ex.weights.tolist()
    matrix(x_s, y_w, cw, [["0" if masked[i][j] else shown[i][j] for j in range(T)] for i in range(T)],
           [[COLOURS["masked"] if masked[i][j] else blues(0.12 + 0.6 * weights[i][j]) for j in range(T)]
            for i in range(T)],
           [[GREY if masked[i][j] else ("white" if weights[i][j] > 0.55 else INK) for j in range(T)]
            for i in range(T)])
    label(x_s - 0.3, y_w + T - 0.9, "weights", ha="right", fontweight="bold")
    label(x_s - 0.3, y_w + T - 2.0, "each row\nadds up to 1", size=12.5, ha="right", colour=GREY)
    label(x_s - 0.3, y_w + 0.6, "grey: a key\nafter its query", size=12.5, ha="right", colour=GREY)

    # Σ w v: output i mixes the values with row i of the weights.
    arrow(x_v + S * cw / 2, y_s - 0.15, y_w + T + 0.15)
    label(x_v + S * cw / 2 + 0.25, y_w + T + 0.95, "Σ w v", size=15, ha="left")
    matrix(x_v, y_w, cw, [[number(x) for x in row] for row in ex.out.tolist()], COLOURS["out"])
    for i in range(T):
        label(x_v - 0.5, y_w + T - 0.5 - i, f"$o_{i}$", size=15)
    label(x_v + S * cw / 2, y_w - 0.45, "outputs", fontweight="bold")

    # Follow one query: its row of Q, its scores (one of them worked out), its weights, its output.
    row = T - 1 - ROW  # rows are drawn from the top
    frame(x_q, y_s + row, S, 1)
    frame(x_s, y_k, cw, S)
    frame(x_s, y_s + row, T * cw, 1)
    frame(x_s, y_w + row, T * cw, 1)
    frame(x_v, y_w + row, S * cw, 1)
    q_row = ", ".join(number(x, 0) for x in ex.q[ROW].tolist())
    k_col = ", ".join(number(x, 0) for x in ex.k[0].tolist())
    dot = float(ex.q[ROW] @ ex.k[0])
    label(x_q, y_w - 1.35, f"$q_{ROW}$·$k_0$ / √{S} = ({q_row})·({k_col}) / √{S}\n"
          f"= {number(dot, 0)} / {math.sqrt(S):.2f} = {number(ex.scores[ROW, 0])}", ha="left", colour=HIGHLIGHT)
    label(x_q, y_w - 2.85, f"One head: t = {T} tokens, head size s = {S}. Numbers\nfrom attention_reference, "
          "rounded to 2 decimals.", size=12, ha="left", colour=GREY)
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.axis("off")
    save(figure, path)
    return (f"weights and outputs of attention_reference checked against softmax(q·k / √s) and Σ w v "
            f"(to {TOLERANCE:g})")
