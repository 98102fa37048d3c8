"""Packing documents into rows: several whole documents share a row, so a batch holds little padding.

Padding a batch of reviews to its longest wastes the compute of every padded position (IMDb reviews run from about
10 to 2,500 tokens). Packing instead fills each row of ``row_length`` positions with whole documents, one after
another, and pads only what is left at the end of the row:

```
padded   [the film was great . <pad> <pad> <pad>]  [awful <pad> <pad> <pad> <pad> <pad> <pad> <pad>]
packed   [the film was great . awful <pad> <pad>]
documents  0   0    0   0    0  1     -    -
```

``documents`` (the document index of each token within its row, non-decreasing) is what a model's
``forward(..., documents=)`` needs to keep attention inside each document and to restart the positions at each
document's first token (``docs/masks.md``).

:func:`pack` decides which documents share a row, by best-fit decreasing: longest first, each into the row whose
space left fits it most tightly, a new row when none does. A document longer than a row is an error unless
``split_long`` is given, and then it is cut into pieces of at most ``row_length`` tokens, each packed as a document
of its own (so its pieces never see each other); :func:`padding_fraction` measures what a packing leaves empty,
:func:`packed_batch` builds the tensors of some rows, :func:`packed_labels` places each document's class where a
packed classifier puts its prediction, and :class:`PackedBatches` is an epoch of them.

Shapes: b rows, t ``row_length``.
"""

from __future__ import annotations

import bisect
import math
import operator
from typing import Iterator, NamedTuple, Sequence

import torch
from torch import Tensor

from torchformer._checks import check_bool, check_positive_int, is_int
from torchformer.data.batching import check_labels, to_device

__all__ = ["IGNORE", "PackedBatches", "Piece", "pack", "pack_pairs", "packed_batch", "packed_labels",
           "padding_fraction"]

# The target of a place in a packed classifier's output that holds no document: F.nll_loss's default
# ignore_index, so the loss skips it.
IGNORE = -100


class Piece(NamedTuple):
    """Tokens ``start .. end - 1`` of document ``document``, placed in a row."""

    document: int
    start: int
    end: int


def pack(lengths: Sequence[int], row_length: int, *, split_long: bool = False) -> list[list[Piece]]:
    """Which documents share a row: best-fit decreasing bin packing of their lengths into rows of ``row_length``.

    Deterministic (ties broken by document index); every token of every document is placed exactly once, whole
    documents in one row. The rows come longest-first; shuffle them for training.

    Args:
        lengths: each document's number of tokens, ``>= 1``.
        row_length: the positions of a row ``t``.
        split_long: cut a document longer than ``row_length`` into pieces of ``row_length`` tokens (the last
            shorter), each placed as a document of its own; ``False``: such a document is an error.

    Returns:
        The rows, each a list of :class:`Piece`\\ s in the order they sit in the row.

    Raises:
        ValueError: ``row_length`` is not a positive int, a length is not a positive int, or (without
            ``split_long``) a document is longer than ``row_length``.
        TypeError: ``split_long`` is not a bool.
    """
    row_length = check_positive_int(row_length, "row_length")
    check_bool(split_long, "split_long")
    pieces = []
    for i, n in enumerate(lengths):
        n = _length(n, f"lengths[{i}]")
        if n > row_length and not split_long:
            raise ValueError(f"document {i} has {n} tokens, more than row_length={row_length}: pass split_long=True "
                             f"to cut it into pieces of {row_length} (which do not see each other), or truncate it")
        pieces += [Piece(i, start, min(start + row_length, n)) for start in range(0, n, row_length)]
    pieces.sort(key=lambda p: (p.start - p.end, p.document, p.start))  # longest first, then in document order
    rows: list[list[Piece]] = []
    # The rows that still have room, as (space left, row index), sorted: the tightest fit is a bisection away.
    room: list[tuple[int, int]] = []
    for piece in pieces:
        size = piece.end - piece.start
        at = bisect.bisect_left(room, (size, -1))
        if at == len(room):  # no row has room: a new one
            rows.append([piece])
            left, row = row_length - size, len(rows) - 1
        else:
            left, row = room.pop(at)
            rows[row].append(piece)
            left -= size
        if left > 0:
            bisect.insort(room, (left, row))
    return rows



def pack_pairs(src_lengths: Sequence[int], tgt_lengths: Sequence[int],
               row_length: int) -> tuple[list[list[Piece]], list[list[Piece]]]:
    """Rows for a sequence-to-sequence model: each pair's source and target at the same place of two rows.

    Pair ``i``'s source sits in a source row where its target sits in the target row, both rows of ``row_length``
    positions: :func:`pack` of each pair's longer side, so both sides fit (the shorter leaves room); pairs are never split.
    :func:`packed_batch` of each side's rows gives ``src_documents`` and ``tgt_documents`` that number the same pairs
    alike: target document ``d`` of a row is the target of its source document ``d``.

    Args:
        src_lengths: each pair's source tokens, ``>= 1``.
        tgt_lengths: each pair's target tokens, ``>= 1``.
        row_length: the positions of a source row and of a target row.

    Returns:
        ``(src_rows, tgt_rows)``: the same pairs in the same order, each a piece of its own side.

    Raises:
        ValueError: the lengths are not one per pair, a length is not a positive int, or a side is longer than
            ``row_length``.
    """
    if len(src_lengths) != len(tgt_lengths):
        raise ValueError(f"src_lengths and tgt_lengths must hold one length per pair, got {len(src_lengths)} and "
                         f"{len(tgt_lengths)}")
    src = [_length(n, f"src_lengths[{i}]") for i, n in enumerate(src_lengths)]
    tgt = [_length(n, f"tgt_lengths[{i}]") for i, n in enumerate(tgt_lengths)]
    rows = pack([max(a, b) for a, b in zip(src, tgt)], row_length)
    return ([[Piece(p.document, 0, src[p.document]) for p in row] for row in rows],
            [[Piece(p.document, 0, tgt[p.document]) for p in row] for row in rows])

def _length(value: object, name: str) -> int:
    """``value`` as a positive Python int (NumPy's and 0-d tensors' integers too), or a ValueError naming it."""
    try:
        n = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        n = 0
    if isinstance(value, bool) or n <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return n


def padding_fraction(rows: Sequence[Sequence[Piece]], row_length: int) -> float:
    """The share of the ``len(rows) * row_length`` positions that no token fills.

    Args:
        rows: what :func:`pack` returned (or some of it).
        row_length: the positions of a row.

    Returns:
        A float in ``[0, 1)``; ``0.0`` for no rows.

    Raises:
        ValueError: ``row_length`` is not a positive int, or a row holds more tokens than it.
    """
    row_length = check_positive_int(row_length, "row_length")
    if not rows:
        return 0.0
    used = [sum(piece.end - piece.start for piece in row) for row in rows]
    if max(used) > row_length:
        raise ValueError(f"rows[{used.index(max(used))}] holds {max(used)} tokens, more than row_length={row_length}")
    return 1.0 - sum(used) / (len(rows) * row_length)


def packed_batch(sequences: Sequence[Sequence[int]], rows: Sequence[Sequence[Piece]], row_length: int, *,
                 pad: int = 0, device: torch.device | str | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """The tensors of ``rows``: token ids, each token's document within its row, and the real tokens.

    Args:
        sequences: every document's token ids (what ``rows`` index), lists, tuples or 1-D tensors.
        rows: ``b`` rows of :func:`pack`.
        row_length: ``t``, the positions of a row (the rows must fit it).
        pad: the id written into the positions no token fills.
        device: where the tensors go (built on the CPU, then moved once).

    Returns:
        ``(ids, documents, mask)``, each ``(b, t)``: int64 ids; int64 documents ``0, 1, ...`` in the order the
        pieces sit in the row, the padding at a row's end numbered one past its last document (so the numbers never
        decrease along a row); bool ``mask``, ``True`` at real tokens.

    Raises:
        ValueError: no rows, an empty row, a piece outside its document, or a row longer than ``row_length``.
        TypeError: ``pad`` is not an int.
    """
    row_length = check_positive_int(row_length, "row_length")
    if not is_int(pad):
        raise TypeError(f"pad must be an int token id, got {pad!r}")
    if len(rows) == 0:
        raise ValueError("rows must hold at least one row, got none")
    ids = torch.full((len(rows), row_length), pad, dtype=torch.int64)
    documents = torch.empty((len(rows), row_length), dtype=torch.int64)
    mask = torch.zeros((len(rows), row_length), dtype=torch.bool)
    for r, row in enumerate(rows):
        if not row:
            raise ValueError(f"rows[{r}] is empty: every row needs at least one piece")
        at = 0
        for d, (document, start, end) in enumerate(row):
            tokens = sequences[document]
            if not 0 <= start < end <= len(tokens):
                raise ValueError(f"rows[{r}][{d}] takes tokens {start}..{end - 1} of document {document}, which has "
                                 f"{len(tokens)}")
            if at + end - start > row_length:
                raise ValueError(f"rows[{r}] holds more than row_length={row_length} tokens")
            ids[r, at:at + end - start] = torch.as_tensor(tokens[start:end], dtype=torch.int64)
            documents[r, at:at + end - start] = d
            at += end - start
        mask[r, :at] = True
        documents[r, at:] = len(row)  # the padding: a document of its own, after the real ones
    return to_device(ids, device), to_device(documents, device), to_device(mask, device)


def packed_labels(labels: Tensor, rows: Sequence[Sequence[Piece]], row_length: int, *,
                  device: torch.device | str | None = None) -> Tensor:
    """Each piece's class, where a packed classifier puts its prediction: row ``r``'s ``d``-th piece at ``[r, d]``.

    A classifier given ``documents`` (``CTransformer``) returns ``(b, t, c)``, one prediction per document number of
    each row; these are its targets, so ``F.nll_loss(logp.flatten(0, 1), targets.flatten())`` is the summed loss of
    the rows' documents (the other places are :data:`IGNORE`). A document cut by ``split_long`` gives each of its
    pieces its class.

    Args:
        labels: ``(n,)`` integer, the class of every document (what the rows' pieces index).
        rows: ``b`` rows of :func:`pack`.
        row_length: ``t``.
        device: where the tensor goes (built on the CPU, then moved once).

    Returns:
        ``(b, t)`` int64: classes, and :data:`IGNORE` where a row has no ``d``-th piece.

    Raises:
        ValueError: no rows, or a row with more pieces than ``row_length``.
    """
    row_length = check_positive_int(row_length, "row_length")
    if len(rows) == 0:
        raise ValueError("rows must hold at least one row, got none")
    targets = torch.full((len(rows), row_length), IGNORE, dtype=torch.int64)
    for r, row in enumerate(rows):
        if len(row) > row_length:
            raise ValueError(f"rows[{r}] has {len(row)} pieces, more than row_length={row_length}")
        targets[r, :len(row)] = labels[[piece.document for piece in row]]
    return to_device(targets, device)


class PackedBatches:
    """One epoch of ``(ids, documents, mask)`` batches of packed rows: :func:`pack` once, then rows in batches.

    The documents are packed into rows when the object is built; each ``iter()`` is a new epoch, the rows in a
    fresh order drawn from ``generator`` and cut into batches of ``batch_size`` rows (the last may have fewer).
    With ``labels``, for classification, each batch also has each document's class (:func:`packed_labels`).

    Args:
        encoded: the token ids of each document, ``>= 1`` of them.
        row_length: the positions of a row ``t``.
        batch_size: rows per batch.
        labels: the class of each document; ``None``: batches without targets.
        num_classes: with ``labels``, the classifier's classes ``c``: every label must be in ``[0, c)``.
        split_long: as in :func:`pack` (a document longer than a row is otherwise an error).
        shuffle: a new order of the rows every epoch; ``False`` for evaluation.
        generator: makes the shuffles reproducible; ``None``: torch's global one.
        device: where the batches go (default: the CPU).
        pad: the padding id.

    Shapes:
        Each batch: ``ids``, ``documents`` ``(b, t)`` int64 and ``mask`` ``(b, t)`` bool, as :func:`packed_batch`;
        with ``labels``, a fourth ``(b, t)`` int64 of targets.

    Raises:
        ValueError: as :func:`pack`; ``labels`` not one per document, or out of ``[0, num_classes)``.
        TypeError: a flag of the wrong type, labels that are not ints.

    Example:
        >>> data = PackedBatches([[5, 6, 7], [8], [9, 9]], row_length=4, batch_size=2)
        >>> len(data.rows), len(data), round(data.padding, 3)
        (2, 1, 0.25)
    """

    def __init__(self, encoded: Sequence[Sequence[int]], *, row_length: int, batch_size: int,
                 labels: Sequence[int] | None = None, num_classes: int | None = None, split_long: bool = False,
                 shuffle: bool = True, generator: torch.Generator | None = None,
                 device: torch.device | str | None = None, pad: int = 0) -> None:
        self.batch_size = check_positive_int(batch_size, "batch_size")
        self.row_length = check_positive_int(row_length, "row_length")
        self.shuffle = check_bool(shuffle, "shuffle")
        if not is_int(pad):
            raise TypeError(f"pad must be an int token id, got {pad!r}")
        if len(encoded) == 0:
            raise ValueError("encoded must contain at least one document, got none")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
        self.labels = None
        if labels is not None:
            if len(labels) != len(encoded):
                raise ValueError(f"labels must hold one class per document, got {len(labels)} for {len(encoded)} "
                                 f"documents")
            self.labels = check_labels(labels, num_classes)
        self.encoded, self.generator, self.device, self.pad = encoded, generator, device, pad
        self.rows = pack([len(d) for d in encoded], row_length, split_long=split_long)

    @property
    def padding(self) -> float:
        """The share of the rows' positions that no token fills (:func:`padding_fraction`)."""
        return padding_fraction(self.rows, self.row_length)

    def __iter__(self) -> Iterator[tuple[Tensor, ...]]:
        order = (torch.randperm(len(self.rows), generator=self.generator).tolist() if self.shuffle
                 else list(range(len(self.rows))))
        for start in range(0, len(order), self.batch_size):
            rows = [self.rows[i] for i in order[start:start + self.batch_size]]
            batch = packed_batch(self.encoded, rows, self.row_length, pad=self.pad, device=self.device)
            if self.labels is not None:
                batch += (packed_labels(self.labels, rows, self.row_length, device=self.device),)
            yield batch

    def __len__(self) -> int:
        return math.ceil(len(self.rows) / self.batch_size)
