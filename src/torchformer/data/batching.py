"""Batching variable-length sequences: padding, masks and length bucketing.

A batch of token sequences must become one rectangular ``(b, t)`` tensor, so the shorter sequences are padded up to
the longest. The padding is not data: a boolean mask (``True`` = real token) travels with the ids so attention and
pooling can ignore it.

Padding costs compute. IMDb reviews range from about 10 to 2,500 tokens, so a random batch is mostly padding.
*Bucketing* fixes that while keeping the epoch random: shuffle, cut the indices into large chunks, sort each chunk
by length, cut it into batches of similar lengths, then shuffle the order of the batches.

Empty sequences are refused (``ValueError``) rather than padded: a row that is all padding has nothing to attend to,
and its softmax silently turns into NaN. Map empty texts to something (e.g. ``[WordTokenizer.UNK]``) before
batching.
"""

from __future__ import annotations

import math
import operator
from typing import Iterator, Sequence

import torch
from torch import Tensor

from torchformer._checks import check_bool, is_int

__all__ = ["pad_batch", "bucket_batches", "bucketed_padding", "check_labels", "ClassificationBatches",
           "to_device"]


def _check_int(name: str, value: object, minimum: int = 1) -> int:
    """``value`` as an int of at least ``minimum`` (1: "positive", 0: "non-negative"), or a ValueError naming it."""
    # operator.index: Python, NumPy and 0-d tensor integers count as ints; floats and bools do not.
    try:
        n = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        n = minimum - 1
    if isinstance(value, bool) or n < minimum:
        raise ValueError(f"{name} must be a {'positive' if minimum == 1 else 'non-negative'} int, got {value!r}")
    return n


def _check_sequence(i: int, sequence: object) -> None:
    """A sequence of ids has a length and is not text: else an error naming ``sequences[i]``."""
    if isinstance(sequence, (str, bytes)) or not hasattr(sequence, "__len__"):
        raise TypeError(f"sequences[{i}] must be a sequence of int token ids (a list, tuple or 1-D tensor), got "
                        f"{type(sequence).__name__} {sequence!r:.60}")


def _as_ids(i: int, sequence: object) -> list:
    """``sequences[i]`` as a list of token ids (a list, tuple, 1-D tensor or array), or an error naming it."""
    _check_sequence(i, sequence)
    if hasattr(sequence, "tolist"):  # a tensor or an array
        if getattr(sequence, "ndim", 1) != 1:
            raise TypeError(f"sequences[{i}] must be 1-D, got shape {tuple(sequence.shape)}")
        return sequence.tolist()
    return sequence


def pad_batch(sequences: Sequence[Sequence[int]], *, max_length: int | None = None, pad: int = 0,
              device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """Truncate each sequence to ``max_length`` and right-pad them to a common length.

    Args:
        sequences: ``b`` non-empty sequences of token ids (lists, tuples or 1-D tensors).
        max_length: keep at most the first ``max_length`` ids of each sequence.
        pad: the id written into padded positions.
        device: where the returned tensors live (built on the CPU, then moved once).

    Returns:
        ``ids`` of shape ``(b, t)``, int64, and ``mask`` of shape ``(b, t)``, bool,
        ``True`` at real tokens; ``t`` is the longest sequence after truncation.
    """
    if max_length is not None:
        max_length = _check_int("max_length", max_length)
    if not is_int(pad):
        raise TypeError(f"pad must be an int token id, got {pad!r}")
    if len(sequences) == 0:
        raise ValueError("sequences must contain at least one sequence, got an empty batch")
    rows = [_as_ids(i, s) for i, s in enumerate(sequences)]
    lengths = [len(row) if max_length is None else min(len(row), max_length) for row in rows]
    if 0 in lengths:
        raise ValueError(
            f"sequences[{lengths.index(0)}] is empty; an all-padding row has nothing to attend to "
            "(encode empty texts as e.g. [UNK] instead)"
        )
    # One tensor for all real tokens, scattered into place through the mask: far
    # faster than b small tensor copies.
    try:
        flat = torch.tensor([token for row, n in zip(rows, lengths) for token in row[:n]])
    except (TypeError, ValueError, RuntimeError) as e:  # a string, or a nested list, among the ids
        raise TypeError(f"sequences must hold integer token ids, got other values ({e})") from None
    if flat.dim() != 1 or flat.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise TypeError(f"sequences must hold integer token ids, got dtype {flat.dtype}, shape {tuple(flat.shape)}")
    lengths_t = torch.tensor(lengths)
    mask = torch.arange(int(lengths_t.max())) < lengths_t[:, None]  # (b, t)
    ids = torch.full(mask.shape, pad, dtype=torch.int64)
    # Row-major order of the True positions = the concatenation order of `flat`,
    # because each row's real tokens are a prefix of that row.
    ids[mask] = flat.long()
    return to_device(ids, device), to_device(mask, device)


def to_device(x: Tensor, device: torch.device | str | None) -> Tensor:
    """``x`` (on the CPU) moved to ``device`` without making the host wait for the GPU.

    A plain ``x.to("cuda")`` from ordinary (pageable) memory waits until the GPU has finished all the work queued
    before it, once per batch. From pinned (page-locked) memory the copy is queued like a kernel
    (``non_blocking``); PyTorch keeps the pinned buffer alive until the copy has run.

    Args:
        x: a CPU tensor (a batch being built).
        device: where it goes; ``None``: it stays.

    Returns:
        ``x`` on ``device``.
    """
    if device is None:
        return x
    device = torch.device(device)
    if device.type != "cuda":
        return x.to(device)
    return x.pin_memory().to(device, non_blocking=True)


def bucket_batches(lengths: Sequence[int], batch_size: int, *, shuffle: bool = True,
                   generator: torch.Generator | None = None, bucket_size_multiplier: int = 50) -> list[list[int]]:
    """Group indices ``0 .. len(lengths) - 1`` into batches of similar length.

    Shuffle the indices, cut them into chunks of ``batch_size * bucket_size_multiplier``,
    sort each chunk by length, cut it into batches of ``batch_size`` and shuffle the
    batch order. Each index appears exactly once; only the very last batch may be
    smaller than ``batch_size``; there are ``ceil(len(lengths) / batch_size)`` batches.

    Args:
        lengths: the length of each example.
        batch_size: indices per batch.
        shuffle: shuffle the indices and the batches; ``False`` skips both (deterministic, for evaluation).
        generator: makes the shuffles reproducible; without one, torch's global RNG is used, like ``DataLoader`` does.
        bucket_size_multiplier: how many batches' worth of indices are sorted by length together: more gives more
            uniform batches, but less randomness in which examples meet in a batch.

    Returns:
        The batches, each a list of indices.
    """
    _check_int("batch_size", batch_size)
    _check_int("bucket_size_multiplier", bucket_size_multiplier)
    lengths = [_check_int(f"lengths[{i}]", n, 0) for i, n in enumerate(lengths)]

    count = len(lengths)
    order = torch.randperm(count, generator=generator).tolist() if shuffle else list(range(count))
    chunk = batch_size * bucket_size_multiplier
    batches = []
    for start in range(0, count, chunk):
        bucket = sorted(order[start : start + chunk], key=lengths.__getitem__)
        batches += [bucket[i : i + batch_size] for i in range(0, len(bucket), batch_size)]
    if shuffle:
        batches = [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]
    return batches


def bucketed_padding(lengths: Sequence[int], batch_size: int, *, generator: torch.Generator | None = None) -> float:
    """The share of padding in one epoch of :func:`bucket_batches` of these lengths, each padded to its longest.

    Args:
        lengths: each example's number of tokens (after truncation), ``>= 1``.
        batch_size: examples per batch.
        generator: the shuffle :func:`bucket_batches` draws (the figure changes little from one to another).

    Returns:
        A float in ``[0, 1)``: padded positions over all positions of the epoch's batches.

    Raises:
        ValueError: ``batch_size`` is not a positive int, a length is not a positive int, or no lengths.
    """
    lengths = [_check_int(f"lengths[{i}]", n) for i, n in enumerate(lengths)]
    if not lengths:
        raise ValueError("lengths must hold at least one length, got none")
    batches = bucket_batches(lengths, batch_size, generator=generator)
    return 1 - sum(lengths) / sum(len(b) * max(lengths[i] for i in b) for b in batches)


def check_labels(labels: Sequence[int], num_classes: int | None = None) -> Tensor:
    """``labels`` as a ``(n,)`` int64 tensor of class numbers, checked before training rather than by the loss.

    Args:
        labels: the class of each example, ints (a list, or a 1-D tensor or array).
        num_classes: the classifier's classes ``c``: every label must be in ``[0, c)``; ``None``: only ``>= 0``.

    Returns:
        The labels, int64, on the CPU.

    Raises:
        TypeError: a label is not an int (a string, a float), or ``labels`` is not 1-D.
        ValueError: a label is negative or at least ``num_classes``, or ``num_classes`` is not a positive int.
    """
    if len(labels) == 0:  # as_tensor([]) would be float32
        return torch.zeros(0, dtype=torch.int64)
    try:
        labels_t = torch.as_tensor(labels)
    except (TypeError, ValueError, RuntimeError):  # e.g. strings ("pos"), or ints and strings mixed
        odd = next((y for y in labels if not is_int(y)), labels)
        raise TypeError(f"labels must be a 1-D sequence of ints (class numbers), got {type(odd).__name__} "
                        f"{odd!r:.60} among them") from None
    if labels_t.dtype.is_floating_point or labels_t.dtype == torch.bool or labels_t.dim() != 1:
        raise TypeError(f"labels must be a 1-D sequence of ints, got dtype {labels_t.dtype}, "
                        f"shape {tuple(labels_t.shape)}")
    if int(labels_t.min()) < 0:
        raise ValueError(f"labels must be class numbers >= 0, got {int(labels_t.min())}")
    if num_classes is not None:
        num_classes = _check_int("num_classes", num_classes)
        if int(labels_t.max()) >= num_classes:
            wrong = int((labels_t >= num_classes).sum())
            raise ValueError(f"labels must be class numbers in [0, {num_classes}) (num_classes={num_classes}), "
                             f"got {int(labels_t.max())} ({wrong} label{'s' if wrong > 1 else ''} at or above "
                             f"{num_classes}, the first at index {int((labels_t >= num_classes).nonzero()[0])})")
    return labels_t.long()


class ClassificationBatches:
    """One epoch of ``(ids, mask, labels)`` batches for sequence classification.

    Batches are length-bucketed by :func:`bucket_batches` and padded by :func:`pad_batch`; each ``iter()`` is a new
    epoch with a fresh shuffle drawn from ``generator``.

    Args:
        encoded: the token ids of each example.
        labels: the class of each example.
        batch_size: examples per batch (the last batch may be smaller).
        max_length: examples are cut to this many tokens; ``None``: not cut.
        shuffle: a new order every epoch; ``False`` for evaluation.
        generator: makes the shuffles reproducible.
        device: where the batches go (default: the CPU).
        pad: the padding id.
        num_classes: the classifier's classes ``c``: every label must be in ``[0, c)``, checked here rather than by
            the loss mid-epoch; ``None``: labels are only checked to be ``>= 0``.

    Shapes:
        Each batch: ``ids`` ``(b, t)`` int64, ``mask`` ``(b, t)`` bool (True for real tokens), ``labels`` ``(b,)``
        int64, where ``t`` is the longest example of the batch.

    Example:
        >>> data = ClassificationBatches([[5, 6, 7], [8], [9, 9]], [1, 0, 1], batch_size=2)
        >>> len(data), sum(labels.numel() for _, _, labels in data)
        (2, 3)
    """

    def __init__(self, encoded: Sequence[Sequence[int]], labels: Sequence[int], *, batch_size: int,
                 max_length: int | None = None, shuffle: bool = True, generator: torch.Generator | None = None,
                 device: torch.device | str | None = None, pad: int = 0, num_classes: int | None = None):
        batch_size = _check_int("batch_size", batch_size)
        if max_length is not None:
            max_length = _check_int("max_length", max_length)
        check_bool(shuffle, "shuffle")
        if not is_int(pad):
            raise TypeError(f"pad must be an int token id, got {pad!r}")
        if device is not None:
            try:
                device = torch.device(device)
            except (RuntimeError, TypeError) as e:
                raise ValueError(f"device must be a torch.device or a name such as 'cpu', got {device!r} "
                                 f"({e})") from None
        if len(encoded) != len(labels):
            raise ValueError(f"encoded and labels must have the same length, got {len(encoded)} and {len(labels)}")
        if len(encoded) == 0:
            raise ValueError("encoded must contain at least one sequence, got none")
        labels_t = check_labels(labels, num_classes)
        # Checked here rather than mid-epoch, so a bad example fails before training starts.
        for i, sequence in enumerate(encoded):
            _check_sequence(i, sequence)
        lengths = [len(s) if max_length is None else min(len(s), max_length) for s in encoded]
        empty = [i for i, n in enumerate(lengths) if n == 0]
        if empty:
            raise ValueError(
                f"encoded[{empty[0]}] is empty ({len(empty)} empty sequences in all); "
                "encode empty texts as e.g. [UNK] instead"
            )
        self.encoded = encoded
        self.labels = labels_t
        self.lengths = lengths
        self.batch_size = batch_size
        self.max_length = max_length
        self.shuffle = shuffle
        self.generator = generator
        self.device = device
        self.pad = pad

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        for indices in bucket_batches(self.lengths, self.batch_size, shuffle=self.shuffle, generator=self.generator):
            ids, mask = pad_batch([self.encoded[i] for i in indices], max_length=self.max_length, pad=self.pad,
                                  device=self.device)
            yield ids, mask, to_device(self.labels[indices], self.device)

    def __len__(self) -> int:
        return math.ceil(len(self.lengths) / self.batch_size)
