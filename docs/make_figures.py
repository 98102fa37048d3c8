"""Draw the figures of the docs from the library itself, so that they stay true to the code.

The figures of the concept pages are drawn here; those of the models, of decoding, of attention's arithmetic and of
the package's architecture live in ``docs/figures/`` (``models.py``, ``decoding.py``, ``attention.py``,
``architecture.py``), and ``docs/figures/canvas.py`` holds what all share (a figure without pyplot,
saved with no timestamp). Every figure is computed or checked by torchformer's own modules: the masks come from
``AttentionMask``, the sinusoids from ``sinusoidal_table``, the tensor shapes of the heads figure from running
``SelfAttention``, and the wiring of the block diagram is checked against ``TransformerBlock`` and ``Encoder``
before it is drawn (the script stops with an error if the code and the picture disagree). The numbers of the
attention schematic are ``attention_reference``'s, checked against the formulas the picture writes; the arrows of
the architecture are the package's imports, read with ``ast``, and its layering (the core imports no experiment
support, no cycle between boxes) is checked too. The attention map is measured on a small model that the script
trains, seeded, in a few seconds on one CPU thread.

    python docs/make_figures.py                            # every figure, into docs/images/
    python docs/make_figures.py --only masks               # one figure (repeat --only for more)
    python docs/make_figures.py --out /tmp/figures         # somewhere else
    python docs/make_figures.py --quick                    # train for a few steps only (the tests use this)

The PNGs are written without a timestamp or version in their metadata, so regenerating an unchanged figure with the
same matplotlib gives the same file, and ``git status`` shows only the figures that really changed.
Needs matplotlib (``pip install matplotlib``); run it with the library importable (``PYTHONPATH=src`` in a checkout).
"""

from __future__ import annotations

import argparse
import pathlib
import time
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from torchformer import Encoder, SelfAttention, TransformerBlock, TransformerConfig
from torchformer.models import Seq2SeqTransformer
from torchformer.nn.masks import AttentionMask, causal_mask, document_positions
from torchformer.nn.positions import sinusoidal_table
from torchformer.train.inspection import capture_attention

# docs/ on the path, as `python docs/make_figures.py` has it: the tests load this file by its path, and
# import docs/figures/ through it.
import sys  # noqa: E402
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
# The checks of the attention and architecture figures are imported here too, for the tests to call (F401).
from figures.architecture import draw_architecture  # noqa: E402
from figures.architecture import box_edges, check_layering, check_picture, module_edges  # noqa: E402, F401
from figures.attention import draw_attention  # noqa: E402
from figures.attention import attention_example  # noqa: E402, F401
from figures.canvas import new_figure, save  # noqa: E402
from figures.experts import draw_cache_per_token, draw_expert_routing  # noqa: E402
from figures.long_context import draw_long_context  # noqa: E402
from figures.models import draw_model_decoder_only, draw_model_encoder_decoder  # noqa: E402
from figures.decoding import (  # noqa: E402
    draw_beam_search, draw_going_big_memory, draw_pooling, draw_sampling, draw_tokens,
)

IMAGES = pathlib.Path(__file__).resolve().parent / "images"

# One colour per head (and per kind of part in the block diagram), reused across the figures so they read alike.
HEAD_COLOURS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52"]
PART_COLOURS = {"attention": "#c9daf8", "ff": "#d9ead3", "norm": "#fff2cc", "drop": "#eeeeee", "final": "#fce5cd"}


# --- post-norm and pre-norm ---------------------------------------------------------------------------------------


def check_block_wiring() -> None:
    """Raise if ``TransformerBlock`` and ``Encoder`` are not wired as the diagram draws them.

    The diagram says: post-norm ``h = norm1(x + drop(attention(x)))``, ``y = norm2(h + drop(ff(h)))``; pre-norm
    ``h = x + drop(attention(norm1(x)))``, ``y = h + drop(ff(norm2(h)))``; and only a pre-norm stack ends with a
    norm of its own. We recompute each block by hand from its own parts and compare.
    """
    torch.manual_seed(0)
    x = 3 * torch.randn(2, 5, 16) + 1  # not normalised, so a missing or misplaced norm shows
    for prenorm in (False, True):
        config = TransformerConfig(16, 4, depth=2, prenorm=prenorm)
        block = TransformerBlock(config).eval()  # eval: dropout is the identity, as in the formulas
        attention, ff, norm1, norm2 = block.attention, block.ff, block.norm1, block.norm2
        with torch.no_grad():
            # Give the norms a non-trivial scale and shift, so that norm1 and norm2 cannot stand in for each other.
            for norm in (norm1, norm2):
                norm.weight.uniform_(0.5, 1.5)
                norm.bias.uniform_(-0.5, 0.5)
            if prenorm:
                h = x + attention(norm1(x))
                by_hand = h + ff(norm2(h))
            else:
                h = norm1(x + attention(x))
                by_hand = norm2(h + ff(h))
            if not torch.allclose(block(x), by_hand, atol=1e-5):
                raise AssertionError(f"TransformerBlock(prenorm={prenorm}) is no longer wired as the diagram draws it")
            stack = Encoder(config).eval()
            final = stack.norm
            expected = nn.LayerNorm if prenorm else nn.Identity
            if type(final) is not expected:
                raise AssertionError(f"Encoder(prenorm={prenorm}).norm is {type(final).__name__}, the diagram says "
                                     f"{expected.__name__}")
            through = x
            for inner in stack.blocks:
                through = inner(through)
            if not torch.allclose(stack(x), final(through), atol=1e-5):
                raise AssertionError("Encoder no longer applies its norm once, after the last block")


def draw_norm_placement(path: pathlib.Path, quick: bool = False) -> str:
    """Post-norm and pre-norm blocks side by side, bottom to top as in Vaswani et al.'s figure."""
    from matplotlib.patches import Circle, FancyArrowPatch, FancyBboxPatch

    check_block_wiring()
    figure = new_figure(7.8, 7.0)
    axes = figure.subplots(1, 2)
    box_w, box_h = 2.9, 0.5

    def arrow(ax, start, end, **style):
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=11, lw=1.2, color="#333333",
                                     shrinkA=0, shrinkB=0, **style))

    def line(ax, points):
        xs, ys = zip(*points)
        ax.plot(xs, ys, color="#333333", lw=1.2, solid_capstyle="butt")

    def box(ax, y, label, code, kind, height=box_h):
        ax.add_patch(FancyBboxPatch((-box_w / 2, y - height / 2), box_w, height,
                                    boxstyle="round,pad=0.02,rounding_size=0.08", fc=PART_COLOURS[kind],
                                    ec="#555555", lw=1))
        if code:
            ax.text(0, y + 0.08, label, ha="center", va="center", fontsize=10.5)
            ax.text(0, y - 0.14, code, ha="center", va="center", fontsize=8.5, family="monospace", color="#444444")
        else:
            ax.text(0, y, label, ha="center", va="center", fontsize=9, color="#444444")

    def plus(ax, y):
        ax.add_patch(Circle((0, y), 0.2, fc="white", ec="#333333", lw=1.2))
        ax.text(0, y - 0.01, "+", ha="center", va="center", fontsize=13)

    def skip(ax, y_from, y_plus, x_side=-1.9):
        """The residual path: leaves the main line at y_from, rejoins it at the + at y_plus."""
        line(ax, [(0, y_from), (x_side, y_from), (x_side, y_plus)])
        arrow(ax, (x_side, y_plus), (-0.2, y_plus))
        ax.text(x_side - 0.1, (y_from + y_plus) / 2, "residual\n(identity)", ha="right", va="center", fontsize=8.5,
                color="#666666")

    def sublayer(ax, y0, prenorm, part, part_code, kind, norm_code):
        """One residual sublayer from y0 (where the stream arrives); returns the y where its output leaves."""
        branch = y0 + 0.35  # where the skip leaves the main line
        if prenorm:
            ys = dict(norm=y0 + 1.0, part=y0 + 1.85, drop=y0 + 2.55, plus=y0 + 3.15)
            line(ax, [(0, y0), (0, branch)])
            arrow(ax, (0, branch), (0, ys["norm"] - box_h / 2))
            box(ax, ys["norm"], "norm", norm_code, "norm")
            arrow(ax, (0, ys["norm"] + box_h / 2), (0, ys["part"] - box_h / 2))
            box(ax, ys["part"], part, part_code, kind)
            arrow(ax, (0, ys["part"] + box_h / 2), (0, ys["drop"] - 0.15))
            box(ax, ys["drop"], "dropout", "", "drop", height=0.3)
            arrow(ax, (0, ys["drop"] + 0.15), (0, ys["plus"] - 0.2))
            plus(ax, ys["plus"])
            skip(ax, branch, ys["plus"])
            return ys["plus"] + 0.2
        ys = dict(part=y0 + 1.0, drop=y0 + 1.7, plus=y0 + 2.3, norm=y0 + 3.05)
        line(ax, [(0, y0), (0, branch)])
        arrow(ax, (0, branch), (0, ys["part"] - box_h / 2))
        box(ax, ys["part"], part, part_code, kind)
        arrow(ax, (0, ys["part"] + box_h / 2), (0, ys["drop"] - 0.15))
        box(ax, ys["drop"], "dropout", "", "drop", height=0.3)
        arrow(ax, (0, ys["drop"] + 0.15), (0, ys["plus"] - 0.2))
        plus(ax, ys["plus"])
        skip(ax, branch, ys["plus"])
        arrow(ax, (0, ys["plus"] + 0.2), (0, ys["norm"] - box_h / 2))
        box(ax, ys["norm"], "norm", norm_code, "norm")
        return ys["norm"] + box_h / 2

    for ax, prenorm in zip(axes, (False, True)):
        ax.text(0, 0.0, "x  (b, t, e)", ha="center", va="center", fontsize=9)
        ax.text(0, -0.3, "from the embedding or the previous block", ha="center", va="center", fontsize=8.5,
                color="#666666")
        y = sublayer(ax, 0.2, prenorm, "self-attention", "attention", "attention", "norm1")
        y = sublayer(ax, y, prenorm, "feed-forward", "ff", "ff", "norm2")
        top = y + 0.35
        line(ax, [(0, y), (0, top)])
        # The block repeats depth times; a bracket on the right says so.
        ax.plot([1.65, 1.8, 1.8, 1.65], [0.35, 0.35, top, top], color="#888888", lw=1)
        ax.text(1.9, (0.35 + top) / 2, "one block,\nrepeated\nconfig.depth\ntimes", ha="left", va="center",
                fontsize=8.5, color="#666666")
        if prenorm:
            final_y = top + 0.75
            arrow(ax, (0, top), (0, final_y - box_h / 2))
            box(ax, final_y, "final norm", "Encoder/Decoder.norm", "final")
            ax.text(box_w / 2 + 0.12, final_y, "once per stack,\nafter the last block:\nthe stream was\n"
                    "never normalised", ha="left", va="center", fontsize=8.5, color="#666666")
            out_y = final_y + 1.05
            arrow(ax, (0, final_y + box_h / 2), (0, out_y - 0.15))
        else:
            out_y = top + 0.75 + 1.05
            arrow(ax, (0, top), (0, out_y - 0.15))
            ax.text(0.12, top + 0.9, "Encoder/Decoder.norm is nn.Identity:\nthe last block already normalised",
                    ha="left", va="center", fontsize=8.5, color="#666666")
        ax.text(0, out_y, "the stack's output  (b, t, e)", ha="center", va="center", fontsize=9)
        title = ("pre-norm   (prenorm=True)" if prenorm else "post-norm   (prenorm=False, default)")
        ax.set_title(title, fontsize=11.5)
        formula = ("h = x + drop(attention(norm1(x)))\ny = h + drop(ff(norm2(h)))" if prenorm
                   else "h = norm1(x + drop(attention(x)))\ny = norm2(h + drop(ff(h)))")
        ax.text(0, -1.0, formula, ha="center", va="center", fontsize=9.5, family="monospace", multialignment="left")
        ax.set_xlim(-3.2, 3.5)
        ax.set_ylim(-1.4, out_y + 0.3)
        ax.set_aspect("equal")
        ax.axis("off")
    figure.subplots_adjust(left=0.01, right=0.99, top=0.95, bottom=0.01, wspace=0.05)
    save(figure, path)
    return "wiring checked against TransformerBlock and Encoder"


# --- masks --------------------------------------------------------------------------------------------------------


def draw_masks(path: pathlib.Path, quick: bool = False) -> str:
    """The causal rule, a padding mask, and both at once, as the (t, u) matrices AttentionMask.allowed() builds."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    tokens = ["the", "cat", "sat", "down", "<pad>", "<pad>"]  # one sequence of 4 real tokens, right-padded to 6
    t = len(tokens)
    positions = torch.arange(t)
    real = torch.tensor([[token != "<pad>" for token in tokens]])  # (b, t) = (1, 6): True for real tokens

    causal = AttentionMask(positions, positions, causal=True).allowed()  # (t, t)
    if not torch.equal(causal, causal_mask(t)):
        raise AssertionError("AttentionMask's causal rule and causal_mask disagree")
    padding = AttentionMask(positions, positions, real).allowed()  # (b, 1, 1, u): the same row for every query
    both = AttentionMask(positions, positions, real, causal=True).allowed()  # (b, 1, t, u)
    panels = [
        ("causal=True\n(causal_mask(6))", causal),
        ("padding: key_mask\n(True = real token)", padding[0, 0].expand(t, t)),
        ("causal=True and key_mask\n(both at once)", both[0, 0]),
    ]

    figure = new_figure(8.2, 3.9)
    axes = figure.subplots(1, 3)
    colours = ListedColormap(["#f2f2f2", "#4c72b0"])  # False: masked, True: may attend
    labels = [f"{i} {token}" for i, token in enumerate(tokens)]
    for k, (ax, (title, allowed)) in enumerate(zip(axes, panels)):
        ax.imshow(allowed.int().numpy(), cmap=colours, vmin=0, vmax=1)
        ax.set_xticks(range(t), labels, rotation=90, fontsize=9)
        ax.set_yticks(range(t), labels, fontsize=9)
        ax.set_xticks([i - 0.5 for i in range(1, t)], minor=True)
        ax.set_yticks([i - 0.5 for i in range(1, t)], minor=True)
        ax.grid(which="minor", color="white", lw=1.5)
        ax.tick_params(which="minor", length=0)
        ax.set_xlabel("key j (attended to)", fontsize=10)
        if k == 0:  # the rows are the same in every panel: one label is enough
            ax.set_ylabel("query i (attending)", fontsize=10)
        ax.set_title(title, fontsize=10)
    figure.legend(handles=[Patch(fc="#4c72b0", label="may attend"), Patch(fc="#f2f2f2", ec="#bbbbbb",
                                                                          label="masked: weight exactly 0")],
                  loc="lower center", ncol=2, fontsize=10, frameon=False)
    figure.subplots_adjust(left=0.13, right=0.99, top=0.86, bottom=0.3, wspace=0.55)
    save(figure, path)
    return "from AttentionMask.allowed()"



def draw_document_masks(path: pathlib.Path, quick: bool = False) -> str:
    """One packed row of three documents and padding: the rule with documents, without and with the causal rule, as
    AttentionMask(documents=).allowed() builds it, checked against a block-diagonal mask built by hand."""
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    docs = [["the", "cat", "sat"], ["good", "film"], ["it", "ran", "off"]]
    tokens = [w for d in docs for w in d] + ["<pad>"]  # t = 9: the row's end is padding, a document of its own
    t = len(tokens)
    documents = torch.tensor([[d for d, doc in enumerate(docs) for _ in doc] + [len(docs)]])  # (1, t)
    real = torch.tensor([[token != "<pad>" for token in tokens]])  # (1, t)
    within = document_positions(documents)[0].tolist()  # each token's position in its document
    positions = torch.arange(t)
    panels = []
    for causal in (False, True):
        allowed = AttentionMask(positions, positions, real, causal=causal, aligned=True,
                                documents=documents).allowed()[0, 0].expand(t, t)  # (t, t)
        same = documents[0, :, None] == documents[0, None, :]  # the block diagonal, by hand
        expected = same & real[0, None, :] & (positions[None, :] <= positions[:, None] if causal else True)
        if not torch.equal(allowed, expected):
            raise AssertionError(f"AttentionMask(documents=, causal={causal}) is not the block-diagonal mask")
        panels.append(("documents (an encoder,\nCTransformer, MLMTransformer)" if not causal else
                       "documents and causal=True\n(a generator, GTransformer)", allowed))

    figure = new_figure(7.6, 4.6)
    axes = figure.subplots(1, 2)
    colours = ListedColormap(["#f2f2f2", "#4c72b0"])  # False: masked, True: may attend
    labels = [f"{token} {p}" if token != "<pad>" else token for token, p in zip(tokens, within)]
    for k, (ax, (title, allowed)) in enumerate(zip(axes, panels)):
        ax.imshow(allowed.int().numpy(), cmap=colours, vmin=0, vmax=1)
        ax.set_xticks(range(t), labels, rotation=90, fontsize=9)
        ax.set_yticks(range(t), labels, fontsize=9)
        ax.set_xticks([i - 0.5 for i in range(1, t)], minor=True)
        ax.set_yticks([i - 0.5 for i in range(1, t)], minor=True)
        ax.grid(which="minor", color="white", lw=1.5)
        ax.tick_params(which="minor", length=0)
        ax.set_xlabel("key j (token, position in its document)", fontsize=9)
        if k == 0:
            ax.set_ylabel("query i", fontsize=10)
        ax.set_title(title, fontsize=10)
    figure.legend(handles=[Patch(fc="#4c72b0", label="may attend"), Patch(fc="#f2f2f2", ec="#bbbbbb",
                                                                          label="masked: weight exactly 0")],
                  loc="lower center", ncol=2, fontsize=10, frameon=False)
    figure.subplots_adjust(left=0.14, right=0.99, top=0.88, bottom=0.27, wspace=0.35)
    save(figure, path)
    return "from AttentionMask(documents=).allowed(), checked against a block-diagonal mask"

# --- narrow and wide heads ----------------------------------------------------------------------------------------


def head_shapes(emb: int, heads: int, wide: bool, t: int) -> dict[str, tuple[int, ...]]:
    """Run the steps of a ``SelfAttention`` on a ``(1, t, emb)`` input and return the shape after each; check on the
    way that head ``i`` gets the ``i``-th consecutive piece of the projection and that merging undoes splitting."""
    torch.manual_seed(0)
    attention = SelfAttention(emb, heads=heads, wide=wide)
    x = torch.randn(1, t, emb)
    with torch.no_grad():
        q = attention.toqueries(x)  # (b, t, h * s)
        split = attention.split_heads(q)  # (b, h, t, s)
        s = attention.head_size
        for i in range(heads):  # the picture cuts the projection into consecutive pieces, one per head
            if not torch.equal(split[:, i], q[..., i * s : (i + 1) * s]):
                raise AssertionError(f"head {i} does not get piece {i} of the projection")
        merged = attention.merge_heads(split)  # (b, t, h * s)
        if not torch.equal(merged, q):
            raise AssertionError("merge_heads does not undo split_heads")
        out = attention.unifyheads(merged)  # (b, t, e)
    return dict(x=tuple(x.shape), q=tuple(q.shape), split=tuple(split.shape), merged=tuple(merged.shape),
                out=tuple(out.shape), toqueries=tuple(attention.toqueries.weight.shape),
                unifyheads=tuple(attention.unifyheads.weight.shape), s=(s,))


def draw_heads(path: pathlib.Path, quick: bool = False) -> str:
    """One position's vector through the queries' projection, the split into heads, attention, the merge and
    unifyheads; narrow heads above, wide heads below."""
    from matplotlib.patches import FancyArrowPatch, Rectangle

    emb, heads, t = 6, 3, 5  # small enough to draw every component; the shapes are those of a (1, 5, 6) input
    rows = [(False, head_shapes(emb, heads, False, t)), (True, head_shapes(emb, heads, True, t))]
    cell = 0.32
    figure = new_figure(8.4, 6.6)
    ax = figure.add_axes([0.0, 0.0, 1.0, 1.0])

    def column(x, y_top, colours, hatch=None):
        """A vector drawn as a column of cells, top down; returns its bottom y."""
        for k, colour in enumerate(colours):
            ax.add_patch(Rectangle((x, y_top - (k + 1) * cell), cell, cell, fc=colour, ec="white", lw=1,
                                   hatch=hatch))
        return y_top - len(colours) * cell

    def arrow(x0, x1, y, label):
        ax.add_patch(FancyArrowPatch((x0, y), (x1, y), arrowstyle="-|>", mutation_scale=12, lw=1.2,
                                     color="#333333", shrinkA=0, shrinkB=0))
        ax.text((x0 + x1) / 2, y + 0.12, label, ha="center", va="bottom", fontsize=9, family="monospace")

    def shape(x, y, text):
        ax.text(x, y, text, ha="center", va="top", fontsize=8.5, family="monospace", color="#333333")

    def fmt(symbols, numbers):
        return f"({symbols})\n= {numbers}"

    y_top = 11.9
    for wide, shapes in rows:
        s = shapes["s"][0]
        inner = heads * s  # e (narrow) or h * e (wide)
        mid = y_top - inner * cell / 2  # vertical centre of the tallest column of this row
        if wide:
            title = "wide heads (wide=True)"
            detail = f"every head gets its own projection of all e = {emb} dimensions: s = e = {s}, h*s = {inner}"
        else:
            title = "narrow heads (default)"
            detail = f"one projection to e = {emb} dimensions, cut into h = {heads} pieces of s = e/h = {s}"
        ax.text(0.25, y_top + 0.95, title, fontsize=11, weight="bold", va="bottom")
        ax.text(0.25, y_top + 0.5, detail, fontsize=10, va="bottom")
        label_y = y_top - inner * cell - 0.15

        # x: one position's e-vector.
        x0 = 0.6
        column(x0, mid + emb * cell / 2, ["#999999"] * emb)
        shape(x0 + cell / 2, label_y, fmt("b, t, e", shapes["x"]))
        ax.text(x0 + cell / 2, mid + emb * cell / 2 + 0.08, "x", ha="center", va="bottom", fontsize=10)

        # The projection, coloured by the head each component will go to.
        x1 = 2.9
        w_out, w_in = shapes["toqueries"]
        arrow(x0 + cell + 0.1, x1 - 0.1, mid, f"toqueries\nLinear {w_in}->{w_out}")
        colours = [HEAD_COLOURS[k // s] for k in range(inner)]
        column(x1, y_top, colours)
        shape(x1 + cell / 2, label_y, fmt("b, t, h*s", shapes["q"]))
        ax.text(x1 + cell / 2, y_top + 0.08, "q", ha="center", va="bottom", fontsize=10)

        # split_heads: the pieces become h separate vectors, side by side.
        x2 = 4.9
        arrow(x1 + cell + 0.1, x2 - 0.1, mid, "split_heads")
        for k in range(heads):
            column(x2 + k * (cell + 0.12), mid + s * cell / 2, [HEAD_COLOURS[k]] * s)
            ax.text(x2 + k * (cell + 0.12) + cell / 2, mid + s * cell / 2 + 0.05, f"{k + 1}", ha="center",
                    va="bottom", fontsize=9, color=HEAD_COLOURS[k])
        split_w = heads * (cell + 0.12)
        shape(x2 + split_w / 2, label_y, fmt("b, h, t, s", shapes["split"]))

        # attend: every head separately (its own softmax over the keys); the outputs keep the shape.
        x3 = x2 + split_w + 1.75
        arrow(x2 + split_w + 0.05, x3 - 0.1, mid, "attend\n(each head\non its own)")
        for k in range(heads):
            column(x3 + k * (cell + 0.12), mid + s * cell / 2, [HEAD_COLOURS[k]] * s, hatch="////")
        shape(x3 + split_w / 2, label_y, fmt("b, h, t, s", shapes["split"]))

        # merge_heads: concatenated again, head by head.
        x4 = x3 + split_w + 1.7
        arrow(x3 + split_w + 0.05, x4 - 0.1, mid, "merge_heads")
        column(x4, y_top, colours, hatch="////")
        shape(x4 + cell / 2, label_y, fmt("b, t, h*s", shapes["merged"]))

        # unifyheads mixes all heads' components back into e.
        x5 = x4 + 2.45
        w_out, w_in = shapes["unifyheads"]
        arrow(x4 + cell + 0.1, x5 - 0.1, mid, f"unifyheads\nLinear {w_in}->{w_out}")
        column(x5, mid + emb * cell / 2, ["#6b6b6b"] * emb)
        shape(x5 + cell / 2, label_y, fmt("b, t, e", shapes["out"]))
        ax.text(x5 + cell / 2, mid + emb * cell / 2 + 0.08, "output", ha="center", va="bottom", fontsize=10)

        y_top = label_y - 2.3
    ax.text(0.25, -0.05, "One position of one sequence. The queries are shown; keys and values are projected and split "
            "the same way\n(tokeys, tovalues). Hatched: attention outputs. Shapes for a batch of b = 1 sequence of "
            "t = 5 positions;\ne embedding size, h heads, s head size.", fontsize=9, color="#444444", va="center")
    ax.set_xlim(-0.3, 15.0)
    ax.set_ylim(-0.8, 13.5)
    ax.axis("off")
    save(figure, path)
    return "shapes from running SelfAttention"


# --- sinusoids ----------------------------------------------------------------------------------------------------


def draw_sinusoids(path: pathlib.Path, quick: bool = False) -> str:
    """The sinusoidal table (positions x dimensions) and a few of its columns as curves."""
    t, emb = 100, 64
    table = sinusoidal_table(torch.arange(t), emb)  # (t, e)
    figure = new_figure(8.2, 4.1)
    left, right = figure.subplots(1, 2, gridspec_kw=dict(width_ratios=[1.15, 1]))
    image = left.imshow(table.numpy(), cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    figure.colorbar(image, ax=left, fraction=0.05, pad=0.02)
    left.set_xlabel("dimension d (d = 2i and 2i+1 share a wavelength)", fontsize=9.5)
    left.set_ylabel("position p")
    left.set_title(f"sinusoidal_table(arange({t}), {emb})", fontsize=10, family="monospace")
    shown = 50  # enough for the slow columns to show their direction, few enough to see the fast one as a wave
    for dim, colour in zip((0, 6, 16, 30), HEAD_COLOURS):
        pair = dim // 2
        wavelength = 2 * torch.pi * 10000 ** (2 * pair / emb)
        # Dots: the table exists at integer positions only (dimension 0 turns by a whole radian per position).
        right.plot(range(shown), table[:shown, dim].numpy(), color=colour, lw=1.1, marker=".", markersize=4,
                   label=f"d = {dim}: wavelength {wavelength:.1f}")
    right.set_xlabel("position p")
    right.set_ylabel("value")
    right.set_ylim(-1.1, 1.1)
    right.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    right.set_title(f"four sine columns, positions 0 .. {shown - 1}", fontsize=10)
    figure.tight_layout()
    save(figure, path)
    return f"{t} positions x {emb} dimensions"


# --- attention of a trained model ---------------------------------------------------------------------------------

V, N = 10, 8  # digits 0..9, strings of N digits; BOS is token V on the target side
BOS = V


def reversal_batch(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``n`` random digit strings, the decoder's input (BOS, then the reversed string shifted right: teacher
    forcing) and the target (the reversed string)."""
    src = torch.randint(0, V, (n, N), generator=generator)
    tgt = src.flip(1)
    tgt_in = torch.cat([torch.full((n, 1), BOS), tgt[:, :-1]], dim=1)
    return src, tgt_in, tgt


def mirror_weight(weights: torch.Tensor) -> float:
    """Mean attention weight on the mirrored source position: output ``i`` copies source ``N - 1 - i``."""
    i = torch.arange(N)
    return weights[..., i, N - 1 - i].mean().item()


def draw_reversal_attention(path: pathlib.Path, quick: bool = False) -> str:
    """Train a one-block encoder-decoder to reverse digit strings; plot its cross-attention before and after."""
    steps = 3 if quick else 300
    threads = torch.get_num_threads()
    # One thread and fixed seeds: a rerun with the same torch build draws the same figure (more threads may add up
    # floats in another order, and the last digits would drift).
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model = Seq2SeqTransformer(64, 4, 1, N, V, V + 1)  # emb, heads, depth, seq_length, src_tokens, tgt_tokens
        cross = model.decoder.blocks[0].cross_attention  # the decoder's only way to read the source
        held_out = reversal_batch(500, torch.Generator().manual_seed(1))  # never trained on
        example = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])  # repeated digits: position, not content, decides
        example_in = torch.cat([torch.full((1, 1), BOS), example.flip(1)[:, :-1]], dim=1)

        def measure() -> tuple[torch.Tensor, float, float]:
            model.eval()
            src, tgt_in, tgt = held_out
            with torch.no_grad():
                accuracy = (model(src, tgt_in).argmax(-1) == tgt).float().mean().item()
            mirrored = mirror_weight(capture_attention(model, cross, src, tgt_in).mean(1))  # mean over heads
            shown = capture_attention(model, cross, example, example_in)[0].mean(0)  # (t, u), mean over heads
            model.train()
            return shown, mirrored, accuracy

        before = measure()
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        generator = torch.Generator().manual_seed(0)
        start = time.perf_counter()
        for _ in range(steps):
            src, tgt_in, tgt = reversal_batch(64, generator)
            loss = F.nll_loss(model(src, tgt_in).reshape(-1, V + 1), tgt.reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        seconds = time.perf_counter() - start
        after = measure()
    finally:
        torch.set_num_threads(threads)

    figure = new_figure(8.2, 4.5)
    axes = figure.subplots(1, 2)
    source = [str(d) for d in example[0].tolist()]
    written = [str(d) for d in example.flip(1)[0].tolist()]
    for ax, (shown, mirrored, accuracy), title in zip(axes, (before, after),
                                                     ("before training", f"after {steps} training steps")):
        image = ax.imshow(shown.numpy(), cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
        ax.set_xticks(range(N), [f"{d}\n{j}" for j, d in enumerate(source)], fontsize=9)
        ax.set_yticks(range(N), [f"{i}: writes {d}" for i, d in enumerate(written)], fontsize=9)
        ax.set_xlabel("key: source digit, position", fontsize=9.5)
        ax.set_ylabel("query: output position", fontsize=9.5)
        ax.set_title(f"{title}\n500 held-out strings: mean weight {mirrored:.2f} on the\n"
                     f"mirrored position, {accuracy:.1%} of digits right", fontsize=9.5)
    figure.subplots_adjust(left=0.12, right=0.87, top=0.77, bottom=0.15, wspace=0.55)
    box = axes[1].get_position()  # the colour bar as tall as the heat map beside it
    colourbar = figure.add_axes([box.x1 + 0.025, box.y0, 0.018, box.height])
    figure.colorbar(image, cax=colourbar, label="weight (mean of the 4 heads)")
    figure.suptitle(f"cross-attention of a 1-block Seq2SeqTransformer reversing {''.join(source)} -> "
                    f"{''.join(written)}", fontsize=10.5, y=0.97)
    save(figure, path)
    return (f"{steps} steps in {seconds:.1f} s on one thread; mean weight on the mirrored source position "
            f"{before[1]:.3f} -> {after[1]:.3f}, digits right {before[2]:.1%} -> {after[2]:.1%} "
            f"(500 held-out strings, teacher forcing)")


FIGURES: dict[str, Callable[[pathlib.Path, bool], str]] = {
    "norm-placement": draw_norm_placement,
    "masks": draw_masks,
    "document-masks": draw_document_masks,
    "attention": draw_attention,
    "heads": draw_heads,
    "sinusoids": draw_sinusoids,
    "reversal-attention": draw_reversal_attention,
    "model-decoder-only": draw_model_decoder_only,
    "model-encoder-decoder": draw_model_encoder_decoder,
    "sampling": draw_sampling,
    "beam-search": draw_beam_search,
    "pooling": draw_pooling,
    "tokens": draw_tokens,
    "going-big-memory": draw_going_big_memory,
    "long-context": draw_long_context,
    "expert-routing": draw_expert_routing,
    "cache-per-token": draw_cache_per_token,
    "architecture": draw_architecture,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", choices=sorted(FIGURES), metavar="NAME",
                        help=f"draw only this figure (repeatable): {', '.join(FIGURES)}")
    parser.add_argument("--out", type=pathlib.Path, default=IMAGES, help="folder for the PNGs (default docs/images)")
    parser.add_argument("--quick", action="store_true", help="train for a few steps only: a test of the script, "
                        "not a figure for the docs")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.only or FIGURES:
        path = args.out / f"{name}.png"
        note = FIGURES[name](path, args.quick)
        print(f"{path} ({path.stat().st_size // 1024} KB): {note}")


if __name__ == "__main__":
    main()
