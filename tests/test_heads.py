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


@pytest.mark.parametrize("pool", ["first", "mean"])
def test_the_pooler_is_berts_dense_layer_and_tanh_before_the_classes(pool):
    """With ``pooler=True``: log_softmax(W_c tanh(W_p p + b_p) + b_c) for the pooled vector p; dropout on the
    pooler's output in training only; without it, the head has no pooler parameters at all."""
    torch.manual_seed(0)
    head = ClassifierHead(8, 3, pool, pooler=True, dropout=0.5).double().eval()
    x, mask = torch.randn(2, 5, 8).double(), torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    p = x[:, 0] if pool == "first" else torch.stack([x[0].mean(0), x[1, :3].mean(0)])  # (b, e), written out
    pooled = torch.tanh(p @ head.pooler.weight.T + head.pooler.bias)  # (b, e)
    logits = pooled @ head.toprobs.weight.T + head.toprobs.bias  # (b, c)
    torch.testing.assert_close(head(x, mask), torch.log_softmax(logits, dim=-1))
    head.train()
    torch.manual_seed(1)
    dropped = head(x, mask)
    torch.manual_seed(1)
    kept = torch.nn.functional.dropout(pooled, 0.5, training=True)  # the same draw: dropout on the pooler's output
    torch.testing.assert_close(dropped, torch.log_softmax(kept @ head.toprobs.weight.T + head.toprobs.bias, dim=-1))
    plain = ClassifierHead(8, 3, pool)
    assert plain.pooler is None and plain.dropout is None
    assert [name for name, _ in plain.named_parameters()] == ["toprobs.weight", "toprobs.bias"]  # as before
    with pytest.raises(ValueError, match="dropout=0.1 drops the pooler's output, but pooler is False"):
        ClassifierHead(8, 3, pool, dropout=0.1)
    with pytest.raises(TypeError, match="pooler must be a bool"):
        ClassifierHead(8, 3, pool, pooler=1)


def test_logit_cap_is_the_soft_cap_formula_and_bounds_every_logit():
    torch.manual_seed(0)
    head, x = GeneratorHead(8, 11, cap=2.0), torch.randn(3, 5, 8) * 10  # large inputs: logits far beyond the cap
    z = head.toprobs(x)
    assert z.abs().max() > 4.0
    out = head(x)
    assert torch.allclose(out, torch.log_softmax(2.0 * torch.tanh(z / 2.0), dim=-1), atol=1e-6)
    assert ((out.max(-1).values - out.min(-1).values) < 4.0).all()  # capped logits lie in (-2, 2)
    plain = GeneratorHead(8, 11)
    plain.load_state_dict(head.state_dict())
    assert torch.allclose(plain(x), torch.log_softmax(z, dim=-1), atol=1e-6)
    loose = GeneratorHead(8, 11, cap=1e4)  # tanh is the identity near zero: a cap far above the logits does nothing
    loose.load_state_dict(head.state_dict())
    assert torch.allclose(loose(x), plain(x), atol=1e-5)
    for bad in (0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="cap"):
            GeneratorHead(8, 11, cap=bad)


def test_logit_cap_reaches_the_generators_and_is_refused_by_the_other_models():
    from torchformer import CTransformer, GTransformer, Seq2SeqTransformer, TransformerConfig

    assert GTransformer(8, 2, 1, 6, 11, logit_cap=30).head.cap == 30.0
    assert Seq2SeqTransformer(8, 2, 1, 6, 11, 13, logit_cap=15).head.cap == 15.0
    assert TransformerConfig.from_dict(TransformerConfig(8, 2, logit_cap=30).to_dict()).logit_cap == 30.0
    with pytest.raises(ValueError, match="CTransformer does not use logit_cap=30"):
        CTransformer(8, 2, 1, 6, 11, 2, logit_cap=30)
    with pytest.raises(ValueError, match="logit_cap"):
        TransformerConfig(8, 2, logit_cap=0.0)
