"""Properties of torchformer.nn.heads: pooling over real tokens, weight tying, normalisation."""

import pytest
import torch

from torchformer import ClassifierHead, GeneratorHead


@pytest.mark.parametrize("pool", ["max", "mean", "first"])
def test_pooling_uses_real_tokens_only(pool):
    head = ClassifierHead(8, 3, pool).double()
    x = torch.randn(2, 4, 8).double()
    padded = torch.cat([x, 1000 * torch.randn(2, 5, 8).double()], dim=1)
    mask = torch.tensor([[True] * 4 + [False] * 5] * 2)
    torch.testing.assert_close(head(padded, mask), head(x))
    torch.testing.assert_close(head(x).exp().sum(-1), torch.ones(2).double())


def test_pooled_values():
    x = torch.tensor([[[1.0, -2.0], [3.0, 0.0], [9.0, 9.0]]])
    mask = torch.tensor([[True, True, False]])
    assert ClassifierHead(2, 2, "max").pooled(x, mask).tolist() == [[3.0, 0.0]]
    assert ClassifierHead(2, 2, "mean").pooled(x, mask).tolist() == [[2.0, -1.0]]
    assert ClassifierHead(2, 2, "first").pooled(x, mask).tolist() == [[1.0, -2.0]]
    empty = torch.tensor([[False, False, False]])
    assert ClassifierHead(2, 2, "max").pooled(x, empty).tolist() == [[0.0, 0.0]]
    assert ClassifierHead(2, 2, "mean").pooled(x, empty).tolist() == [[0.0, 0.0]]


def test_generator_head_tying_shares_the_embedding():
    emb = torch.nn.Embedding(11, 8)
    head = GeneratorHead(8, 11, tie_to=emb)
    assert head.toprobs.weight is emb.weight
    out = head(torch.randn(2, 3, 8))
    assert out.shape == (2, 3, 11)
    torch.testing.assert_close(out.exp().sum(-1), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"tie_to must be an embedding of shape.*\(11, 8\), got \(10, 8\)"):
        GeneratorHead(8, 11, tie_to=torch.nn.Embedding(10, 8))


def test_bad_pool():
    with pytest.raises(ValueError, match="pool must be one of 'max', 'mean', 'first'; got 'sum'"):
        ClassifierHead(8, 2, "sum")


@pytest.mark.parametrize("pool", ["max", "mean"])
def test_pooling_ignores_nan_and_inf_in_padding(pool):
    torch.manual_seed(0)
    head = ClassifierHead(8, 3, pool)
    x = torch.randn(2, 5, 8)
    mask = torch.tensor([[True, True, True, False, False], [True, False, True, True, False]])
    for garbage in (float("nan"), float("inf")):
        dirty = x.masked_fill(~mask[:, :, None], garbage)
        torch.testing.assert_close(head(dirty, mask), head(x, mask), atol=0, rtol=0)
