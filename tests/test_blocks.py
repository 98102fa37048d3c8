"""Properties of torchformer.nn.blocks: causality, padding invariance, orderings, gradients, errors."""

import pytest
import torch

from torchformer import TransformerBlock


def block(**kwargs):
    torch.manual_seed(0)
    return TransformerBlock(16, 4, **kwargs).double()


@pytest.mark.parametrize("prenorm", [False, True])
@pytest.mark.parametrize("cross", [False, True])
def test_causal_block_never_looks_ahead(prenorm, cross):
    blk = block(causal=True, prenorm=prenorm, cross=cross)
    x, ctx = torch.randn(2, 6, 16).double(), torch.randn(2, 4, 16).double()
    out = blk(x, context=ctx if cross else None)
    changed = x.clone()
    changed[:, 3:] += 1.0
    torch.testing.assert_close(blk(changed, context=ctx if cross else None)[:, :3], out[:, :3])


@pytest.mark.parametrize("prenorm", [False, True])
def test_padding_does_not_change_real_positions(prenorm):
    blk = block(prenorm=prenorm)
    x = torch.randn(2, 5, 16).double()
    padded = torch.cat([x, torch.randn(2, 3, 16).double()], dim=1)
    mask = torch.tensor([[True] * 5 + [False] * 3] * 2)
    torch.testing.assert_close(blk(padded, mask)[:, :5], blk(x))


def test_postnorm_output_is_normalised_prenorm_is_residual():
    x = torch.randn(2, 5, 16).double()
    post = block()(x)
    torch.testing.assert_close(post.mean(-1), torch.zeros(2, 5).double(), atol=1e-10, rtol=0)
    pre = block(prenorm=True)
    with torch.no_grad():  # zero every sublayer's output projection: a pre-norm block is then the identity
        pre.attention.unifyheads.weight.zero_(), pre.attention.unifyheads.bias.zero_()
        pre.ff.net[-1].weight.zero_(), pre.ff.net[-1].bias.zero_()
    torch.testing.assert_close(pre(x), x)


@pytest.mark.parametrize("kwargs", [{}, {"prenorm": True}, {"cross": True}, {"wide": True, "activation": "gelu"}])
def test_every_parameter_gets_a_gradient(kwargs):
    blk = block(**kwargs)
    ctx = torch.randn(2, 4, 16).double() if kwargs.get("cross") else None
    blk(torch.randn(2, 5, 16).double(), context=ctx).pow(2).sum().backward()
    for name, p in blk.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_errors():
    with pytest.raises(ValueError, match="context must be given"):
        block(cross=True)(torch.randn(1, 2, 16).double())
    with pytest.raises(ValueError, match="no cross-attention"):
        block()(torch.randn(1, 2, 16).double(), context=torch.randn(1, 2, 16).double())
    with pytest.raises(ValueError, match="activation must be one of 'relu', 'gelu'; got 'tanh'"):
        TransformerBlock(16, 4, activation="tanh")
    with pytest.raises(ValueError, match="ff_mult must be a positive int"):
        TransformerBlock(16, 4, ff_mult=0)


def test_block_reports_dtype_mismatch_before_its_first_layer_norm():
    with pytest.raises(TypeError, match=r"x has dtype torch.float32 but the module's parameters are torch.float64"):
        block(prenorm=True)(torch.randn(1, 2, 16))
