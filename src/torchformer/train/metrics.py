"""Classification metrics: accuracy, the confusion matrix, and the loop that collects them over a data set.

Accuracy alone hides *how* a classifier fails. The confusion matrix counts, for every true class (row), how often
each class was predicted (column): the diagonal holds the correct answers, and an imbalance between the two
off-diagonal cells of a binary task shows a bias towards one class (e.g. calling mixed reviews negative).

:func:`evaluate_classifier` runs a model that returns class log-probabilities (as
:class:`~torchformer.models.CTransformer` does) over batches of ``(ids, mask, labels)`` (as
:class:`~torchformer.data.ClassificationBatches` yields) and returns the mean loss, the accuracy and the confusion
matrix in one pass.

Shapes: n number of examples, c number of classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from torchformer.train.training import autocast

__all__ = ["ClassifierResult", "accuracy", "confusion_matrix", "evaluate_classifier", "format_confusion_matrix"]


def _as_labels(x: object, name: str) -> Tensor:
    t = torch.as_tensor(x)
    if t.numel() == 0:
        t = t.long()  # torch.as_tensor([]) is float32; an empty list is still a list of labels
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool or t.dim() != 1:
        raise TypeError(f"{name} must be a 1-D sequence of int class ids, got dtype {t.dtype}, shape {tuple(t.shape)}")
    return t.long().cpu()


def _check_pair(predictions: object, targets: object) -> tuple[Tensor, Tensor]:
    p, t = _as_labels(predictions, "predictions"), _as_labels(targets, "targets")
    if p.shape != t.shape:
        raise ValueError(f"predictions and targets must have the same length, got {p.numel()} and {t.numel()}")
    if p.numel() == 0:
        raise ValueError("predictions must contain at least one example, got none")
    return p, t


def accuracy(predictions: Sequence[int] | Tensor, targets: Sequence[int] | Tensor) -> float:
    """The fraction of ``predictions`` ``(n,)`` equal to ``targets`` ``(n,)``, in [0, 1]."""
    p, t = _check_pair(predictions, targets)
    return (p == t).double().mean().item()


def confusion_matrix(
    predictions: Sequence[int] | Tensor, targets: Sequence[int] | Tensor, *, num_classes: int | None = None
) -> Tensor:
    """``(c, c)`` int64 counts: entry ``[i, j]`` is the number of examples of true class ``i`` predicted as ``j``.

    ``num_classes`` defaults to ``1 + the largest id seen``; give it so that a class that never occurs still gets
    its row and column. Rows sum to the class frequencies of ``targets``; the trace is the number correct.
    """
    p, t = _check_pair(predictions, targets)
    low = min(p.min().item(), t.min().item())
    high = max(p.max().item(), t.max().item())
    if num_classes is None:
        num_classes = high + 1
    elif isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
    if low < 0 or high >= num_classes:
        raise ValueError(f"class ids must be in [0, {num_classes}), got ids from {low} to {high}")
    # Each (true, predicted) pair becomes one flat index; counting those counts the cells.
    flat = torch.bincount(t * num_classes + p, minlength=num_classes * num_classes)
    return flat.view(num_classes, num_classes)


def format_confusion_matrix(matrix: Tensor, *, labels: Sequence[str] | None = None) -> str:
    """A plain-text table of a confusion matrix, rows = true class, columns = predicted class."""
    if not isinstance(matrix, Tensor) or matrix.dim() != 2 or matrix.size(0) != matrix.size(1):
        shape = tuple(matrix.shape) if isinstance(matrix, Tensor) else type(matrix).__name__
        raise ValueError(f"matrix must be a square (c, c) tensor, got {shape}")
    c = matrix.size(0)
    labels = [str(i) for i in range(c)] if labels is None else [str(label) for label in labels]
    if len(labels) != c:
        raise ValueError(f"labels must name all {c} classes, got {len(labels)}")
    cells = [[str(int(v)) for v in row] for row in matrix.tolist()]
    width = max(len(s) for s in [*labels, *(v for row in cells for v in row), "true \\ predicted"])
    lines = ["true \\ predicted".ljust(width) + "".join(f"  {label:>{width}}" for label in labels)]
    for label, row in zip(labels, cells):
        lines.append(f"{label:<{width}}" + "".join(f"  {v:>{width}}" for v in row))
    return "\n".join(lines)


@dataclass
class ClassifierResult:
    """What :func:`evaluate_classifier` measured: mean loss (nats), accuracy, ``(c, c)`` confusion, count."""

    loss: float
    accuracy: float
    confusion: Tensor
    count: int


@torch.no_grad()
def evaluate_classifier(
    model: nn.Module,
    batches: Iterable[tuple[Tensor, Tensor | None, Tensor]],
    *,
    num_classes: int | None = None,
    mixed_precision: bool = True,
) -> ClassifierResult:
    """Evaluate ``model`` on every ``(ids, mask, labels)`` batch; the model is put in eval mode and restored after.

    ``model(ids, mask)`` must return ``(b, c)`` log-probabilities. The loss is the mean negative log-likelihood
    per example (not per batch, so a smaller last batch weighs no more than its examples). With
    ``mixed_precision`` the forward pass runs under :func:`torchformer.train.training.autocast` (bf16 on CUDA only).
    """
    was_training = model.training
    model.eval()
    total_loss, predictions, targets = 0.0, [], []
    try:
        for ids, mask, labels in batches:
            with autocast(ids.device, enabled=mixed_precision):
                logprobs = model(ids, mask)
            total_loss += F.nll_loss(logprobs.float(), labels, reduction="sum").item()
            predictions.append(logprobs.argmax(dim=-1).cpu())
            targets.append(labels.cpu())
    finally:
        model.train(was_training)
    if not predictions:
        raise ValueError("batches must yield at least one batch, got none")
    p, t = torch.cat(predictions), torch.cat(targets)
    if num_classes is None:
        num_classes = logprobs.size(-1)
    return ClassifierResult(
        loss=total_loss / t.numel(),
        accuracy=accuracy(p, t),
        confusion=confusion_matrix(p, t, num_classes=num_classes),
        count=t.numel(),
    )
