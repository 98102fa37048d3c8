"""Classification metrics: accuracy, the confusion matrix, and the loop that collects them over a data set.

Accuracy alone hides *how* a classifier fails. The confusion matrix counts, for every true class (row), how often
each class was predicted (column): the diagonal holds the correct answers, and an imbalance between the two
off-diagonal cells of a binary task shows a bias towards one class (e.g. calling mixed reviews negative).

:func:`evaluate_classifier` runs a model that returns class log-probabilities (as
:class:`~torchformer.models.CTransformer` does) over batches of ``(ids, mask, labels)`` (as
:class:`~torchformer.data.ClassificationBatches` yields) and returns the mean loss, the accuracy and the confusion
matrix in one pass.

Accuracy also hides how far the model's *confidence* can be trusted. :func:`calibration` compares, in bins of
confidence, how sure the model was with how often it was right (a model that says "90 %" should be right 9 times in
10); :func:`evaluate_classifier` returns it too.

Shapes: n number of examples, c number of classes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from torchformer._checks import check_bool, is_integral
from torchformer.train.distributed import all_reduce_sum, rank_and_world_size
from torchformer.train.training import autocast

__all__ = [
    "Calibration", "ClassifierResult", "accuracy", "calibration", "confusion_matrix", "evaluate_classifier",
    "format_confusion_matrix",
]


# Without num_classes the matrix is (largest id + 1)² cells: a stray huge id must not allocate terabytes.
MAX_INFERRED_CLASSES = 10_000
MAX_CELLS = 2**30  # 8 GiB of int64 counts: more than any confusion matrix anyone means to print
# More calibration bins than this hold too few examples each to estimate an accuracy (and a stray huge value would
# allocate gigabytes of empty bins).
MAX_BINS = 10_000
CALIBRATION_BINS = 10  # the bins of the calibration that evaluate_classifier returns (a common choice)
# Rows of probabilities sum to 1 only up to rounding, and bf16 keeps just 8 significant bits: allow 2 %.
ROW_SUM_TOLERANCE = 0.02


def _as_labels(x: object, name: str) -> Tensor:
    """``x`` (a 1-D tensor, array, list or other iterable of int class ids) as a CPU int64 tensor."""
    expected = f"{name} must be a 1-D sequence of int class ids (a list, tensor or array)"
    if not isinstance(x, Tensor):
        if isinstance(x, (str, bytes, Mapping)) or not isinstance(x, Iterable):
            raise TypeError(f"{expected}, got {type(x).__name__} {x!r:.60}")
        if not isinstance(x, (np.ndarray, Sequence)):
            x = list(x)  # a generator, a set, ...: torch.as_tensor reads sequences only
        try:
            x = torch.as_tensor(x)
        except (TypeError, ValueError, RuntimeError, OverflowError) as e:  # ["a"], [1, None], [2**70]
            raise TypeError(f"{expected}, got {type(x).__name__} {x!r:.60} ({e})") from None
    if x.numel() == 0:
        x = x.long()  # torch.as_tensor([]) is float32; an empty list is still a list of labels
    if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool or x.dim() != 1:
        raise TypeError(f"{expected}, got dtype {x.dtype}, shape {tuple(x.shape)}")
    return x.long().cpu()


def _check_pair(predictions: object, targets: object) -> tuple[Tensor, Tensor]:
    p, t = _as_labels(predictions, "predictions"), _as_labels(targets, "targets")
    if p.shape != t.shape:
        raise ValueError(f"predictions and targets must have the same length, got {p.numel()} and {t.numel()}")
    if p.numel() == 0:
        raise ValueError("predictions must contain at least one example, got none")
    return p, t


def _check_num_classes(num_classes: object) -> int:
    if not is_integral(num_classes) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
    return int(num_classes)


def accuracy(predictions: Sequence[int] | Tensor, targets: Sequence[int] | Tensor) -> float:
    """The fraction of ``predictions`` ``(n,)`` equal to ``targets`` ``(n,)``, in [0, 1].

    Args:
        predictions: the predicted class ids ``(n,)``: a 1-D tensor, array, list or other iterable of ints.
        targets: the true class ids ``(n,)``, likewise.

    Returns:
        The accuracy, a float in [0, 1].

    Raises:
        TypeError: either is not a 1-D sequence of int class ids.
        ValueError: their lengths differ, or they are empty.
    """
    p, t = _check_pair(predictions, targets)
    return (p == t).double().mean().item()


def confusion_matrix(predictions: Sequence[int] | Tensor, targets: Sequence[int] | Tensor, *,
                     num_classes: int | None = None) -> Tensor:
    """``(c, c)`` int64 counts: entry ``[i, j]`` is the number of examples of true class ``i`` predicted as ``j``.

    ``num_classes`` defaults to ``1 + the largest id seen``; give it so that a class that never occurs still gets
    its row and column. Rows sum to the class frequencies of ``targets``; the trace is the number correct.
    Without ``num_classes`` an id of :data:`MAX_INFERRED_CLASSES` or more is refused (a stray large id would ask
    for a matrix of its square: terabytes); with it, matrices of more than :data:`MAX_CELLS` cells are.

    Args:
        predictions: the predicted class ids ``(n,)``: a 1-D tensor, array, list or other iterable of ints.
        targets: the true class ids ``(n,)``, likewise.
        num_classes: ``c``; ``None``: one more than the largest id in either.

    Returns:
        The counts ``(c, c)``, int64, on the CPU.

    Raises:
        TypeError: either is not a 1-D sequence of int class ids.
        ValueError: their lengths differ or they are empty, an id is outside ``[0, c)``, or the matrix would be
            too large (see above).
    """
    p, t = _check_pair(predictions, targets)
    low = min(p.min().item(), t.min().item())
    high = max(p.max().item(), t.max().item())
    if num_classes is None:
        if high >= MAX_INFERRED_CLASSES:
            raise ValueError(
                f"the largest class id is {high}, so num_classes would default to {high + 1} (a matrix of "
                f"{_cells(high + 1)}); pass num_classes=... if there really are that many classes (more than "
                f"{MAX_INFERRED_CLASSES:,} are never inferred), or check the ids"
            )
        num_classes = high + 1
    else:
        num_classes = _check_num_classes(num_classes)
        if num_classes * num_classes > MAX_CELLS:
            raise ValueError(f"num_classes must be at most {math.isqrt(MAX_CELLS):,} (a matrix of num_classes² "
                             f"cells), got {num_classes:,}: {_cells(num_classes)}")
    if low < 0 or high >= num_classes:
        raise ValueError(f"class ids must be in [0, {num_classes}), got ids from {low} to {high}")
    # Each (true, predicted) pair becomes one flat index; counting those counts the cells.
    flat = torch.bincount(t * num_classes + p, minlength=num_classes * num_classes)
    return flat.view(num_classes, num_classes)


def _cells(c: int) -> str:
    return f"{c:,} x {c:,} int64 counts, {c * c * 8 / 2**30:,.1f} GiB"


def format_confusion_matrix(matrix: Tensor, *, labels: Sequence[str] | None = None) -> str:
    """A plain-text table of a confusion matrix, rows = true class, columns = predicted class.

    Integer counts print as integers; a float matrix (e.g. normalised per row, ``m / m.sum(1, keepdim=True)``)
    prints its values with 4 significant digits (whole numbers without decimals).

    Args:
        matrix: the ``(c, c)`` matrix, counts or fractions (:func:`confusion_matrix`).
        labels: the ``c`` class names, in class id order; ``None``: the ids ``0 .. c-1``.

    Returns:
        The table, its lines joined by newlines (no newline at the end), columns right-aligned.

    Raises:
        ValueError: ``matrix`` is not a square 2-D tensor, or ``labels`` does not name ``c`` classes.
        TypeError: ``matrix`` is complex, or ``labels`` is a str or not a sequence.
    """
    if not isinstance(matrix, Tensor) or matrix.dim() != 2 or matrix.size(0) != matrix.size(1):
        shape = tuple(matrix.shape) if isinstance(matrix, Tensor) else type(matrix).__name__
        raise ValueError(f"matrix must be a square (c, c) tensor, got {shape}")
    if matrix.dtype.is_complex:
        raise TypeError(f"matrix must hold real numbers (counts or fractions), got dtype {matrix.dtype}")
    c = matrix.size(0)
    if labels is not None and (isinstance(labels, (str, bytes)) or not isinstance(labels, Iterable)):
        # a str would be split into one label per character
        raise TypeError(f"labels must be a sequence of {c} class names, got {type(labels).__name__} {labels!r:.60}")
    labels = [str(label) for label in (range(c) if labels is None else labels)]
    if len(labels) != c:
        raise ValueError(f"labels must name all {c} classes, got {len(labels)}")
    cells = [[_format_count(v) for v in row] for row in matrix.tolist()]
    width = max(len(s) for s in [*labels, *(v for row in cells for v in row), "true \\ predicted"])
    lines = ["true \\ predicted".ljust(width) + "".join(f"  {label:>{width}}" for label in labels)]
    lines += [f"{label:<{width}}" + "".join(f"  {v:>{width}}" for v in row) for label, row in zip(labels, cells)]
    return "\n".join(lines)


def _format_count(v: float | int | bool) -> str:
    if isinstance(v, float) and not v.is_integer():
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.1f}"  # (nan and inf print as such)
    return str(int(v))  # int, bool as 0 / 1, and a whole float without decimals


@dataclass
class Calibration:
    """What :func:`calibration` measured: how well a classifier's confidence matches how often it is right.

    Each argument is kept as the attribute of the same name. :meth:`to_dict` gives it all as JSON-ready data.

    Args:
        ece: the expected calibration error, in [0, 1] (0: in every bin the mean confidence equals the accuracy).
        edges: ``(bins + 1,)`` float64: bin ``i`` holds the confidences in ``[edges[i], edges[i + 1])`` (the last
            bin includes 1).
        counts: ``(bins,)`` int64, the examples in each bin.
        confidence: ``(bins,)`` float64, each bin's mean confidence; NaN in an empty bin.
        accuracy: ``(bins,)`` float64, the fraction of each bin's examples predicted right; NaN in an empty bin.
        mean_confidence_right: the mean confidence of the right answers (NaN when there are none).
        mean_confidence_wrong: the mean confidence of the wrong answers (NaN when there are none).
        count: ``n``, the number of examples.
    """

    ece: float
    edges: Tensor
    counts: Tensor
    confidence: Tensor
    accuracy: Tensor
    mean_confidence_right: float
    mean_confidence_wrong: float
    count: int

    def to_dict(self) -> dict:
        """The same as plain Python numbers, for ``json.dumps``.

        What is undefined (NaN: an empty bin's confidence and accuracy, the mean confidence of wrong answers when
        there are none) is ``None``, as JSON has no NaN.

        Returns:
            ``{"ece", "mean_confidence_right", "mean_confidence_wrong", "count", "bins"}``, where ``"bins"`` is a
            list with one ``{"from", "to", "count", "confidence", "accuracy"}`` dict per bin.
        """

        def number(v: float) -> float | None:
            return None if math.isnan(v) else v

        edges = self.edges.tolist()
        return {
            "ece": self.ece,
            "mean_confidence_right": number(self.mean_confidence_right),
            "mean_confidence_wrong": number(self.mean_confidence_wrong),
            "count": self.count,
            "bins": [
                {"from": low, "to": high, "count": k, "confidence": number(conf), "accuracy": number(acc)}
                for low, high, k, conf, acc in zip(edges, edges[1:], self.counts.tolist(), self.confidence.tolist(),
                                                   self.accuracy.tolist())
            ],
        }


def calibration(probabilities: Tensor, targets: Sequence[int] | Tensor, *, bins: int = 10) -> Calibration:
    """How far a classifier's confidence is from its accuracy.

    Is it right 90 % of the time when it says "90 %"? The prediction is the likeliest class, and its **confidence**
    the probability given to it.

    The examples are grouped by confidence into ``bins`` bins of equal width over **[1/c, 1]** (not [0, 1]): the
    largest of ``c`` probabilities that sum to 1 is at least their mean, 1/c, so bins below 1/c would always be empty
    (for two classes, half of them). A confidence a rounding error below 1/c counts in the first bin. In each bin B,
    ``conf(B)`` is the mean confidence and ``acc(B)`` the fraction predicted right; the **expected calibration
    error** is their gap, averaged over the examples::

        ECE = sum over bins B of |B| / n * |acc(B) - conf(B)|

    (Naeini et al., 2015; Guo et al., 2017, who bin [0, 1]: with that binning the figure can differ.) Under- and
    overconfidence both raise it; the reliability diagram, ``accuracy`` against ``confidence`` per bin with the
    diagonal, shows which. The ECE depends on ``bins``: more bins hold fewer examples each, and their noise adds to
    it.

    Args:
        probabilities: ``(n, c)``, each row a distribution over the ``c`` classes (rows must sum to 1 within 2 %):
            ``model(x).exp()`` for a model that returns log-probabilities.
        targets: the true class ids ``(n,)``: a 1-D tensor, array, list or other iterable of ints.
        bins: the number of confidence bins, an int in ``[1, MAX_BINS]``.

    Returns:
        Everything measured, as a :class:`Calibration`: the ECE and the per-bin figures of the reliability diagram.

    Raises:
        TypeError: ``probabilities`` is not a floating-point tensor, or ``targets`` are not int class ids.
        ValueError: any other shape than ``(n, c)`` with ``n >= 1`` and ``c >= 2``, values outside [0, 1] (or NaN),
            rows that do not sum to 1, ``targets`` of another length or outside ``[0, c)``, or ``bins`` that is not
            an int in ``[1, MAX_BINS]``.
    """
    if not isinstance(probabilities, Tensor):
        raise TypeError(f"probabilities must be a (n, c) torch.Tensor of class probabilities, got "
                        f"{type(probabilities).__name__}")
    if not probabilities.is_floating_point():
        raise TypeError(f"probabilities must be floating point, got dtype {probabilities.dtype}")
    if probabilities.dim() != 2 or probabilities.size(0) < 1 or probabilities.size(1) < 2:
        raise ValueError(f"probabilities must have shape (n, c) with n >= 1 examples and c >= 2 classes, got "
                         f"{tuple(probabilities.shape)}")
    if not is_integral(bins) or not 1 <= bins <= MAX_BINS:
        raise ValueError(f"bins must be an int in [1, {MAX_BINS:,}], got {bins!r}")
    p = probabilities.detach().double().cpu()
    n, c = p.shape
    if not ((p >= 0) & (p <= 1)).all():  # (NaN fails both comparisons)
        raise ValueError(f"probabilities must be in [0, 1], got values from {p.min().item():.4g} to "
                         f"{p.max().item():.4g} (log-probabilities? pass .exp(); logits? pass .softmax(-1))")
    sums = p.sum(dim=1)
    worst = int((sums - 1).abs().argmax())
    if abs(sums[worst].item() - 1) > ROW_SUM_TOLERANCE:
        raise ValueError(f"probabilities: each row must sum to 1 (within {ROW_SUM_TOLERANCE}), got row {worst} "
                         f"summing to {sums[worst].item():.4g}")
    t = _as_labels(targets, "targets")
    if t.numel() != n:
        raise ValueError(f"targets must hold one class id per row of probabilities, {n}, got {t.numel()}")
    if t.min() < 0 or t.max() >= c:
        raise ValueError(f"targets must be class ids in [0, {c}), got ids from {int(t.min())} to {int(t.max())}")
    confidence, predicted = p.max(dim=1)
    sums = _calibration_sums(confidence, predicted == t, classes=c, bins=int(bins))
    return _calibration_from_sums(sums, classes=c, bins=int(bins))


def _edges(classes: int, bins: int) -> Tensor:
    """``(bins + 1,)`` float64: equal widths from 1/c to 1, written so that an edge such as 0.6 comes out as 0.6,
    not 0.6000000000000001."""
    steps = torch.arange(bins + 1, dtype=torch.float64)
    return (1 / classes * (bins - steps) + steps) / bins


def _calibration_sums(confidence: Tensor, correct: Tensor, *, classes: int, bins: int) -> Tensor:
    """Everything a :class:`Calibration` is computed from, as sums: ``(3 * bins + 4,)`` float64, per bin the
    examples, their confidences and their right answers, then the confidences and numbers of the right and of the
    wrong answers. Sums of several shares of the examples add up to the sums of all of them, which is how
    :func:`evaluate_classifier` combines processes."""
    # right=True: bin i holds edges[i] <= confidence < edges[i + 1]. Only the inner edges are given, so anything
    # below edges[1] lands in bin 0 and anything from edges[-2] on (1 included) in the last bin.
    index = torch.bucketize(confidence, _edges(classes, bins)[1:-1], right=True)  # (n,) bin of each example

    def per_bin(values: Tensor) -> Tensor:  # (n,) -> (bins,) sums
        return torch.zeros(bins, dtype=torch.float64).index_add_(0, index, values.double())

    right, wrong = confidence[correct], confidence[~correct]
    tail = [right.sum(), right.numel(), wrong.sum(), wrong.numel()]
    return torch.cat([torch.bincount(index, minlength=bins).double(), per_bin(confidence), per_bin(correct),
                      torch.tensor(tail, dtype=torch.float64)])


def _calibration_from_sums(sums: Tensor, *, classes: int, bins: int) -> Calibration:
    """The :class:`Calibration` of the sums of :func:`_calibration_sums`."""
    counts, confidence_sums, right_per_bin = sums[:bins], sums[bins:2 * bins], sums[2 * bins:3 * bins]
    right_sum, right_n, wrong_sum, wrong_n = sums[3 * bins:].tolist()
    n = int(counts.sum().item())
    mean_confidence = confidence_sums / counts  # 0 / 0 = NaN in an empty bin
    accuracy_ = right_per_bin / counts
    filled = counts > 0
    ece = (counts[filled] / n * (accuracy_[filled] - mean_confidence[filled]).abs()).sum().item()
    return Calibration(
        ece=ece,
        edges=_edges(classes, bins),
        counts=counts.long(),
        confidence=mean_confidence,
        accuracy=accuracy_,
        mean_confidence_right=right_sum / right_n if right_n else math.nan,
        mean_confidence_wrong=wrong_sum / wrong_n if wrong_n else math.nan,
        count=n,
    )


@dataclass
class ClassifierResult:
    """What :func:`evaluate_classifier` measured: loss, accuracy, confusion matrix and calibration (a dataclass).

    Args:
        loss: the mean negative log-likelihood per example, in nats.
        accuracy: the fraction of examples predicted right, in [0, 1].
        confusion: ``(c, c)`` int64 counts, rows the true classes and columns the predicted ones
            (:func:`confusion_matrix`).
        count: ``n``, the number of examples.
        calibration: the :func:`calibration` of the predictions in ``CALIBRATION_BINS`` bins; ``None`` for a model
            of one class, which has nothing to calibrate.
    """

    loss: float
    accuracy: float
    confusion: Tensor
    count: int
    calibration: Calibration | None = None


@torch.no_grad()
def evaluate_classifier(model: nn.Module, batches: Iterable[tuple[Tensor, Tensor | None, Tensor]], *,
                        num_classes: int | None = None, mixed_precision: bool = True,
                        distributed: bool = False) -> ClassifierResult:
    """Evaluate ``model`` on every ``(ids, mask, labels)`` batch; the model is put in eval mode and restored after.

    The loss is the mean negative log-likelihood per example (not per batch, so a smaller last batch weighs no more
    than its examples). The result's ``calibration`` is :func:`calibration` of the same predictions (their
    confidence is ``exp`` of the largest log-probability) in ``CALIBRATION_BINS`` bins.

    ``distributed=True``: every process of the process group (:mod:`torchformer.train.distributed`) calls this with
    the same batches, in the same order, and scores every ``world_size``-th of them, starting at its rank; the sums
    everything is computed from (per-batch losses, confusion counts, the calibration's per-bin sums) are added up
    over the processes, and every process returns the figures of all the batches, equal to one process's: counts
    are integers, each batch's loss is summed on one process only, and the confidences are float32 numbers whose
    float64 sums are exact (each is a multiple of ``2**-(24 + ceil(log2 c))`` and below 1; exact while ``n * c``
    stays below about ``2**29``), so the order of the additions does not matter. Every process runs the same number
    of forward passes (an FSDP model gathers its parameters with all of them in each one): one whose share is a
    batch short scores the first batch again, unrecorded. Without a process group, the same as ``False``.

    The inputs are checked as they come, each error naming the batch: a batch that is not a triple (``(ids,
    labels)`` batches: yield ``(ids, None, labels)``), labels that are not 1-D integer class ids in ``[0, c)`` (one
    per example), an output of the wrong shape. On the first batch the output must hold log-probabilities: NaN
    means the weights are broken (did training diverge?), and a logsumexp over the classes far from 0 means the
    model returns logits (apply ``log_softmax``).

    Args:
        model: a classifier, ``model(ids, mask)`` -> log-probabilities ``(b, c)``.
        batches: an iterable of ``(ids, mask, labels)``: ids ``(b, t)``, mask ``(b, t)`` bool or ``None``, labels
            ``(b,)`` class ids (a :class:`~torchformer.data.ClassificationBatches`, or a list); read once.
        num_classes: ``c``, checked against the model's output; ``None``: taken from it.
        mixed_precision: run the forward pass under :func:`~torchformer.train.training.autocast` (bf16 on CUDA).
        distributed: share the batches among the processes of the process group (see above).

    Returns:
        The figures over all the batches, as a :class:`ClassifierResult` (on every process, with ``distributed``).

    Raises:
        TypeError: an argument, a batch's ids, or the model's output is of the wrong type.
        ValueError: a malformed batch, labels or output, NaN in the output, logits instead of log-probabilities,
            ``num_classes`` different from the model's, or no batch or no example at all.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if isinstance(batches, (str, bytes, Tensor)) or not isinstance(batches, Iterable):
        raise TypeError(f"batches must be an iterable of (ids, mask, labels) batches (e.g. a ClassificationBatches "
                        f"or a list), got {type(batches).__name__}")
    if num_classes is not None:
        num_classes = _check_num_classes(num_classes)
    check_bool(mixed_precision, "mixed_precision")
    check_bool(distributed, "distributed")
    rank, world_size = rank_and_world_size() if distributed else (0, 1)
    was_training = model.training
    model.eval()
    losses: dict[int, float] = {}  # batch index -> summed loss, of this process's batches
    predictions, targets, confidences = [], [], []
    classes: int | None = None  # c, from the first output
    checked = False  # whether an output's values have been checked (on the first non-empty batch)
    first, seen = None, 0  # the first batch (replayed by a process whose share is short), the number of batches
    try:
        for index, batch in enumerate(batches):
            ids, mask, labels = _unpack(batch, index)
            first, seen = first or (ids, mask), seen + 1
            if index % world_size != rank:
                continue
            target = _as_labels(labels, f"labels (batch {index})")  # on the CPU: checked without waiting for a GPU
            if ids.dim() >= 1 and target.numel() != ids.size(0):
                raise ValueError(f"labels (batch {index}) must hold one class id per sequence of ids, "
                                 f"{ids.size(0)}, got {target.numel()}")
            with autocast(ids.device, enabled=mixed_precision):
                logprobs = model(ids, mask)
            _check_output(logprobs, target, index, classes)
            classes = logprobs.size(-1)
            if num_classes is not None and num_classes != classes:
                raise ValueError(f"num_classes is {num_classes}, but the model returns log-probabilities for "
                                 f"{classes} classes; leave num_classes out, or pass {classes}")
            if target.numel() and (target.min() < 0 or target.max() >= classes):
                raise ValueError(f"labels (batch {index}) must be class ids in [0, {classes}) (the model has "
                                 f"{classes} classes), got ids from {int(target.min())} to {int(target.max())}")
            if not checked and target.numel():
                _check_logprobs(logprobs)
                checked = True
            loss = F.nll_loss(logprobs.float(), target.to(logprobs.device), reduction="sum").item()
            if math.isnan(loss):
                raise ValueError(f"the model's output for batch {index} holds NaN: its weights or this batch's "
                                 f"inputs are not finite (did training diverge?)")
            losses[index] = loss
            predictions.append(logprobs.argmax(dim=-1).cpu())
            confidences.append(logprobs.float().amax(dim=-1).exp().cpu())  # the probability of each prediction
            targets.append(target)
        if first is None:
            raise ValueError("batches must yield at least one batch, got none")
        for _ in range(math.ceil(seen / world_size) - len(losses)):  # see the docstring: the same passes everywhere
            with autocast(first[0].device, enabled=mixed_precision):
                classes = model(*first).size(-1)
    finally:
        model.train(was_training)
    p, t = torch.cat([torch.zeros(0, dtype=torch.long), *predictions]), torch.cat([torch.zeros(0, dtype=torch.long),
                                                                                     *targets])
    # Each process's sums, added up over the processes (all_reduce_sum is the identity for one process).
    per_batch = torch.zeros(seen, dtype=torch.float64)
    per_batch[list(losses)] = torch.tensor(list(losses.values()), dtype=torch.float64)
    per_batch = all_reduce_sum(per_batch)
    confusion = all_reduce_sum(torch.bincount(t * classes + p, minlength=classes * classes).view(classes, classes))
    count = int(confusion.sum())
    if count == 0:
        raise ValueError(f"batches must hold at least one example, got {seen} empty batch(es)")
    # (A model of one class is always sure and always right: nothing to calibrate.)
    calibrated = None
    if classes > 1:
        confidence = torch.cat([torch.zeros(0), *confidences]).double()
        sums = _calibration_sums(confidence, p == t, classes=classes, bins=CALIBRATION_BINS)
        calibrated = _calibration_from_sums(all_reduce_sum(sums), classes=classes, bins=CALIBRATION_BINS)
    return ClassifierResult(
        loss=sum(per_batch.tolist()) / count,  # added in batch order, as one process adds them
        accuracy=int(confusion.trace()) / count,
        confusion=confusion,
        count=count,
        calibration=calibrated,
    )


def _unpack(batch: object, index: int) -> tuple[Tensor, Tensor | None, object]:
    """``(ids, mask, labels)`` of batch ``index``, or a ``ValueError``/``TypeError`` that names the batch."""
    if not isinstance(batch, (tuple, list)) or len(batch) != 3:
        got = f"a {type(batch).__name__} of {len(batch)} items" if isinstance(batch, (tuple, list)) else \
            type(batch).__name__
        raise ValueError(f"batches must yield (ids, mask, labels) triples (mask may be None: yield (ids, None, "
                         f"labels) for unpadded batches), batch {index} is {got}")
    ids, mask, labels = batch
    if not isinstance(ids, Tensor):
        raise TypeError(f"ids (batch {index}) must be a torch.Tensor of token ids, got {type(ids).__name__}")
    return ids, mask, labels


def _check_output(logprobs: object, target: Tensor, index: int, classes: int | None) -> None:
    """The model's output for one batch: ``(b, c)``, one row per label, the same ``c`` as the batches before."""
    b = target.numel()
    if not isinstance(logprobs, Tensor) or logprobs.dim() != 2 or logprobs.size(0) != b:
        shape = tuple(logprobs.shape) if isinstance(logprobs, Tensor) else type(logprobs).__name__
        raise ValueError(f"the model's output for batch {index} must have shape (b, c) = ({b}, c), one row of class "
                         f"log-probabilities per label, got {shape}")
    if logprobs.size(1) == 0 or (classes is not None and logprobs.size(1) != classes):
        raise ValueError(f"the model's output for batch {index} has {logprobs.size(1)} classes, expected "
                         f"{classes if classes is not None else 'at least 1'}")
    if not logprobs.is_floating_point():
        raise TypeError(f"the model's output for batch {index} must be floating point log-probabilities, got dtype "
                        f"{logprobs.dtype}")


def _check_logprobs(logprobs: Tensor) -> None:
    """Catch broken weights and logits instead of log-probabilities (on the first batch, as bits_per_byte does)."""
    if logprobs.isnan().any() or logprobs.isposinf().any():  # (-inf is a fine log-probability: an impossible class)
        raise ValueError("the model's output holds NaN or +inf log-probabilities: its weights are probably NaN or "
                         "infinite (did training diverge?)")
    drift = logprobs.float().logsumexp(-1).abs().max().item()
    if not drift <= 0.1:
        raise ValueError(
            "model must return class log-probabilities (e.g. log_softmax of the logits): their logsumexp over the "
            f"classes should be 0, got up to {drift:.3g} away from it"
        )
