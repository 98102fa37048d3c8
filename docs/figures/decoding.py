"""Figures of decoding, of the classifier's pooling, of tokens and of memory, drawn by ``docs/make_figures.py``.

* ``sampling``: one next-byte distribution of a tiny model trained here, and what temperature, top-k and top-p make
  of it; the probabilities are the ones ``sample_next`` itself hands to ``torch.multinomial``.
* ``beam-search``: the tree a beam search explores on that model, re-computed step by step (``beam_search`` keeps
  its beams to itself) and checked against ``beam_search``'s answer.
* ``pooling``: ``ClassifierHead.pooled`` on a small padded batch, with and without the mask.
* ``tokens``: a sentence as bytes (``ByteTokenizer``), as words (``WordTokenizer``) and as rows of a
  ``TokenEmbedding``.
* ``going-big-memory``: the activation-checkpointing measurements of ``docs/going-big.md``, read from the page's
  table, and the bytes per parameter of training with AdamW, measured on a real model.

Each ``draw_*`` function takes the PNG's path and ``quick`` (train for a few steps only) and returns a note for
the script's log. Shapes: b batch size, t sequence length, e embedding size, v vocabulary size.
"""

from __future__ import annotations

import functools
import pathlib
import re
import time
from dataclasses import dataclass
from unittest import mock

import torch
import torch.nn.functional as F
from torch import Tensor

from torchformer import CTransformer, GTransformer, TokenEmbedding
from torchformer.data import ByteTokenizer, WordTokenizer, enwik8_sample
from torchformer.data.enwik8_dataset import random_batches
from torchformer.decoding.generation import beam_search
from torchformer.decoding.sampling import sample_next
from torchformer.nn.heads import ClassifierHead

from figures.canvas import new_figure, save

DOCS = pathlib.Path(__file__).resolve().parents[1]
# The same canvas and PNG settings as make_figures.py. (Importing them from there would run the script a second
# time, under another module name, when it is started as `python docs/make_figures.py`.)
BLUE, ORANGE, GREEN, RED, GREY = "#4c72b0", "#dd8452", "#55a868", "#c44e52", "#999999"


def shown_byte(token: int) -> str:
    """A byte as visible text: a space would be invisible on a tick or in a node, and a control character or half
    of a UTF-8 sequence has no glyph (an untrained model, as with --quick, proposes them)."""
    if token == 32:
        return "\u2423"
    return chr(token) if 32 < token < 127 else f"\\x{token:02x}"


def minus(value: float, digits: int = 2) -> str:
    """A number with a real minus sign (U+2212), as typeset text has it."""
    return f"{value:.{digits}f}".replace("-", "\u2212")


# --- a tiny byte-level model of the enwik8 sample -------------------------------------------------------------------

CONTEXT = 64


@functools.lru_cache(maxsize=2)
def tiny_enwik8_model(steps: int) -> tuple[GTransformer, float]:
    """A 2-block GTransformer trained ``steps`` steps on the bundled enwik8 sample; returns it (in eval mode) and
    the seconds training took. Cached: the sampling and beam-search figures share one model."""
    threads = torch.get_num_threads()
    # One thread and fixed seeds: a rerun with the same torch build draws the same figures.
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        model = GTransformer(emb=64, heads=4, depth=2, seq_length=CONTEXT, num_tokens=256, prenorm=True)
        train, _, _ = enwik8_sample()
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        generator = torch.Generator().manual_seed(0)
        start = time.perf_counter()
        for _ in range(steps):
            x, y = random_batches(train, context=CONTEXT, batch_size=32, generator=generator)  # (b, t) each
            loss = F.nll_loss(model(x).transpose(1, 2), y)  # (b, v, t) against (b, t)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        seconds = time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)
    return model.eval(), seconds


def training_steps(quick: bool) -> int:
    return 3 if quick else 300


# --- sampling -------------------------------------------------------------------------------------------------------

SAMPLING_PROMPT = " the c"  # the next byte is uncertain, but not uniformly so: one byte leads
SAMPLING_PANELS = [
    ("temperature=1: the model's own", dict(temperature=1.0)),
    ("temperature=0.5: sharper", dict(temperature=0.5)),
    ("temperature=2: flatter", dict(temperature=2.0)),
    ("top_k=5", dict(top_k=5)),
    ("top_p=0.9: the nucleus", dict(top_p=0.9)),
]
BARS = 12  # the model's most likely bytes get a bar each; the other 244 share one


def sampled_from(logp: Tensor, **options) -> Tensor:
    """The probabilities ``(v,)`` that ``sample_next`` draws from, for one row of log-probabilities ``(v,)``.

    ``sample_next`` filters inside and hands the result to ``torch.multinomial``; we watch that call instead of
    re-implementing the filters, so the figure shows the library's own arithmetic.
    """
    with mock.patch.object(torch, "multinomial", wraps=torch.multinomial) as draw:
        sample_next(logp[None], generator=torch.Generator().manual_seed(0), **options)  # (1, v) -> (1,)
    if draw.call_count != 1:
        raise AssertionError("sample_next no longer draws with one torch.multinomial call: the sampling figure "
                             "cannot read its probabilities")
    return draw.call_args.args[0][0]  # (v,)


def check_filtered(model_probs: Tensor, probs: Tensor, options: dict) -> None:
    """Raise if a filtered distribution ``(v,)`` is not what the docs say top-k and top-p keep."""
    kept = probs > 0
    if "top_k" in options and int(kept.sum()) != options["top_k"]:
        raise AssertionError(f"top_k={options['top_k']} kept {int(kept.sum())} tokens")
    if "top_p" in options:
        mass = model_probs[kept].sum()
        smallest_kept = model_probs[kept].min()
        if mass < options["top_p"] - 1e-6 or mass - smallest_kept >= options["top_p"]:
            raise AssertionError(f"top_p={options['top_p']} did not keep the smallest set reaching it")


def draw_sampling(path: pathlib.Path, quick: bool = False) -> str:
    """The next-byte distribution after SAMPLING_PROMPT, and the distributions sample_next draws from."""
    model, seconds = tiny_enwik8_model(training_steps(quick))
    prompt = torch.tensor([list(SAMPLING_PROMPT.encode())])  # (1, t)
    with torch.no_grad():
        logp = model(prompt)[0, -1]  # (v,): log-probabilities of the byte after the prompt
    own = logp.exp()
    order = own.argsort(descending=True)[:BARS]  # the bars, most likely first, in every panel
    rest = torch.ones_like(own, dtype=torch.bool)
    rest[order] = False

    figure = new_figure(8.4, 5.6)
    axes = figure.subplots(2, 3, sharey=True).flatten()
    labels = [shown_byte(int(token)) for token in order] + [f"{int(rest.sum())}\nothers"]
    for ax, (title, options) in zip(axes, SAMPLING_PANELS):
        probs = sampled_from(logp, **options)
        check_filtered(own, probs, options)
        heights = probs[order].tolist() + [probs[rest].sum().item()]
        baseline = own[order].tolist() + [own[rest].sum().item()]
        xs = list(range(BARS)) + [BARS + 0.7]  # a gap before the bar of the other bytes
        ax.bar(xs, baseline, width=0.8, fill=False, edgecolor=GREY, lw=0.8, ls=(0, (2, 1.5)))
        ax.bar(xs, heights, width=0.55, color=[BLUE] * BARS + [ORANGE])
        ax.set_xticks(xs, labels, fontsize=9)
        ax.tick_params(axis="x", length=0)
        ax.get_xticklabels()[-1].set_fontsize(7.5)
        kept = int((probs > 0).sum())
        ax.set_title(f"{title}\n{kept} of {len(probs)} bytes can be drawn", fontsize=9.5)
        ax.set_ylim(0, 1)
        ax.spines[["top", "right"]].set_visible(False)
    for ax in axes[::3]:
        ax.set_ylabel("probability")
    legend = axes[-1]
    legend.axis("off")
    legend.text(0.0, 0.95, f"The byte after \"{SAMPLING_PROMPT.replace(' ', chr(0x2423))}\",\nfrom a 2-block "
                f"GTransformer\ntrained {training_steps(quick)} steps on the\nenwik8 sample.\n\n"
                "Bars: what sample_next draws\nfrom with that option.\n"
                "Dashed: the model's own\ndistribution (temperature=1).\n"
                f"Orange: the other bytes,\nadded up.\n\n\u2423 is a space.",
                transform=legend.transAxes, va="top", fontsize=9.5, color="#333333")
    figure.subplots_adjust(left=0.08, right=0.99, top=0.9, bottom=0.09, hspace=0.55, wspace=0.12)
    save(figure, path)
    return f"model trained {training_steps(quick)} steps in {seconds:.1f} s on one thread"


# --- beam search ----------------------------------------------------------------------------------------------------

BEAM_PROMPT = "The "
BEAM_SIZE, BEAM_STEPS, SHOWN = 2, 4, 3  # SHOWN >= BEAM_SIZE: every survivor is among its parent's shown children


@dataclass
class Candidate:
    """One extension considered by the beam search: ``parent`` indexes the previous level (-1: the prompt)."""

    tokens: tuple[int, ...]  # the generated bytes, prompt excluded
    total: float  # sum of their log-probabilities
    parent: int
    kept: bool = False


def beam_tree(model: GTransformer, prompt: list[int]) -> list[list[Candidate]]:
    """Beam search, one level per step, keeping what ``beam_search`` throws away: every hypothesis's SHOWN best
    extensions, the survivors marked ``kept``."""
    beams = [Candidate((), 0.0, -1, kept=True)]  # one start: k copies of the prompt would give k equal beams
    levels: list[list[Candidate]] = [beams]
    for _ in range(BEAM_STEPS):
        batch = torch.tensor([prompt + list(beam.tokens) for beam in beams])  # (k, t + step)
        with torch.no_grad():
            logp = model(batch)[:, -1]  # (k, v): the next byte of every hypothesis
        totals = torch.tensor([beam.total for beam in beams])[:, None] + logp  # (k, v)
        best = totals.flatten().topk(BEAM_SIZE).indices  # the survivors among all k * v extensions
        survivors = {(int(i) // totals.size(1), int(i) % totals.size(1)) for i in best}
        parents = [i for i, beam in enumerate(levels[-1]) if beam.kept]  # beams[j] is levels[-1][parents[j]]
        level = []
        for j, row in enumerate(totals):
            for token in row.topk(SHOWN).indices.tolist():
                level.append(Candidate(beams[j].tokens + (token,), row[token].item(), parents[j],
                                       kept=(j, token) in survivors))
        levels.append(level)
        beams = sorted((c for c in level if c.kept), key=lambda c: -c.total)
    return levels


def check_against_beam_search(model: GTransformer, prompt: list[int], levels: list[list[Candidate]]) -> Candidate:
    """The best final hypothesis of the tree; raise unless ``beam_search`` returns the same sequence and score."""
    best = max((c for c in levels[-1] if c.kept), key=lambda c: c.total)
    # length_penalty=0: the score is the plain total; no eos, so every hypothesis has the same length anyway.
    tokens, score = beam_search(model, torch.tensor([prompt]), BEAM_STEPS, beam_size=BEAM_SIZE, length_penalty=0.0,
                                use_cache=False)
    if tokens[0, len(prompt):].tolist() != list(best.tokens) or abs(score.item() - best.total) > 1e-4:
        raise AssertionError(f"the figure's beam search found {best.tokens} ({best.total:.4f}), beam_search "
                             f"{tokens[0, len(prompt):].tolist()} ({score.item():.4f})")
    return best


def tree_layout(levels: list[list[Candidate]]) -> list[list[float]]:
    """A y for every candidate: each level spread evenly, children in the order of their parents (no crossings)."""
    ys: list[list[float]] = [[0.0]]
    for level in levels[1:]:
        order = sorted(range(len(level)), key=lambda i: (-ys[-1][level[i].parent], -level[i].total))
        spread = [(len(level) - 1) / 2 - rank for rank in range(len(level))]
        y = [0.0] * len(level)
        for rank, i in enumerate(order):
            y[i] = spread[rank]
        ys.append(y)
    return ys


def on_best_path(levels: list[list[Candidate]], best: Candidate) -> set[tuple[int, int]]:
    """(level, index) of the candidates from the prompt to ``best``."""
    path, index = set(), levels[-1].index(best)
    for depth in range(len(levels) - 1, 0, -1):
        path.add((depth, index))
        index = levels[depth][index].parent
    return path


def draw_beam_search(path: pathlib.Path, quick: bool = False) -> str:
    """The tree of a beam search of width BEAM_SIZE on the tiny enwik8 model, with cumulative log-probabilities."""
    model, _ = tiny_enwik8_model(training_steps(quick))
    prompt = list(BEAM_PROMPT.encode())
    levels = beam_tree(model, prompt)
    best = check_against_beam_search(model, prompt, levels)
    ys = tree_layout(levels)
    best_path = on_best_path(levels, best)

    figure = new_figure(8.4, 4.6)
    ax = figure.subplots()
    prompt_box = dict(boxstyle="round,pad=0.3", fc="#eeeeee", ec="#555555")
    boxes = {(0, 0): ax.text(0, 0, f"\"{BEAM_PROMPT.replace(' ', chr(0x2423))}\"\n(prompt)", ha="center",
                             va="center", fontsize=9.5, bbox=prompt_box)}
    for depth, level in enumerate(levels[1:], start=1):
        for i, candidate in enumerate(level):
            winner = (depth, i) in best_path
            colour = RED if winner else BLUE if candidate.kept else GREY
            text = "".join(shown_byte(token) for token in candidate.tokens)
            boxes[depth, i] = ax.text(depth, ys[depth][i], f"{text}  {minus(candidate.total)}", ha="center",
                                      va="center", fontsize=8.5, family="monospace",
                                      color="black" if candidate.kept else "#777777",
                                      bbox=dict(boxstyle="round,pad=0.25", lw=1.5 if winner else 0.8, ec=colour,
                                                fc="#fde0dc" if winner else "#dce6f5" if candidate.kept else "white"))
            # From the right edge of the parent's text to the left edge of this one's, 3 points shorter at both
            # ends so that the line stops at the box drawn around the text.
            ax.annotate("", xy=(0, 0.5), xycoords=boxes[depth, i], xytext=(1, 0.5),
                        textcoords=boxes[depth - 1, candidate.parent],
                        arrowprops=dict(arrowstyle="-", color=colour, lw=2 if winner else 1, shrinkA=3, shrinkB=3,
                                        ls="-" if candidate.kept else (0, (2, 2))))
        ax.text(depth, -max(ys[-1]) - 0.9, f"step {depth}", ha="center", fontsize=9, color="#555555")
    ax.plot([], [], color=BLUE, label=f"kept: the {BEAM_SIZE} best totals of the step")
    others = model.config.num_tokens - SHOWN
    ax.plot([], [], color=GREY, ls=(0, (2, 2)), label=f"pruned, as are the other {others} bytes after each hypothesis")
    ax.plot([], [], color=RED, lw=2, label="beam_search's answer")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2, fontsize=8.5, frameon=False)
    ax.set_xlim(-0.45, BEAM_STEPS + 0.45)
    ax.set_ylim(-max(ys[-1]) - 1.1, max(ys[-1]) + 0.6)
    ax.axis("off")
    ax.set_title(f"beam search, beam_size={BEAM_SIZE}: each box is the generated text and its total "
                 f"log-probability;\n{SHOWN} best extensions drawn per hypothesis", fontsize=10)
    figure.subplots_adjust(left=0.01, right=0.99, top=0.88, bottom=0.13)
    save(figure, path)
    return (f"beam_search agrees: {bytes(best.tokens)!r}, total log-probability {best.total:.3f} "
            f"(beam {BEAM_SIZE}, {BEAM_STEPS} steps)")


# --- pooling --------------------------------------------------------------------------------------------------------

PAD_VALUE = 9.0  # larger than every real value below: a max that looked at padding would return it


def pooling_batch() -> tuple[Tensor, Tensor]:
    """A padded batch as the encoder would hand it to the head: ``x`` ``(b, t, e) = (2, 5, 4)`` of small integers
    (readable sums), and ``mask`` ``(b, t)``: 5 real positions, then 3 real and 2 of padding."""
    generator = torch.Generator().manual_seed(3)
    x = torch.randint(-5, 6, (2, 5, 4), generator=generator).float()
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    return x.masked_fill(~mask[..., None], PAD_VALUE), mask


def pooled_rows(x: Tensor, mask: Tensor) -> list[tuple[str, Tensor]]:
    """``(label, (b, e))`` for each pooling of a real CTransformer's head, and max pooling without the mask."""
    rows = []
    for pool in ("max", "mean", "first"):
        model = CTransformer(emb=4, heads=2, depth=1, seq_length=5, num_tokens=10, num_classes=2, pool=pool)
        if not isinstance(model.head, ClassifierHead) or model.head.pool != pool:
            raise AssertionError(f"CTransformer(pool={pool!r}) no longer pools with ClassifierHead(pool={pool!r})")
        rows.append((f'pool="{pool}"', model.head.pooled(x, mask)))
        if pool == "max":
            unmasked = model.head.pooled(x)  # what the mask prevents
    rows.append(("max, no mask", unmasked))
    return rows


def number(value: float) -> str:
    return minus(value, 2).rstrip("0").rstrip(".")


CELL_WIDTH = 1.35  # room for "\u22120.67"


def pooling_cell(ax, row: float, col: int, value: float, face: str, text_colour: str = "black",
                 hatch: str = "") -> None:
    """One number of the pooling figure, in row ``row`` (counted downwards) and column ``col``."""
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((col * CELL_WIDTH, -row - 1), CELL_WIDTH, 1, fc=face, ec="white", lw=2, hatch=hatch))
    ax.text((col + 0.5) * CELL_WIDTH, -row - 0.5, number(value), ha="center", va="center", fontsize=9.5,
            color=text_colour)


def draw_pooling(path: pathlib.Path, quick: bool = False) -> str:
    """Each sequence's (t, e) vectors, and the (e,) vector each pooling makes of them."""
    x, mask = pooling_batch()
    rows = pooled_rows(x, mask)
    b, t, e = x.shape
    colours = [BLUE, GREEN, ORANGE, RED]
    figure = new_figure(7.4, 5.0)
    axes = figure.subplots(1, b)
    for s, ax in enumerate(axes):
        for p in range(t):
            real = bool(mask[s, p])
            for d in range(e):
                pooling_cell(ax, p, d, x[s, p, d].item(), "#e8eef8" if real else "#eeeeee",
                             "black" if real else "#999999", "" if real else "///")
            ax.text(-0.15, -p - 0.5, f"position {p}" if real else f"position {p}: padding", ha="right",
                    va="center", fontsize=9, color="black" if real else "#999999")
        for k, ((label, pooled), colour) in enumerate(zip(rows, colours)):
            row = t + 0.6 + k
            for d in range(e):
                pooling_cell(ax, row, d, pooled[s, d].item(), colour + "33",
                             colour if label.startswith("max,") else "black")
            ax.text(-0.15, -row - 0.5, label, ha="right", va="center", fontsize=9, color=colour)
        ax.plot([0, e * CELL_WIDTH], [-t - 0.3] * 2, color="#555555", lw=1)
        ax.set_title(f"sequence {s}: {int(mask[s].sum())} real positions\nmask = "
                     f"{[int(m) for m in mask[s].tolist()]}", fontsize=9.5)
        ax.set_xlim(-3.0, e * CELL_WIDTH + 0.1)
        ax.set_ylim(-t - 0.6 - len(rows) - 0.1, 0.1)
        ax.set_aspect("equal")
        ax.axis("off")
    figure.text(0.5, 0.02, f"Above the line: the encoder's vectors x (b, t, e) = {tuple(x.shape)}, padding filled "
                f"with {PAD_VALUE:g}, larger than every real value.\nBelow: ClassifierHead.pooled(x, mask) (b, e) of "
                "CTransformer's head, one row per pool; the last row leaves the mask out.",
                ha="center", va="bottom", fontsize=8.5, color="#444444")
    figure.subplots_adjust(left=0.0, right=0.99, top=0.9, bottom=0.1, wspace=0.05)
    save(figure, path)
    return "pooled by ClassifierHead.pooled (max, mean, first; max without the mask)"


# --- tokens ---------------------------------------------------------------------------------------------------------

SENTENCE = "The cat sat on the mat."
EMB = 8


def word_tokenizer() -> WordTokenizer:
    """The word vocabulary of docs/tokens.md: the 10,000 most frequent words of the first 90 % of the sample."""
    train, _, _ = enwik8_sample(splits=(90, 10, 0))
    return WordTokenizer.build([bytes(train.tolist()).decode("utf-8", errors="replace")], vocab_size=10_000)


def boxes(ax, y: float, tops: list[str], bottoms: list[str], widths: list[float], colour: str) -> list[float]:
    """A row of boxes, ``tops`` inside and ``bottoms`` (the ids) under them; returns the boxes' centres."""
    from matplotlib.patches import FancyBboxPatch

    centres = []
    x = 0.0
    for top, bottom, w in zip(tops, bottoms, widths):
        ax.add_patch(FancyBboxPatch((x + 0.03, y - 0.2), w - 0.06, 0.4, boxstyle="round,pad=0,rounding_size=0.06",
                                    fc=colour, ec="#555555", lw=0.8))
        ax.text(x + w / 2, y, top, ha="center", va="center", fontsize=9)
        ax.text(x + w / 2, y - 0.36, bottom, ha="center", va="center", fontsize=8, color="#333333")
        centres.append(x + w / 2)
        x += w
    return centres


def draw_tokens(path: pathlib.Path, quick: bool = False) -> str:
    """SENTENCE as bytes and as words, then the word ids' rows of a TokenEmbedding."""
    bytes_ids = ByteTokenizer().encode(SENTENCE)  # byte + 1: id 0 is padding
    words = word_tokenizer()
    pieces, ids = words.tokenize(SENTENCE), words.encode(SENTENCE)
    torch.manual_seed(0)
    embedding = TokenEmbedding(len(words), EMB, max_len=len(ids), positions="none")  # tokens alone, no positions
    W = embedding.tokens.weight.detach()  # (v, e)
    with torch.no_grad():
        looked_up = embedding(torch.tensor([ids]))[0]  # (t, e)
    if not torch.equal(looked_up, W[ids]):
        raise AssertionError("TokenEmbedding no longer returns the rows of its weight")

    figure = new_figure(8.4, 5.9)
    ax = figure.add_axes([0, 0, 1, 1])
    ax.set_xlim(-0.2, 11.6)
    ax.set_ylim(-8.4, 1.0)
    ax.axis("off")
    ax.text(0, 0.55, f"the text:  \"{SENTENCE}\"", fontsize=11, va="center")
    ax.text(0, -0.05, f"ByteTokenizer: {len(bytes_ids)} bytes, id = byte + 1 (0 is padding), "
            f"vocabulary {len(ByteTokenizer())}", fontsize=9.5, va="center", color="#444444")
    boxes(ax, -0.55, [shown_byte(ord(c)) for c in SENTENCE], [str(i) for i in bytes_ids],
          [11.2 / len(bytes_ids)] * len(bytes_ids), "#dce6f5")
    ax.text(0, -1.35, f"WordTokenizer, built on the enwik8 sample as on this page: {len(ids)} words, vocabulary "
            f"{len(words):,}", fontsize=9.5, va="center", color="#444444")
    names = [piece if i != words.UNK else f"{piece} \u2192 <unk>" for piece, i in zip(pieces, ids)]
    boxes(ax, -1.85, names, [str(i) for i in ids], [0.5 + 0.14 * len(name) for name in names], "#d9ead3")
    draw_lookup(ax, W, ids, pieces, words)
    save(figure, path)
    return f"{len(bytes_ids)} bytes, {len(ids)} words, rows of a ({len(words)}, {EMB}) TokenEmbedding"


def draw_lookup(ax, W: Tensor, ids: list[int], pieces: list[str], words: WordTokenizer) -> None:
    """The rows of W that the ids select (the rest elided), and the (t, e) output they are copied into."""
    from matplotlib import colormaps
    from matplotlib.colors import Normalize

    colour = colormaps["RdBu_r"]
    scale = Normalize(-2.5, 2.5)
    cell, top = 0.32, -3.4
    rows = sorted(set(ids))
    ax.text(0, top + 0.55, f"W = TokenEmbedding.tokens.weight, (v, e) = ({W.size(0):,}, {W.size(1)}):\nthe rows "
            f"the ids select (the others left out)", fontsize=9.5, va="center", color="#444444")
    row_y, y = {}, top
    for previous, row in zip([-1] + rows, rows):
        if row - previous > 1:  # rows skipped
            ax.text(cell * EMB / 2 + 0.9, y - 0.2, f"\u22ee  {skipped(previous + 1, row - 1)}", ha="center",
                    va="center", fontsize=8, color="#888888")
            y -= 0.42
        strip(ax, 0.9, y, W[row], cell, colour, scale)
        name = "<unk>" if row == words.UNK else f"\"{words.decode([row])}\""
        ax.text(0.8, y - cell / 2, f"{row} {name}", ha="right", va="center", fontsize=8.5)
        row_y[row] = y - cell / 2
        y -= cell + 0.12
    if rows[-1] < W.size(0) - 1:
        ax.text(cell * EMB / 2 + 0.9, y - 0.2, f"\u22ee  {skipped(rows[-1] + 1, W.size(0) - 1)}", ha="center",
                va="center", fontsize=8, color="#888888")
    out_x, out_top = 6.6, top
    ax.text(out_x, top + 0.55, f"embedding(ids), (b, t, e) = (1, {len(ids)}, {W.size(1)}):\none row of W per "
            f"position", fontsize=9.5, va="center", color="#444444")
    for k, (i, piece) in enumerate(zip(ids, pieces)):
        y = out_top - k * (cell + 0.12)
        strip(ax, out_x, y, W[i], cell, colour, scale)
        ax.text(out_x + cell * EMB + 0.1, y - cell / 2, f"position {k}: \"{piece}\" (row {i})", va="center",
                fontsize=8.5)
        ax.annotate("", (out_x - 0.05, y - cell / 2), (0.9 + cell * EMB + 0.05, row_y[i]),
                    arrowprops=dict(arrowstyle="-|>", color="#777777", lw=0.8, shrinkA=0, shrinkB=0))
    ax.text(out_x, out_top - len(ids) * (cell + 0.12) - 0.25, "the same id, the same row:\n" + repeats(ids, pieces),
            fontsize=8.5, va="top", color="#444444")


def skipped(first: int, last: int) -> str:
    return f"row {first}" if first == last else f"rows {first}\u2013{last}"


def repeats(ids: list[int], pieces: list[str]) -> str:
    """One line per id that occurs more than once: its words and their positions."""
    lines = []
    for i in sorted(set(ids), key=ids.index):
        at = [k for k, j in enumerate(ids) if j == i]
        if len(at) > 1:
            said = " and ".join(dict.fromkeys(f'"{pieces[k]}"' for k in at))
            lines.append(f"{said} at positions {' and '.join(map(str, at))}: row {i}")
    return "\n".join(lines)


def strip(ax, x: float, y: float, values: Tensor, cell: float, colour, scale) -> None:
    """One embedding row ``(e,)`` as a strip of coloured cells (red positive, blue negative)."""
    from matplotlib.patches import Rectangle

    for d, value in enumerate(values.tolist()):
        ax.add_patch(Rectangle((x + d * cell, y - cell), cell, cell, fc=colour(scale(value)), ec="white", lw=0.8))


# --- memory: what each technique of docs/going-big.md saves ---------------------------------------------------------

GOING_BIG = DOCS / "going-big.md"
CHECKPOINTING_TABLE = "| batch | checkpoint_blocks | ms/step | peak memory (MB) |"
BENCHMARK_MODEL = dict(emb=256, heads=8, depth=12, seq_length=1024, num_tokens=256, prenorm=True)  # step.py's
FSDP_PROCESSES = (2, 4, 8)


def published_table(page: pathlib.Path, header: str) -> list[list[str]]:
    """The cells of the Markdown table of ``page`` whose header line starts with ``header``."""
    lines = page.read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(header)]
    if len(starts) != 1:
        raise AssertionError(f"{page.name} has {len(starts)} tables headed {header!r}: the memory figure reads one")
    rows = []
    for line in lines[starts[0] + 2:]:  # + 2: the header and the |---| line
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def published_number(page: pathlib.Path, pattern: str) -> float:
    """The number the regular expression ``pattern`` (one group) finds on ``page``."""
    found = re.search(pattern, page.read_text())
    if found is None:
        raise AssertionError(f"{page.name} no longer says {pattern!r}: the memory figure needs it")
    return float(found.group(1))


def checkpointing_peaks() -> dict[int, dict[str, int]]:
    """{batch: {"off": MB, "on": MB}}: the peak resident memory going-big.md publishes."""
    peaks: dict[int, dict[str, int]] = {}
    for batch, setting, _, peak, *_ in published_table(GOING_BIG, CHECKPOINTING_TABLE):
        peaks.setdefault(int(batch), {})[setting] = int(peak.replace(",", ""))
    return peaks


def bytes_per_parameter(bf16_autocast: bool) -> dict[str, float]:
    """Bytes per parameter that training with AdamW keeps, measured on a small GTransformer after one step.

    Under bf16 autocast only the computation runs in bfloat16: the weights, their gradients and AdamW's moments
    stay float32, which the measurement shows.
    """
    torch.manual_seed(0)
    model = GTransformer(32, 4, 1, 8, 50)
    optimizer = torch.optim.AdamW(model.parameters())
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16_autocast):
        loss = model(torch.randint(0, 50, (2, 8))).sum()
    loss.backward()
    optimizer.step()
    params = list(model.parameters())
    count = sum(p.numel() for p in params)

    def size(tensors) -> float:
        return sum(t.numel() * t.element_size() for t in tensors) / count

    moments = [optimizer.state[p][name] for p in params for name in ("exp_avg", "exp_avg_sq")]
    return {"weights": size(params), "gradients": size(p.grad for p in params), "AdamW's two moments": size(moments)}


def benchmark_parameters() -> int:
    """Parameters of benchmarks/step.py's model in the page's measurement, counted on the meta device (no memory)."""
    with torch.device("meta"):
        model = GTransformer(**BENCHMARK_MODEL)
    return sum(p.numel() for p in model.parameters())


def draw_going_big_memory(path: pathlib.Path, quick: bool = False) -> str:
    """Left: bytes per parameter kept for training, per technique. Right: activation checkpointing's measured peaks."""
    fp32, bf16 = bytes_per_parameter(False), bytes_per_parameter(True)
    if fp32 != bf16:
        raise AssertionError(f"bf16 autocast changed the stored bytes per parameter: {fp32} -> {bf16}")
    figure = new_figure(8.4, 4.0)
    left, right = figure.subplots(1, 2, gridspec_kw=dict(width_ratios=[1.05, 1]))
    draw_bytes_per_parameter(left, fp32)
    total = sum(fp32.values())
    draw_checkpointing(right, total)
    figure.subplots_adjust(left=0.08, right=0.99, top=0.88, bottom=0.13, wspace=0.3)
    save(figure, path)
    return f"{total:g} bytes per parameter (fp32 and bf16 autocast); peaks read from {GOING_BIG.name}"


def draw_bytes_per_parameter(ax, parts: dict[str, float]) -> None:
    """Stacked bars: one process (DDP's every copy, or bf16 autocast), and FSDP2's share on N processes."""
    labels = ["1 process\nor DDP", "+ bf16\nautocast"] + [f"FSDP2\nN = {n}" for n in FSDP_PROCESSES]
    shares = [1.0, 1.0] + [1 / n for n in FSDP_PROCESSES]  # FSDP2 shards all three over the N processes
    bottom = [0.0] * len(labels)
    for (name, size), colour in zip(parts.items(), [BLUE, ORANGE, GREEN]):
        heights = [size * share for share in shares]
        ax.bar(range(len(labels)), heights, bottom=bottom, color=colour, width=0.6, label=f"{name} ({size:g} B)")
        bottom = [b + h for b, h in zip(bottom, heights)]
    for k, height in enumerate(bottom):
        ax.text(k, height + 0.3, f"{height:g}", ha="center", fontsize=9)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel("bytes per parameter, per process")
    ax.set_ylim(0, max(bottom) * 1.25)
    ax.legend(fontsize=8.5, frameon=False, loc="upper right")
    ax.set_title("weights, gradients and AdamW state\n(measured on a GTransformer, float32)", fontsize=9.5)
    ax.spines[["top", "right"]].set_visible(False)


def draw_checkpointing(ax, bytes_each: float) -> None:
    """Grouped bars of the published peak memory, with what every run holds besides activations drawn as a line."""
    peaks = checkpointing_peaks()
    runtime = published_number(GOING_BIG, r"runtime\s+\(about\s+([\d.]+)\s+GB\)") * 1000  # MB
    parameters = benchmark_parameters()
    state = bytes_each * parameters / 1e6  # MB of weights, gradients and AdamW state
    for k, (batch, runs) in enumerate(sorted(peaks.items())):
        for offset, (setting, colour) in zip((-0.2, 0.2), (("off", GREY), ("on", BLUE))):
            ax.bar(k + offset, runs[setting], width=0.38, color=colour,
                   label=f"checkpoint_blocks {setting}" if k == 0 else None)
            ax.text(k + offset, runs[setting] + 30, f"{runs[setting]:,}", ha="center", fontsize=8.5)
        saved = runs["off"] - runs["on"]
        ax.text(k + 0.22, runs["on"] + 230, f"\u2212{saved:,} MB\n({saved / runs['off']:.0%})", ha="center",
                va="bottom", fontsize=8.5, color=BLUE)
    ax.axhline(runtime + state, color=RED, lw=1, ls="--",
               label=f"not activations: runtime (about {runtime / 1000:g} GB)\n+ weights, gradients, AdamW\n"
                     f"({parameters / 1e6:.1f} M parameters \u00d7 {bytes_each:g} B = {state:.0f} MB)")
    ax.set_xticks(range(len(peaks)), [f"batch {batch}" for batch in sorted(peaks)])
    ax.set_xlim(-0.55, len(peaks) - 0.45)
    ax.set_ylim(0, max(max(runs.values()) for runs in peaks.values()) * 1.45)
    ax.set_ylabel("peak resident memory (MB)")
    ax.legend(fontsize=8, frameon=False, loc="upper left")
    ax.set_title("activation checkpointing, one training step\n(measured, docs/going-big.md)", fontsize=9.5)
    ax.spines[["top", "right"]].set_visible(False)
