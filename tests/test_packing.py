"""torchformer.data.packing: every token placed once, whole documents per row, pieces only when asked, the tensors
of a packed batch, and less padding than padding each document to its batch's longest."""

from __future__ import annotations

import math
import random

import pytest
import torch

import torch.nn.functional as F

from torchformer.data.batching import ClassificationBatches, bucket_batches, bucketed_padding
from torchformer.data.packing import (
    IGNORE, PackedBatches, Piece, pack, packed_batch, packed_labels, padding_fraction,
)


def placed(rows):
    """{document: sorted list of (start, end)} over every piece of every row."""
    out: dict[int, list[tuple[int, int]]] = {}
    for row in rows:
        for piece in row:
            out.setdefault(piece.document, []).append((piece.start, piece.end))
    return {d: sorted(spans) for d, spans in out.items()}


@pytest.mark.parametrize("seed", range(5))
def test_every_token_is_placed_once_and_whole_documents_stay_in_one_row(seed):
    rng = random.Random(seed)
    lengths = [rng.randint(1, 64) for _ in range(300)]
    rows = pack(lengths, 64)
    assert placed(rows) == {d: [(0, n)] for d, n in enumerate(lengths)}  # each document once, whole
    assert all(sum(p.end - p.start for p in row) <= 64 for row in rows)
    assert len(rows) >= math.ceil(sum(lengths) / 64)  # no packing beats the total
    # Best fit leaves at most one row less than half full (two such rows would have been merged).
    assert sum(sum(p.end - p.start for p in row) <= 32 for row in rows) <= 1


def test_a_packing_with_a_perfect_fit_finds_it():
    rows = pack([6, 4, 5, 5, 3, 7], 10)
    assert len(rows) == 3 and padding_fraction(rows, 10) == 0.0
    assert sorted(sorted(p.document for p in row) for row in rows) == [[0, 1], [2, 3], [4, 5]]


def test_a_long_document_is_refused_or_cut_only_when_asked():
    with pytest.raises(ValueError, match="document 1 has 25 tokens, more than row_length=10: pass split_long=True"):
        pack([3, 25], 10)
    rows = pack([3, 25], 10, split_long=True)
    assert placed(rows) == {0: [(0, 3)], 1: [(0, 10), (10, 20), (20, 25)]}
    assert sum(len(row) for row in rows) == 4  # the pieces are packed as documents of their own


def test_the_arguments_are_checked():
    with pytest.raises(ValueError, match="row_length must be a positive int, got 0"):
        pack([1], 0)
    with pytest.raises(ValueError, match=r"lengths\[1\] must be a positive int, got 0"):
        pack([1, 0], 4)
    with pytest.raises(TypeError, match="split_long must be a bool"):
        pack([1], 4, split_long="yes")


def test_a_packed_batch_holds_each_document_in_order_with_its_index_and_the_padding_after():
    sequences = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]]
    rows = [[Piece(2, 0, 4), Piece(1, 0, 2)], [Piece(0, 0, 3), Piece(3, 0, 1)]]
    ids, documents, mask = packed_batch(sequences, rows, 8, pad=-1)
    assert ids.tolist() == [[6, 7, 8, 9, 4, 5, -1, -1], [1, 2, 3, 10, -1, -1, -1, -1]]
    assert documents.tolist() == [[0, 0, 0, 0, 1, 1, 2, 2], [0, 0, 0, 1, 2, 2, 2, 2]]
    assert mask.tolist() == [[True] * 6 + [False] * 2, [True] * 4 + [False] * 4]
    assert (documents[:, 1:] >= documents[:, :-1]).all()
    ids, documents, mask = packed_batch([torch.tensor([5, 6, 7])], [[Piece(0, 1, 3)]], 2)  # a piece, full row
    assert ids.tolist() == [[6, 7]] and documents.tolist() == [[0, 0]] and mask.all()


def test_a_packed_batch_refuses_rows_that_do_not_fit():
    with pytest.raises(ValueError, match="rows must hold at least one row"):
        packed_batch([[1]], [], 4)
    with pytest.raises(ValueError, match=r"rows\[0\] is empty"):
        packed_batch([[1]], [[]], 4)
    with pytest.raises(ValueError, match=r"rows\[0\]\[0\] takes tokens 0..2 of document 0, which has 1"):
        packed_batch([[1]], [[Piece(0, 0, 3)]], 4)
    with pytest.raises(ValueError, match=r"rows\[0\] holds more than row_length=2 tokens"):
        packed_batch([[1, 2], [3]], [[Piece(0, 0, 2), Piece(1, 0, 1)]], 2)
    with pytest.raises(TypeError, match="pad must be an int"):
        packed_batch([[1]], [[Piece(0, 0, 1)]], 4, pad=0.5)


def test_packing_leaves_less_padding_than_length_bucketed_batches():
    # Review-like lengths (a long tail): bucketing pads each batch to its longest; packing fills rows of 512.
    rng = random.Random(0)
    lengths = [min(512, int(rng.lognormvariate(5.0, 0.7)) + 1) for _ in range(2000)]
    batches = bucket_batches(lengths, 16, generator=torch.Generator().manual_seed(0))
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches)  # every batch padded to its longest
    bucketed = 1 - sum(lengths) / padded
    assert bucketed_padding(lengths, 16, generator=torch.Generator().manual_seed(0)) == pytest.approx(bucketed)
    packed = padding_fraction(pack(lengths, 512), 512)
    assert packed < 0.01 < bucketed  # best fit on 2,000 documents leaves well under 1 % empty


def test_an_epoch_of_packed_batches_holds_every_token_once_in_a_reproducible_order():
    from torchformer.data.packing import PackedBatches

    rng = random.Random(1)
    encoded = [[rng.randint(1, 99) for _ in range(rng.randint(1, 20))] for _ in range(60)]
    data = PackedBatches(encoded, row_length=32, batch_size=4, generator=torch.Generator().manual_seed(0))
    epochs = [list(data), list(data)]
    for epoch in epochs:
        tokens = sorted(t for ids, _, mask in epoch for t in ids[mask].tolist())
        assert tokens == sorted(t for d in encoded for t in d)
        assert sum(ids.size(0) for ids, _, _ in epoch) == len(data.rows) and len(epoch) == len(data)
    assert not all(torch.equal(a[0], b[0]) for a, b in zip(*epochs))  # a new order each epoch
    again = PackedBatches(encoded, row_length=32, batch_size=4, generator=torch.Generator().manual_seed(0))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(epochs[0], list(again)))  # the same seed, the same epoch
    assert 0 <= data.padding < 0.05


def test_lengths_of_numpy_or_torch_integers_are_lengths_and_rows_too_long_for_a_fraction_are_refused():
    import numpy as np

    assert pack(list(np.array([2, 3])), 5) == pack([2, 3], 5) == pack(list(torch.tensor([2, 3])), 5)
    with pytest.raises(ValueError, match=r"rows\[0\] holds 8 tokens, more than row_length=2"):
        padding_fraction(pack([4, 4], 8), 2)
    from torchformer.data.packing import PackedBatches

    with pytest.raises(TypeError, match="generator must be a torch.Generator or None, got int"):
        PackedBatches([[1]], row_length=2, batch_size=1, generator=3)


def test_labels_sit_where_the_classifier_puts_each_documents_prediction():
    encoded = [[5, 6, 7], [8], [9, 9], [4, 4, 4, 4, 4]]
    rows = pack([len(d) for d in encoded], 4, split_long=True)  # document 3 cut into pieces of 4 and 1 tokens
    targets = packed_labels(torch.tensor([1, 0, 2, 1]), rows, 4)
    for r, row in enumerate(rows):  # [r, d]: the class of row r's d-th piece; IGNORE past the last piece
        assert targets[r].tolist() == [[1, 0, 2, 1][piece.document] for piece in row] + [IGNORE] * (4 - len(row))
    data = PackedBatches(encoded, labels=[1, 0, 2, 1], num_classes=3, row_length=4, batch_size=3, split_long=True,
                         shuffle=False)
    (ids, documents, mask, labels), = list(data)
    assert torch.equal(labels, targets) and labels.dtype == torch.int64
    assert torch.equal(ids, packed_batch(encoded, data.rows, 4)[0])  # the same rows as without labels
    assert len(next(iter(PackedBatches(encoded, row_length=4, batch_size=3, split_long=True)))) == 3


def test_labels_are_checked_as_a_classification_batches_labels_are():
    with pytest.raises(ValueError, match="one class per document, got 1 for 2 documents"):
        PackedBatches([[1], [2]], labels=[0], row_length=2, batch_size=1)
    with pytest.raises(ValueError, match=r"labels must be class numbers in \[0, 2\)"):
        PackedBatches([[1], [2]], labels=[0, 2], num_classes=2, row_length=2, batch_size=1)
    with pytest.raises(TypeError, match="labels must be a 1-D sequence of ints"):
        PackedBatches([[1], [2]], labels=["pos", "neg"], row_length=2, batch_size=1)
    with pytest.raises(ValueError, match=r"rows\[0\] has 3 pieces, more than row_length=2"):
        packed_labels(torch.tensor([0, 1, 0]), [[Piece(0, 0, 1), Piece(1, 0, 1), Piece(2, 0, 1)]], 2)
    with pytest.raises(ValueError, match="lengths must hold at least one length"):
        bucketed_padding([], 4)


def test_a_packed_classifier_step_has_the_gradient_of_the_reviews_mean_loss_padded():
    # The loss IMDb training uses on packed rows (summed over the documents' places, divided by the number of
    # documents) has the gradient of the mean loss over the same reviews batched with padding.
    from torchformer.models import CTransformer

    rng = random.Random(3)
    encoded = [[rng.randint(1, 30) for _ in range(rng.randint(1, 12))] for _ in range(9)]
    labels = [rng.randint(0, 2) for _ in encoded]
    torch.manual_seed(0)
    model = CTransformer(16, 4, 2, 16, 31, 3, positions="rotary").double()  # dropout 0: train mode is exact

    def gradients(loss):
        model.zero_grad()
        loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    ids, documents, mask, targets = next(iter(PackedBatches(encoded, labels=labels, row_length=16, batch_size=9)))
    assert ids.size(0) < len(encoded)  # several reviews share rows
    logp = model(ids, mask, documents=documents)  # (b, t, c)
    packed = F.nll_loss(logp.flatten(0, 1), targets.flatten(), reduction="sum") / (targets != IGNORE).sum()
    ids, mask, y = next(iter(ClassificationBatches(encoded, labels, batch_size=9, shuffle=False)))
    padded = F.nll_loss(model(ids, mask), y)
    torch.testing.assert_close(packed, padded, rtol=1e-12, atol=1e-12)
    for a, b in zip(gradients(packed), gradients(padded)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_pairs_sit_at_the_same_place_of_their_source_and_target_rows():
    from torchformer.data.packing import pack_pairs

    rng = random.Random(2)
    src = [rng.randint(1, 9) for _ in range(40)]
    tgt = [rng.randint(1, 9) for _ in range(40)]
    src_rows, tgt_rows = pack_pairs(src, tgt, 12)
    assert sorted(p.document for row in src_rows for p in row) == list(range(40))  # every pair once
    for s_row, t_row in zip(src_rows, tgt_rows):
        assert [p.document for p in s_row] == [p.document for p in t_row]
        assert [p.end for p in s_row] == [src[p.document] for p in s_row] and all(p.start == 0 for p in s_row)
        assert sum(p.end for p in s_row) <= 12 and sum(p.end for p in t_row) <= 12
    with pytest.raises(ValueError, match="one length per pair, got 2 and 1"):
        pack_pairs([1, 2], [1], 4)
    with pytest.raises(ValueError, match="more than row_length=4"):
        pack_pairs([1, 2], [1, 5], 4)
    with pytest.raises(ValueError, match=r"tgt_lengths\[0\] must be a positive int"):
        pack_pairs([1], [0], 4)
