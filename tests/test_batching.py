import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchformer.data.batching import ClassificationBatches, bucket_batches, pad_batch


def test_pad_batch_shapes_mask_and_padding_value():
    seqs = [[5, 6, 7], [8], [9, 10]]
    ids, mask = pad_batch(seqs, pad=-1)
    assert ids.shape == mask.shape == (3, 3)
    assert ids.dtype == torch.int64 and mask.dtype == torch.bool
    assert mask.sum(1).tolist() == [3, 1, 2]
    assert ids.tolist() == [[5, 6, 7], [8, -1, -1], [9, 10, -1]]
    assert (ids[~mask] == -1).all()


@settings(max_examples=100, deadline=None)
@given(
    seqs=st.lists(st.lists(st.integers(1, 10**6), min_size=1, max_size=20), min_size=1, max_size=10),
    max_length=st.none() | st.integers(1, 25),
)
def test_pad_batch_keeps_truncated_prefixes(seqs, max_length):
    ids, mask = pad_batch(seqs, max_length=max_length)
    kept = [s if max_length is None else s[:max_length] for s in seqs]
    assert ids.shape == (len(seqs), max(map(len, kept)))
    assert mask.sum(1).tolist() == [len(s) for s in kept]
    for row, row_mask, s in zip(ids, mask, kept):
        assert row[row_mask].tolist() == s
        assert not row_mask[len(s):].any() and (row[len(s):] == 0).all()


def test_pad_batch_accepts_tensors_and_numpy_and_truncates():
    ids, mask = pad_batch([torch.tensor([1, 2, 3, 4]), np.array([5, 6]), (7,)], max_length=3)
    assert ids.tolist() == [[1, 2, 3], [5, 6, 0], [7, 0, 0]]
    assert mask.tolist() == [[True] * 3, [True, True, False], [True, False, False]]


def test_pad_batch_bad_inputs():
    with pytest.raises(ValueError, match=r"sequences\[1\] is empty"):
        pad_batch([[1], []])
    with pytest.raises(ValueError, match="at least one"):
        pad_batch([])
    with pytest.raises(ValueError, match="max_length must be a positive int, got 0"):
        pad_batch([[1]], max_length=0)
    with pytest.raises(TypeError, match="integer token ids"):
        pad_batch([[1.5, 2.0]])
    with pytest.raises(TypeError, match="pad"):
        pad_batch([[1]], pad=0.5)
    with pytest.raises(TypeError, match=r"sequences\[0\] must be a sequence of int token ids .* got str 'abc'"):
        pad_batch(["abc"])
    with pytest.raises(TypeError, match=r"sequences\[1\] must be a sequence of int token ids .* got int 7"):
        pad_batch([[1], 7])
    with pytest.raises(TypeError, match=r"integer token ids, got dtype torch.int64, shape \(1, 2\)"):
        pad_batch([[[1, 2]]])  # a batch of batches
    with pytest.raises(TypeError, match="sequences must hold integer token ids, got other values"):
        pad_batch([[1, "2"]])
    with pytest.raises(TypeError, match=r"sequences\[0\] must be 1-D, got shape \(1, 2\)"):
        pad_batch([torch.tensor([[1, 2]])])
    assert pad_batch([[1, 2, 3]], max_length=np.int64(2))[0].tolist() == [[1, 2]]  # NumPy ints are ints


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 500), max_size=300),
    batch_size=st.integers(1, 40),
    multiplier=st.integers(1, 10),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_bucket_batches_cover_every_index_once(lengths, batch_size, multiplier, shuffle, seed):
    g = torch.Generator().manual_seed(seed)
    batches = bucket_batches(
        lengths, batch_size, shuffle=shuffle, generator=g, bucket_size_multiplier=multiplier
    )
    flat = [i for batch in batches for i in batch]
    assert sorted(flat) == list(range(len(lengths)))
    assert len(batches) == math.ceil(len(lengths) / batch_size)
    sizes = sorted(len(b) for b in batches)
    assert all(s == batch_size for s in sizes[1:])  # at most one short batch
    assert all(len(b) >= 1 for b in batches)


def padding(lengths, batches):
    return sum(max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in batches)


def test_bucketing_cuts_padding_on_a_skewed_distribution():
    rng = np.random.default_rng(0)
    lengths = [int(x) + 1 for x in rng.lognormal(5, 0.8, size=2000)]  # IMDb-like long tail
    g = torch.Generator().manual_seed(0)
    bucketed = bucket_batches(lengths, 32, generator=g)
    random_batches = bucket_batches(lengths, 32, generator=g, bucket_size_multiplier=1)
    # multiplier=1 sorts only inside each batch: the same as random batching.
    assert padding(lengths, bucketed) < 0.2 * padding(lengths, random_batches)


def test_bucket_batches_are_reproducible_and_shuffled():
    lengths = list(range(200))
    a = bucket_batches(lengths, 8, generator=torch.Generator().manual_seed(1))
    b = bucket_batches(lengths, 8, generator=torch.Generator().manual_seed(1))
    c = bucket_batches(lengths, 8, generator=torch.Generator().manual_seed(2))
    assert a == b and a != c
    # Batch order is shuffled even when one bucket holds everything.
    firsts = [min(batch) for batch in a]
    assert firsts != sorted(firsts)
    # Without shuffling: deterministic and sorted by length inside each bucket.
    plain = bucket_batches(lengths[::-1], 8, shuffle=False, bucket_size_multiplier=5)
    assert plain == bucket_batches(lengths[::-1], 8, shuffle=False, bucket_size_multiplier=5)
    assert [i for b in plain[:5] for i in b] == list(range(39, -1, -1))


def test_bucket_batches_bad_arguments():
    with pytest.raises(ValueError, match="batch_size must be a positive int, got 0"):
        bucket_batches([1, 2], 0)
    with pytest.raises(ValueError, match="bucket_size_multiplier"):
        bucket_batches([1, 2], 2, bucket_size_multiplier=0)
    with pytest.raises(ValueError, match=r"lengths\[1\] must be a non-negative int, got -1"):
        bucket_batches([1, -1], 2)
    with pytest.raises(ValueError, match=r"lengths\[0\]"):
        bucket_batches([1.5], 2)
    assert bucket_batches([], 4) == []
    assert sorted(sum(bucket_batches(np.array([3, 1, 2]), 2), [])) == [0, 1, 2]


def test_classification_batches_epoch():
    encoded = [[i + 1] * (i % 7 + 1) for i in range(50)]
    labels = [i % 2 for i in range(50)]
    data = ClassificationBatches(
        encoded, labels, batch_size=8, max_length=5, generator=torch.Generator().manual_seed(0)
    )
    assert len(data) == 7
    seen = []
    batches = list(data)
    assert len(batches) == len(data)
    for ids, mask, y in batches:
        assert ids.shape == mask.shape and ids.shape[0] == y.shape[0] <= 8
        assert ids.shape[1] <= 5 and y.dtype == torch.int64
        for row, row_mask, label in zip(ids, mask, y):
            value = int(row[0])  # each sequence is its own index + 1, repeated
            seen.append(value - 1)
            assert row[row_mask].tolist() == encoded[value - 1][:5]
            assert int(label) == labels[value - 1]
    assert sorted(seen) == list(range(50))
    # A new iter() is a new epoch with a new order.
    assert [b[0].tolist() for b in data] != [b[0].tolist() for b in batches]


def test_classification_batches_reproducible_with_seeded_generator():
    encoded = [[1] * (i % 13 + 1) for i in range(100)]
    labels = [0] * 100

    def epoch(seed):
        data = ClassificationBatches(encoded, labels, batch_size=10, generator=torch.Generator().manual_seed(seed))
        return [m.sum(1).tolist() for _, m, _ in data]

    assert epoch(3) == epoch(3)
    assert epoch(3) != epoch(4)


def test_classification_batches_bad_arguments():
    with pytest.raises(ValueError, match="same length, got 2 and 1"):
        ClassificationBatches([[1], [2]], [0], batch_size=2)
    with pytest.raises(ValueError, match=r"encoded\[1\] is empty"):
        ClassificationBatches([[1], []], [0, 1], batch_size=2)
    with pytest.raises(ValueError, match="batch_size"):
        ClassificationBatches([[1]], [0], batch_size=0)
    with pytest.raises(ValueError, match="at least one"):
        ClassificationBatches([], [], batch_size=2)
    with pytest.raises(TypeError, match="labels"):
        ClassificationBatches([[1], [2]], [0.5, 1.0], batch_size=2)
    with pytest.raises(TypeError, match=r"labels must be a 1-D sequence of ints \(class numbers\), got str 'pos'"):
        ClassificationBatches([[1], [2]], ["pos", "neg"], batch_size=2)
    with pytest.raises(TypeError, match="got str '0' among them"):
        ClassificationBatches([[1], [2]], [1, "0"], batch_size=2)
    with pytest.raises(ValueError, match="labels must be class numbers >= 0, got -1"):
        ClassificationBatches([[1], [2]], [0, -1], batch_size=2)
    with pytest.raises(TypeError, match=r"sequences\[1\] must be a sequence of int token ids .* got str"):
        ClassificationBatches([[1], "great film"], [0, 1], batch_size=2)  # at once, not mid-epoch
    with pytest.raises(TypeError, match="shuffle must be a bool, got 'false'"):
        ClassificationBatches([[1], [2]], [0, 1], batch_size=2, shuffle="false")  # a non-empty str is truthy
    with pytest.raises(ValueError, match="device must be a torch.device or a name such as 'cpu', got 'bogus'"):
        ClassificationBatches([[1], [2]], [0, 1], batch_size=2, device="bogus")
    with pytest.raises(TypeError, match="pad must be an int token id, got 0.5"):
        ClassificationBatches([[1], [2]], [0, 1], batch_size=2, pad=0.5)
    assert len(ClassificationBatches([[1], [2]], [0, 1], batch_size=np.int64(1))) == 2


def test_classification_batches_check_labels_against_num_classes_before_the_first_batch():
    data = ClassificationBatches([[1], [2], [3]], [0, 1, 1], batch_size=2, num_classes=2)
    assert sorted(torch.cat([labels for _, _, labels in data]).tolist()) == [0, 1, 1]
    with pytest.raises(ValueError, match=r"labels must be class numbers in \[0, 2\) \(num_classes=2\), got 5 "
                                         r"\(1 label at or above 2, the first at index 1\)"):
        ClassificationBatches([[1], [2], [3]], [0, 5, 1], batch_size=2, num_classes=2)
    with pytest.raises(ValueError, match="num_classes must be a positive int, got 0"):
        ClassificationBatches([[1]], [0], batch_size=2, num_classes=0)
