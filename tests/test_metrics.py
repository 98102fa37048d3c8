"""Tests for torchformer.train.metrics: accuracy, confusion matrix, and the evaluation loop."""

from __future__ import annotations

import numpy as np
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


# ---------------------------------------------------------------------------------------------------------
# Hostile inputs: each error names the argument, what was expected and what was received


def test_a_normalised_matrix_prints_its_fractions():
    counts = torch.tensor([[3, 1], [1, 3]])
    text = format_confusion_matrix(counts / counts.sum(1, keepdim=True), labels=["neg", "pos"])
    assert [line.split()[1:] for line in text.splitlines()[1:]] == [["0.75", "0.25"], ["0.25", "0.75"]]
    assert format_confusion_matrix(torch.tensor([[50.0, 3.0], [7.0, 1234.0]])).splitlines()[1].split()[1:] == \
        ["50", "3"]  # whole numbers without decimals
    with pytest.raises(TypeError, match="labels must be a sequence of 2 class names, got str 'ab'"):
        format_confusion_matrix(counts, labels="ab")  # would be split into characters
    with pytest.raises(TypeError, match="matrix must hold real numbers"):
        format_confusion_matrix(torch.eye(2, dtype=torch.complex64))


def test_labels_that_are_no_int_ids_are_named():
    for bad in (["a"], None, "ab", [1, None], [2**70]):
        with pytest.raises(TypeError, match="predictions must be a 1-D sequence of int class ids"):
            accuracy(bad, [1])
    assert accuracy((i for i in [1, 2]), range(1, 3)) == 1.0  # any iterable
    assert confusion_matrix([0, 1], [1, 1], num_classes=np.int64(2)).tolist() == [[0, 0], [1, 1]]


def test_an_implausible_inferred_class_count_asks_for_num_classes():
    with pytest.raises(ValueError, match="largest class id is 1000000, so num_classes would default to 1000001 "
                                         ".*pass num_classes="):
        confusion_matrix([0, 10**6], [0, 1])
    with pytest.raises(ValueError, match="num_classes must be at most 32,768 .*got 1,000,000"):
        confusion_matrix([0, 1], [0, 1], num_classes=10**6)
    assert confusion_matrix([0, 9_999], [0, 1]).shape == (10_000, 10_000)  # up to the bound: inferred


class Logits(BagClassifier):
    """Forgets the log_softmax: returns logits."""

    def forward(self, ids, mask=None):
        return 3 * torch.exp(super().forward(ids, mask)) + 1


class Broken(BagClassifier):
    def forward(self, ids, mask=None):
        return super().forward(ids, mask) * float("nan")


class ThreeDimensional(BagClassifier):
    def forward(self, ids, mask=None):
        return super().forward(ids, mask)[:, None]


def classifier_batch(n: int = 4):
    torch.manual_seed(0)
    return torch.randint(1, 10, (n, 5)), None, torch.arange(n) % 3


def test_evaluate_classifier_checks_the_output_is_log_probabilities():
    with pytest.raises(ValueError, match="must return class log-probabilities .*logsumexp over the classes"):
        evaluate_classifier(Logits(), [classifier_batch()])
    with pytest.raises(ValueError, match="NaN or \\+inf log-probabilities.*did training diverge"):
        evaluate_classifier(Broken(), [classifier_batch()])
    with pytest.raises(ValueError, match=r"output for batch 0 must have shape \(b, c\) = \(4, c\).*got \(4, 1, 3\)"):
        evaluate_classifier(ThreeDimensional(), [classifier_batch()])


def test_evaluate_classifier_names_bad_batches():
    ids, mask, labels = classifier_batch()
    model = BagClassifier()
    for batch, error, message in [
        ((ids, labels), ValueError, r"\(ids, mask, labels\) triples .*yield \(ids, None, labels\).*batch 0 is a "
                                    r"tuple of 2 items"),
        (None, ValueError, "batch 0 is NoneType"),
        ((ids, mask, torch.tensor([0, 1, 3, 0])), ValueError,
         r"labels \(batch 0\) must be class ids in \[0, 3\) .*got ids from 0 to 3"),
        ((ids, mask, torch.tensor([0, 1, -100, 0])), ValueError, r"got ids from -100 to 1"),  # nll's ignore_index
        ((ids, mask, labels.float()), TypeError, r"labels \(batch 0\) must be a 1-D sequence of int class ids.*float"),
        ((ids, mask, labels[:3]), ValueError, r"labels \(batch 0\) must hold one class id per sequence of ids, 4, "
                                              r"got 3"),
        (([[1, 2]], mask, labels), TypeError, r"ids \(batch 0\) must be a torch.Tensor"),
    ]:
        with pytest.raises(error, match=message):
            evaluate_classifier(model, [batch])
        assert model.training  # restored, also after an error
    with pytest.raises(ValueError, match=r"batch 1 is a tuple of 2 items"):  # every batch is checked
        evaluate_classifier(model, [(ids, mask, labels), (ids, labels)])
    with pytest.raises(ValueError, match="at least one example, got 1 empty batch"):
        evaluate_classifier(model, [(ids[:0], None, labels[:0])])
    with pytest.raises(ValueError, match="num_classes is 5, but the model returns log-probabilities for 3 classes"):
        evaluate_classifier(model, [classifier_batch()], num_classes=5)
    with pytest.raises(TypeError, match="batches must be an iterable of .*got NoneType"):
        evaluate_classifier(model, None)
    with pytest.raises(TypeError, match="mixed_precision must be a bool, got str"):
        evaluate_classifier(model, [classifier_batch()], mixed_precision="no")
    assert evaluate_classifier(model, [(ids, mask, labels.tolist())]).count == 4  # a list of labels will do
