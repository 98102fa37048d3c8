"""Tests for torchformer.train.metrics: accuracy, confusion matrix, and the evaluation loop."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from torchformer.train.metrics import accuracy, confusion_matrix, evaluate_classifier, format_confusion_matrix

pairs = st.integers(1, 4).flatmap(
    lambda c: st.lists(st.tuples(st.integers(0, c - 1), st.integers(0, c - 1)), min_size=1, max_size=60).map(
        lambda rows: (c, [p for p, _ in rows], [t for _, t in rows])
    )
)


@given(pairs)
@settings(max_examples=60, deadline=None)
def test_confusion_matrix_counts_every_pair(case):
    c, predictions, targets = case
    m = confusion_matrix(predictions, targets, num_classes=c)
    assert m.shape == (c, c) and m.dtype == torch.int64
    for i in range(c):
        for j in range(c):
            assert m[i, j] == sum(1 for p, t in zip(predictions, targets) if t == i and p == j)
    assert m.sum(dim=1).tolist() == [targets.count(i) for i in range(c)]  # rows: true classes
    assert m.sum(dim=0).tolist() == [predictions.count(j) for j in range(c)]  # columns: predictions
    assert m.trace() / len(targets) == pytest.approx(accuracy(predictions, targets))


def test_accuracy_and_default_num_classes():
    assert accuracy(torch.tensor([1, 0, 1, 1]), torch.tensor([1, 1, 1, 0])) == 0.5
    assert confusion_matrix([0, 2], [0, 0]).tolist() == [[1, 0, 1], [0, 0, 0], [0, 0, 0]]


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="same length"):
        accuracy([0, 1], [0])
    with pytest.raises(ValueError, match="at least one"):
        accuracy([], [])
    with pytest.raises(TypeError, match="predictions"):
        accuracy([0.5, 1.0], [0, 1])
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        confusion_matrix([0, 2], [0, 1], num_classes=2)
    with pytest.raises(ValueError, match="num_classes"):
        confusion_matrix([0], [0], num_classes=0)
    with pytest.raises(ValueError, match="labels"):
        format_confusion_matrix(torch.eye(2, dtype=torch.long), labels=["only one"])


def test_format_confusion_matrix_lays_out_rows_as_true_classes():
    text = format_confusion_matrix(torch.tensor([[50, 3], [7, 1234]]), labels=["neg", "pos"])
    header, neg, pos = text.splitlines()
    assert "neg" in header and "pos" in header
    assert neg.split()[1:] == ["50", "3"] and pos.split()[1:] == ["7", "1234"]


class BagClassifier(nn.Module):
    """Mean of token embeddings over real tokens -> class log-probabilities; deterministic given its weights."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 3)

    def forward(self, ids, mask=None):
        mask = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask
        pooled = (self.emb(ids) * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        return torch.log_softmax(pooled, dim=-1)


def test_evaluate_classifier_matches_a_manual_computation():
    torch.manual_seed(0)
    model = BagClassifier().train()
    ids = torch.randint(1, 10, (7, 5))
    mask = torch.arange(5) < torch.tensor([5, 3, 1, 4, 5, 2, 2])[:, None]
    labels = torch.tensor([0, 1, 2, 2, 1, 0, 1])
    # Uneven batches (4 + 2 + 1): the mean loss must weigh examples, not batches.
    batches = [(ids[a:b], mask[a:b], labels[a:b]) for a, b in ((0, 4), (4, 6), (6, 7))]
    result = evaluate_classifier(model, batches)
    with torch.no_grad():
        logprobs = model(ids, mask)
    predictions = logprobs.argmax(-1)
    assert result.count == 7
    assert result.loss == pytest.approx(nn.functional.nll_loss(logprobs, labels).item(), rel=1e-6)
    assert result.accuracy == pytest.approx((predictions == labels).float().mean().item())
    assert torch.equal(result.confusion, confusion_matrix(predictions, labels, num_classes=3))
    assert model.training  # the model's mode is restored
    with pytest.raises(ValueError, match="at least one batch"):
        evaluate_classifier(model, [])
