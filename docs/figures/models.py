"""The whole model in one picture, bottom to top as in Vaswani et al.'s Figure 1: ``GTransformer`` (decoder-only)
and ``Seq2SeqTransformer`` (encoder-decoder).

Both pictures are read from a real instance of the model. Every box names the class of a submodule
(``type(model.head).__name__``) and the attribute it lives in, and every shape beside an arrow was measured with
forward hooks while the instance ran on a tiny batch. Before drawing, each model is recomputed by hand from its
parts, in the order the picture draws them (post-norm sublayers, the final norm, the head; the encoder's output
into every decoder block's cross-attention): the script stops with an AssertionError if the code does something
else, as ``check_block_wiring`` does for the block diagram.

Registered in ``docs/make_figures.py`` (``FIGURES``), which draws them:

    python docs/make_figures.py --only model-decoder-only --only model-encoder-decoder
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor, nn

from torchformer.models import GTransformer, Seq2SeqTransformer

from figures.canvas import new_figure, save

COLOURS = {"attention": "#c9daf8", "ff": "#d9ead3", "norm": "#fff2cc", "embedding": "#ead1dc", "head": "#fce5cd",
           "frame": "#f7f7f7"}  # make_figures.PART_COLOURS, plus the parts outside the blocks
INK, GREY = "#333333", "#666666"

# The tiny batch the models run on. Every size differs, so each number of a measured shape names one letter.
SIZES = {"b": 2, "t": 5, "u": 7, "e": 16, "v": 12}
SRC_TOKENS = 11  # the encoder-decoder's source vocabulary (not in any shape the picture shows)
DEPTH = 2

# The sublayers of each block, in the order the picture draws them: (the part, its norm). The same lists drive the
# drawing and the check that recomputes the blocks, so the two cannot drift apart.
BLOCK = [("attention", "norm1"), ("ff", "norm2")]
DECODER_BLOCK = [("attention", "norm1"), ("cross_attention", "norm_cross"), ("ff", "norm2")]
KINDS = {"attention": "attention", "cross_attention": "attention", "ff": "ff"}

# Data units (the axes have equal aspect): a box's width, its first line's centre below its top, the step to each
# further line, and the room below its last line (more than above it: arrows arrive from below).
BOX_W, FIRST, LINE_H, BELOW = 3.3, 0.18, 0.22, 0.21


# --- the models, checked ------------------------------------------------------------------------------------------


def tiny_models() -> tuple[GTransformer, Seq2SeqTransformer]:
    """The two models the pictures show, in their default configuration (post-norm), in eval mode.

    The norms get a non-trivial scale and shift (they start as the identity's 1 and 0), so that a norm in the wrong
    place, or norm1 standing in for norm2, changes the result and the checks see it.
    """
    torch.manual_seed(0)
    e, v = SIZES["e"], SIZES["v"]
    models = (GTransformer(e, 4, DEPTH, 8, v), Seq2SeqTransformer(e, 4, DEPTH, 8, SRC_TOKENS, v))
    with torch.no_grad():
        for model in models:
            for module in model.modules():
                if isinstance(module, nn.LayerNorm):
                    module.weight.uniform_(0.5, 1.5)
                    module.bias.uniform_(-0.5, 0.5)
    return models[0].eval(), models[1].eval()  # eval: dropout is the identity, as the picture leaves it out


def block_by_hand(block: nn.Module, sublayers: list[tuple[str, str]], x: Tensor,
                  memory: Optional[Tensor] = None) -> Tensor:
    """``block``'s output ``(b, t, e)`` computed from its parts as the picture wires them: post-norm,
    ``x = norm(x + part(x))`` per sublayer; the cross-attention reads ``memory`` ``(b, u, e)``."""
    for part_name, norm_name in sublayers:
        part, norm = getattr(block, part_name), getattr(block, norm_name)
        y = part(x, memory) if part_name == "cross_attention" else part(x)
        x = norm(x + y)
    return x


def check_same(name: str, code: Tensor, by_hand: Tensor) -> None:
    if not torch.allclose(code, by_hand, atol=1e-5):
        raise AssertionError(f"{name} is no longer wired as the picture draws it")


def check_decoder_only(model: GTransformer, x: Tensor) -> None:
    """Raise unless ``model(x)`` is embedding -> blocks (as ``BLOCK``) -> final norm -> head, in that order."""
    with torch.no_grad():
        h = model.embedding(x)  # (b, t) -> (b, t, e)
        for i, block in enumerate(model.blocks.blocks):
            out = block_by_hand(block, BLOCK, h)
            check_same(f"GTransformer.blocks.blocks[{i}]", block(h), out)
            h = out
        check_same("GTransformer", model(x), model.head(model.blocks.norm(h)))  # -> (b, t, v)


def check_encoder_decoder(model: Seq2SeqTransformer, src: Tensor, tgt: Tensor) -> None:
    """Raise unless ``model(src, tgt)`` is the two stacks as drawn, with the encoder's output (after its final
    norm) as the context of every decoder block's cross-attention."""
    with torch.no_grad():
        h = model.src_embedding(src)  # (b, u) -> (b, u, e)
        for i, block in enumerate(model.encoder.blocks):
            out = block_by_hand(block, BLOCK, h)
            check_same(f"Seq2SeqTransformer.encoder.blocks[{i}]", block(h), out)
            h = out
        memory = model.encoder.norm(h)  # (b, u, e)
        h = model.tgt_embedding(tgt)  # (b, t) -> (b, t, e)
        for i, block in enumerate(model.decoder.blocks):
            out = block_by_hand(block, DECODER_BLOCK, h, memory)
            check_same(f"Seq2SeqTransformer.decoder.blocks[{i}]", block(h, memory), out)
            h = out
        check_same("Seq2SeqTransformer", model(src, tgt), model.head(model.decoder.norm(h)))  # -> (b, t, v)
    contexts: list[Tensor] = []  # what each cross-attention really got as its keys and values, when the model runs

    def record(module: nn.Module, args: tuple, out: Tensor) -> None:
        contexts.append(args[1])  # forward(x, context, ...)

    hooks = [block.cross_attention.register_forward_hook(record) for block in model.decoder.blocks]
    try:
        with torch.no_grad():
            model(src, tgt)
    finally:
        for hook in hooks:
            hook.remove()
    if len(contexts) != len(model.decoder.blocks) or not all(torch.equal(c, memory) for c in contexts):
        raise AssertionError("not every decoder block's cross-attention reads the encoder's output")


def check_probabilities(name: str, log_probs: Tensor) -> None:
    """The head ends with a log_softmax, as the picture says: every row's probabilities sum to 1."""
    if not torch.allclose(log_probs.exp().sum(-1), torch.ones(log_probs.shape[:-1]), atol=1e-5):
        raise AssertionError(f"{name}'s output is not log-probabilities")


def measured_shapes(model: nn.Module, modules: dict[str, nn.Module], *inputs: Tensor) -> dict[str, tuple]:
    """The output shape of each of ``modules`` (by name) the first time it runs in ``model(*inputs)``."""
    shapes: dict[str, tuple] = {}

    def record(name: str):
        def hook(module: nn.Module, args: tuple, out: Tensor) -> None:  # None: the output goes on unchanged
            shapes.setdefault(name, tuple(out.shape))
        return hook

    hooks = [module.register_forward_hook(record(name)) for name, module in modules.items()]
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return shapes


def shape_text(name: str, letters: str, shapes: dict[str, tuple]) -> str:
    """``"(b, t, e)"``, after checking that ``name`` really gave that shape (the numbers of ``SIZES``)."""
    expected = tuple(SIZES[letter] for letter in letters.split(", "))
    if shapes.get(name) != expected:
        raise AssertionError(f"{name} gave shape {shapes.get(name)}, the picture says ({letters}) = {expected}")
    return f"({letters})"


# --- drawing ------------------------------------------------------------------------------------------------------


@dataclass
class Box:
    """One box of the picture: a submodule of the model."""

    module: nn.Module
    path: str  # the attribute that holds it: of the model ("head"), or in a block of the block ("attention")
    kind: str  # its colour, a key of COLOURS
    note: str = ""  # a detail read from the instance, "causal=True"

    @property
    def name(self) -> str:
        return type(self.module).__name__


@dataclass
class Column:
    """One stack drawn bottom to top: its input, embedding, blocks, final norm, head (if any) and output."""

    x: float  # the centre line
    side: int  # -1: residual paths and the "x depth" label on the left; +1: on the right
    source: str  # the input's name and shape, "token ids x  (b, t)"
    embedding: Box
    stream: str  # the measured shape of the vectors through the stack, "(b, t, e)"
    block: str  # the block's class and where the blocks live
    sublayers: list[tuple[Box, Box]]  # (part, its norm), bottom to top
    final_norm: Box
    head: Optional[Box]
    output: str  # the output's name and shape
    source_note: str = ""  # a grey line under the input


def arrow(ax, start: tuple[float, float], end: tuple[float, float]) -> None:
    from matplotlib.patches import FancyArrowPatch

    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=11, lw=1.2, color=INK,
                                 shrinkA=0, shrinkB=0))


def line(ax, points: list[tuple[float, float]]) -> None:
    xs, ys = zip(*points)
    ax.plot(xs, ys, color=INK, lw=1.2, solid_capstyle="butt")


def box_height(box: Box) -> float:
    lines = 3 if box.note else 2  # the class, where it lives, the note
    return FIRST + (lines - 1) * LINE_H + BELOW


def draw_box(ax, x: float, y: float, box: Box) -> None:
    """The class name, then in monospace where it lives (and a note); a dashed edge for a part that does nothing."""
    from matplotlib.patches import FancyBboxPatch

    height = box_height(box)
    identity = isinstance(box.module, nn.Identity)
    ax.add_patch(FancyBboxPatch((x - BOX_W / 2, y - height / 2), BOX_W, height,
                                boxstyle="round,pad=0.02,rounding_size=0.08", fc="white" if identity else
                                COLOURS[box.kind], ec="#555555", lw=1, ls="--" if identity else "-"))
    top = y + height / 2
    ax.text(x, top - FIRST, box.name, ha="center", va="center", fontsize=9.5)
    small = [box.path] + ([box.note] if box.note else [])
    for k, text in enumerate(small):
        ax.text(x, top - FIRST - (k + 1) * LINE_H, text, ha="center", va="center", fontsize=7.5, family="monospace",
                color="#444444")


def plus(ax, x: float, y: float) -> None:
    from matplotlib.patches import Circle

    ax.add_patch(Circle((x, y), 0.17, fc="white", ec=INK, lw=1.2))
    ax.text(x, y - 0.01, "+", ha="center", va="center", fontsize=11)


def shape_note(ax, x: float, y: float, text: str) -> None:
    """A shape beside the arrow at ``x``, on the right of it."""
    ax.text(x + 0.1, y, text, ha="left", va="center", fontsize=8, color=GREY)


def draw_sublayer(ax, column: Column, y: float, part: Box, norm: Box) -> tuple[float, float]:
    """One post-norm sublayer ``norm(x + part(x))`` from ``y`` (where the stream arrives). Returns the part's centre
    (where a second input may enter) and the y where the sublayer's output leaves."""
    x, lane = column.x, column.x + column.side * (BOX_W / 2 + 0.3)
    branch, part_y = y + 0.22, y + 0.5 + box_height(part) / 2
    plus_y = part_y + box_height(part) / 2 + 0.45
    norm_y = plus_y + 0.37 + box_height(norm) / 2
    line(ax, [(x, y), (x, branch)])
    arrow(ax, (x, branch), (x, part_y - box_height(part) / 2))
    draw_box(ax, x, part_y, part)
    arrow(ax, (x, part_y + box_height(part) / 2), (x, plus_y - 0.17))
    plus(ax, x, plus_y)
    line(ax, [(x, branch), (lane, branch), (lane, plus_y)])  # the residual path: the identity, around the part
    arrow(ax, (lane, plus_y), (x + column.side * 0.17, plus_y))
    arrow(ax, (x, plus_y + 0.17), (x, norm_y - box_height(norm) / 2))
    draw_box(ax, x, norm_y, norm)
    return part_y, norm_y + box_height(norm) / 2


def draw_column(ax, column: Column) -> dict[str, float]:
    """Draw one stack bottom to top; return where its parts are: the centre of each part (by its path) and "top",
    where the output text sits."""
    x, where = column.x, {}
    ax.text(x, 0.0, column.source, ha="center", va="center", fontsize=9.5)
    ax.text(x, -0.3, column.source_note, ha="center", va="center", fontsize=8.5, color=GREY)
    embedding_y = 0.55 + box_height(column.embedding) / 2
    arrow(ax, (x, 0.18), (x, embedding_y - box_height(column.embedding) / 2))
    draw_box(ax, x, embedding_y, column.embedding)
    y = embedding_y + box_height(column.embedding) / 2
    shape_note(ax, x, y + 0.3, column.stream)
    frame_bottom = y = y + 0.55
    for part, norm in column.sublayers:
        where[part.path], y = draw_sublayer(ax, column, y, part, norm)
    frame_top = y + 0.2
    draw_frame(ax, column, frame_bottom - 0.12, frame_top)
    boxes = [column.final_norm] + ([column.head] if column.head else [])
    for k, box in enumerate(boxes):
        centre = y + 0.75 + box_height(box) / 2
        arrow(ax, (x, y), (x, centre - box_height(box) / 2))
        shape_note(ax, x, frame_top + 0.25 if k == 0 else y + 0.3, column.stream)
        draw_box(ax, x, centre, box)
        y = centre + box_height(box) / 2
    where["top"] = y + 0.75
    arrow(ax, (x, y), (x, where["top"] - 0.17))
    ax.text(x, where["top"], column.output, ha="center", va="center", fontsize=9.5)
    return where


def draw_frame(ax, column: Column, bottom: float, top: float) -> None:
    """The grey frame around one block, and beside it the block's class and how often it repeats."""
    from matplotlib.patches import FancyBboxPatch

    near, far = BOX_W / 2 + 0.15, BOX_W / 2 + 0.55  # the residual side needs room for the residual paths
    left, right = (column.x - far, column.x + near) if column.side < 0 else (column.x - near, column.x + far)
    ax.add_patch(FancyBboxPatch((left, bottom), right - left, top - bottom, boxstyle="round,pad=0,rounding_size=0.15",
                                fc=COLOURS["frame"], ec="#999999", lw=1, zorder=0))
    outside = left - 0.12 if column.side < 0 else right + 0.12
    ax.text(outside, (bottom + top) / 2, column.block, ha="right" if column.side < 0 else "left", va="center",
            fontsize=8.5, color=GREY, linespacing=1.4)


def finish(figure, ax, title: str, footnote: str, xlim: tuple[float, float], top: float) -> None:
    ax.set_title(title, fontsize=11.5)
    ax.text((xlim[0] + xlim[1]) / 2, -0.7, footnote, ha="center", va="top", fontsize=8, color="#444444",
            linespacing=1.4)
    ax.set_xlim(*xlim)
    ax.set_ylim(-1.85, top + 0.3)
    ax.set_aspect("equal")
    ax.axis("off")
    figure.subplots_adjust(left=0.01, right=0.99, top=0.95, bottom=0.01)


# --- the two figures ----------------------------------------------------------------------------------------------


def block_boxes(block: nn.Module, sublayers: list[tuple[str, str]]) -> list[tuple[Box, Box]]:
    """The (part, norm) boxes of ``block``, named by their attribute in the block, read from the instance; the
    self-attention says whether it is causal."""
    boxes = []
    for part_name, norm_name in sublayers:
        part = getattr(block, part_name)
        note = f"causal={part.causal}" if part_name == "attention" else ""
        if part_name == "cross_attention":
            note = "keys, values: the memory"
        boxes.append((Box(part, part_name, KINDS[part_name], note), Box(getattr(block, norm_name), norm_name, "norm")))
    return boxes


def embedding_box(embedding: nn.Module, path: str) -> Box:
    parts = f"{type(embedding.tokens).__name__} + {type(embedding.positions).__name__}"
    return Box(embedding, path, "embedding", parts)


def repeat_label(block: nn.Module, stack: nn.Module, where: str) -> str:
    """Beside a block's frame: its class, how often it repeats, and where the blocks live."""
    return f"{type(block).__name__}\n× depth ({len(stack.blocks)} here)\n\n{where},\nin an {type(stack).__name__}"


def head_box(head: nn.Module) -> Box:
    return Box(head, "head", "head", f"{type(head.toprobs).__name__}, log_softmax")


def final_norm_note(model: nn.Module) -> str:
    """What the final norm would be with pre-norm blocks, read from such a model (the picture shows post-norm)."""
    prenorm = type(model)(config=model.config.replace(prenorm=True))
    stack = prenorm.blocks if isinstance(prenorm, GTransformer) else prenorm.decoder
    return f"prenorm=True: {type(stack.norm).__name__}"


def draw_model_decoder_only(path: pathlib.Path, quick: bool = False) -> str:
    """GTransformer, bottom to top: ids, embedding, depth causal blocks, final norm, GeneratorHead."""
    model, _ = tiny_models()
    x = torch.randint(0, SIZES["v"], (SIZES["b"], SIZES["t"]))
    check_decoder_only(model, x)
    check_probabilities("GTransformer", model(x))
    block = model.blocks.blocks[0]
    shapes = measured_shapes(model, {"embedding": model.embedding, "attention": block.attention, "ff": block.ff,
                                     "block": block, "norm": model.blocks.norm, "head": model.head}, x)
    for name in ("attention", "ff", "block", "norm"):  # every part keeps (b, t, e)
        shape_text(name, "b, t, e", shapes)
    column = Column(
        x=0.0, side=-1, source="token ids x  (b, t)",
        embedding=embedding_box(model.embedding, "embedding"),
        stream=shape_text("embedding", "b, t, e", shapes),
        block=repeat_label(block, model.blocks, "blocks.blocks[i]"),
        sublayers=block_boxes(block, BLOCK),
        final_norm=Box(model.blocks.norm, "blocks.norm", "norm", final_norm_note(model)),
        head=head_box(model.head),
        output=f"log-probabilities of the next token  {shape_text('head', 'b, t, v', shapes)}",
    )
    figure = new_figure(5.6, 8.0)
    ax = figure.subplots()
    where = draw_column(ax, column)
    footnote = (f"Read from GTransformer({SIZES['e']}, 4, {DEPTH}, 8, {SIZES['v']}) and run on "
                f"b = {SIZES['b']} sequences of t = {SIZES['t']} tokens\n(e = {SIZES['e']}, v = {SIZES['v']}): "
                "each part keeps (b, t, e). In monospace: the attribute of the model\n(in a block, of the block). "
                "Default config (post-norm); dropout (config.dropout, 0 by\ndefault) after the embedding and each "
                "part is not drawn.")
    finish(figure, ax, "GTransformer: a decoder-only model", footnote, (-4.4, 3.8), where["top"])
    save(figure, path)
    return "wiring and shapes checked against a GTransformer"


def draw_model_encoder_decoder(path: pathlib.Path, quick: bool = False) -> str:
    """Seq2SeqTransformer: the encoder on the left, the decoder on the right, the memory into every
    cross-attention."""
    _, model = tiny_models()
    src = torch.randint(0, SRC_TOKENS, (SIZES["b"], SIZES["u"]))
    tgt = torch.randint(0, SIZES["v"], (SIZES["b"], SIZES["t"]))
    check_encoder_decoder(model, src, tgt)
    check_probabilities("Seq2SeqTransformer", model(src, tgt))
    encoder_block, decoder_block = model.encoder.blocks[0], model.decoder.blocks[0]
    shapes = measured_shapes(model, {"src_embedding": model.src_embedding, "tgt_embedding": model.tgt_embedding,
                                     "encoder": model.encoder, "cross": decoder_block.cross_attention,
                                     "decoder block": decoder_block, "decoder norm": model.decoder.norm,
                                     "head": model.head}, src, tgt)
    for name in ("cross", "decoder block", "decoder norm"):  # the cross-attention too: one output per target position
        shape_text(name, "b, t, e", shapes)
    encoder = Column(
        x=0.0, side=-1, source="source ids src  (b, u)",
        embedding=embedding_box(model.src_embedding, "src_embedding"),
        stream=shape_text("src_embedding", "b, u, e", shapes),
        block=repeat_label(encoder_block, model.encoder, "encoder.blocks[i]"),
        sublayers=block_boxes(encoder_block, BLOCK),
        final_norm=Box(model.encoder.norm, "encoder.norm", "norm", final_norm_note(model)),
        head=None, output=f"memory  {shape_text('encoder', 'b, u, e', shapes)}",
    )
    decoder = Column(
        x=6.8, side=+1, source="target ids tgt  (b, t)", source_note="BOS, then the target shifted right",
        embedding=embedding_box(model.tgt_embedding, "tgt_embedding"),
        stream=shape_text("tgt_embedding", "b, t, e", shapes),
        block=repeat_label(decoder_block, model.decoder, "decoder.blocks[i]"),
        sublayers=block_boxes(decoder_block, DECODER_BLOCK),
        final_norm=Box(model.decoder.norm, "decoder.norm", "norm", final_norm_note(model)),
        head=head_box(model.head),
        output=f"log-probabilities of the next target token  {shape_text('head', 'b, t, v', shapes)}",
    )
    figure = new_figure(8.0, 8.2)
    ax = figure.subplots()
    left = draw_column(ax, encoder)
    right = draw_column(ax, decoder)
    draw_memory(ax, left["top"], decoder.x, right["cross_attention"])
    footnote = (f"Read from Seq2SeqTransformer({SIZES['e']}, 4, {DEPTH}, 8, {SRC_TOKENS}, {SIZES['v']}), run on "
                f"b = {SIZES['b']} sources of u = {SIZES['u']} tokens and targets of t = {SIZES['t']} "
                f"(e = {SIZES['e']}, v = {SIZES['v']}).\nIn monospace: the attribute of the model (in a block, of "
                "the block). Default config (post-norm); dropout is not drawn.")
    top = max(left["top"], right["top"])
    finish(figure, ax, "Seq2SeqTransformer: an encoder-decoder model", footnote, (-4.5, 11.2), top)
    save(figure, path)
    return "wiring and shapes checked against a Seq2SeqTransformer"


def draw_memory(ax, memory_y: float, decoder_x: float, cross_y: float) -> None:
    """The encoder's output, from the top of the encoder into the decoder's cross-attention (of every block)."""
    gap = decoder_x / 2  # halfway between the columns
    start = (1.5, memory_y)  # right of the "memory (b, u, e)" text
    line(ax, [start, (gap, memory_y), (gap, cross_y)])
    arrow(ax, (gap, cross_y), (decoder_x - BOX_W / 2, cross_y))
    ax.text(gap + 0.1, (memory_y + cross_y) / 2, "the same memory\ninto the cross-\nattention of\nevery block",
            ha="left", va="center", fontsize=8, color=GREY)
