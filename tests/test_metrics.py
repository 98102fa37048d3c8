"""Tests for torchformer.train.metrics: accuracy, confusion matrix, calibration, and the evaluation loop."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from torchformer.train.metrics import (
    MAX_BINS, accuracy, calibration, confusion_matrix, evaluate_classifier, format_confusion_matrix,
)

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
    # The calibration of the same predictions, as calibration() computes it from the probabilities.
    expected = calibration(logprobs.exp(), labels)
    assert result.calibration.ece == pytest.approx(expected.ece, abs=1e-6)
    assert torch.equal(result.calibration.counts, expected.counts) and result.calibration.count == 7
    right = (result.calibration.counts * result.calibration.accuracy.nan_to_num()).sum().item()
    assert right / 7 == pytest.approx(result.accuracy)  # the bins' accuracies add up to the accuracy
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
    with pytest.raises(TypeError, match="mixed_precision must be a bool, got 'no'"):
        evaluate_classifier(model, [classifier_batch()], mixed_precision="no")
    assert evaluate_classifier(model, [(ids, mask, labels.tolist())]).count == 4  # a list of labels will do


# ---------------------------------------------------------------------------------------------------------
# Calibration: is the model right as often as it is sure?


def test_calibration_of_a_hand_computed_example():
    # Two classes, so 5 bins of width 0.1 over [0.5, 1]. Each row's confidence (its larger probability), whether the
    # likelier class is the target, and its bin:
    #   0.55 right -> bin 0;  0.65 wrong -> bin 1;  0.85 right -> bin 3;  0.95 right, 0.97 wrong, 0.99 right -> bin 4
    probabilities = torch.tensor([[0.55, 0.45], [0.35, 0.65], [0.05, 0.95], [0.97, 0.03], [0.15, 0.85],
                                  [0.99, 0.01]], dtype=torch.float64)
    cal = calibration(probabilities, [0, 0, 1, 1, 1, 0], bins=5)
    assert cal.edges.tolist() == [0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    assert cal.counts.tolist() == [1, 1, 0, 1, 3]
    nan = math.nan
    torch.testing.assert_close(cal.confidence, torch.tensor([0.55, 0.65, nan, 0.85, 0.97], dtype=torch.float64),
                               equal_nan=True)
    torch.testing.assert_close(cal.accuracy, torch.tensor([1, 0, nan, 1, 2 / 3], dtype=torch.float64),
                               equal_nan=True)
    # ECE = 1/6 |1 - 0.55| + 1/6 |0 - 0.65| + 1/6 |1 - 0.85| + 3/6 |2/3 - 0.97| = (0.45 + 0.65 + 0.15 + 0.91) / 6
    assert cal.ece == pytest.approx(0.36, abs=1e-12)
    assert cal.mean_confidence_right == pytest.approx((0.55 + 0.95 + 0.85 + 0.99) / 4)
    assert cal.mean_confidence_wrong == pytest.approx((0.65 + 0.97) / 2)
    assert cal.count == 6
    as_json = json.loads(json.dumps(cal.to_dict()))  # plain numbers; an empty bin's figures are null, not NaN
    assert as_json["bins"][2] == {"from": 0.7, "to": 0.8, "count": 0, "confidence": None, "accuracy": None}
    assert as_json["bins"][4]["count"] == 3 and as_json["ece"] == pytest.approx(0.36)


def test_calibration_bins_start_at_one_over_c():
    # Three classes: 2 bins over [1/3, 1]. A confidence of exactly 1 is in the last bin, one a rounding error
    # below 1/3 in the first.
    cal = calibration(torch.tensor([[0.34, 0.33, 0.33], [0.1, 0.1, 0.8], [0.0, 1.0, 0.0]]), [2, 2, 0], bins=2)
    torch.testing.assert_close(cal.edges, torch.tensor([1 / 3, 2 / 3, 1], dtype=torch.float64))
    assert cal.counts.tolist() == [1, 2] and cal.accuracy.tolist() == [0.0, 0.5]
    assert cal.ece == pytest.approx(1 / 3 * 0.34 + 2 / 3 * abs(0.5 - 0.9), abs=1e-6)
    assert calibration(torch.tensor([[0.333, 0.333, 0.332]]), [0], bins=2).counts.tolist() == [1, 0]
    assert math.isnan(calibration(torch.tensor([[0.9, 0.1]]), [0]).mean_confidence_wrong)  # no wrong answers
    assert calibration(torch.tensor([[0.9, 0.1]]), [0], bins=1).counts.tolist() == [1]


def loop_calibration(probabilities: list[list[float]], targets: list[int], bins: int) -> dict:
    """The same figures one example at a time, from the formula: the reference for calibration()."""
    n, c = len(probabilities), len(probabilities[0])
    low, width = 1 / c, (1 - 1 / c) / bins
    members = [[] for _ in range(bins)]  # (confidence, right) of the examples in each bin
    for row, target in zip(probabilities, targets):
        confidence = max(row)
        k = min(bins - 1, max(0, math.floor((confidence - low) / width)))
        members[k].append((confidence, row.index(confidence) == target))
    ece = sum(len(m) / n * abs(sum(r for _, r in m) / len(m) - sum(x for x, _ in m) / len(m)) for m in members if m)
    right = [x for m in members for x, r in m if r]
    wrong = [x for m in members for x, r in m if not r]
    return {"ece": ece, "counts": [len(m) for m in members], "right": sum(right) / len(right),
            "wrong": sum(wrong) / len(wrong)}


@pytest.mark.parametrize("c, bins", [(2, 10), (2, 1), (3, 4), (5, 15)])
def test_calibration_matches_a_loop_over_the_examples(c, bins):
    generator = torch.Generator().manual_seed(c * 100 + bins)
    probabilities = (3 * torch.randn(300, c, generator=generator, dtype=torch.float64)).softmax(-1)
    targets = torch.randint(0, c, (300,), generator=generator)
    cal = calibration(probabilities, targets, bins=bins)
    reference = loop_calibration(probabilities.tolist(), targets.tolist(), bins)
    assert cal.ece == pytest.approx(reference["ece"], abs=1e-12)
    assert cal.counts.tolist() == reference["counts"]
    assert cal.mean_confidence_right == pytest.approx(reference["right"])
    assert cal.mean_confidence_wrong == pytest.approx(reference["wrong"])
    # The ECE is at least the gap between overall accuracy and overall confidence (a triangle inequality), at most 1.
    confidence, predicted = probabilities.max(-1)
    gap = abs((predicted == targets).double().mean() - confidence.mean()).item()
    assert gap - 1e-12 <= cal.ece <= 1


def test_calibration_names_bad_inputs():
    good = torch.tensor([[0.9, 0.1], [0.2, 0.8]])
    for args, error, message in [
        (([[0.9, 0.1]], [0]), TypeError, r"probabilities must be a \(n, c\) torch.Tensor .*got list"),
        ((torch.tensor([[1, 0]]), [0]), TypeError, "probabilities must be floating point, got dtype torch.int64"),
        ((torch.tensor([0.9, 0.1]), [0]), ValueError, r"shape \(n, c\) with n >= 1 examples and c >= 2 .*got \(2,\)"),
        ((torch.ones(3, 1), [0, 0, 0]), ValueError, r"c >= 2 classes, got \(3, 1\)"),
        ((torch.zeros(0, 2), []), ValueError, r"n >= 1 examples .*got \(0, 2\)"),
        ((good.log(), [0, 1]), ValueError, r"must be in \[0, 1\], got values .*log-probabilities\? pass .exp\(\)"),
        ((torch.tensor([[0.5, math.nan]]), [0]), ValueError, r"must be in \[0, 1\]"),
        ((torch.tensor([[0.9, 0.1], [0.5, 0.6]]), [0, 0]), ValueError, "each row must sum to 1 .*row 1 summing to 1.1"),
        ((good, [0]), ValueError, "targets must hold one class id per row of probabilities, 2, got 1"),
        ((good, [0, 2]), ValueError, r"targets must be class ids in \[0, 2\), got ids from 0 to 2"),
        ((good, [0.0, 1.0]), TypeError, "targets must be a 1-D sequence of int class ids"),
    ]:
        with pytest.raises(error, match=message):
            calibration(*args)
    for bins in (0, -1, True, 2.5, "10", MAX_BINS + 1):
        with pytest.raises(ValueError, match=rf"bins must be an int in \[1, {MAX_BINS:,}\], got {bins!r}"):
            calibration(good, [0, 1], bins=bins)
