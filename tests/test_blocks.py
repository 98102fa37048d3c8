"""Properties of torchformer.nn.blocks: causality, padding invariance, orderings, gradients, errors."""

import pytest
import torch

from torchformer import DecoderBlock, TransformerBlock, TransformerConfig


def config(**kwargs):
    return TransformerConfig(16, 4, **kwargs)


def block(*, causal=False, cross=False, **kwargs):
    torch.manual_seed(0)
    if cross:
        return DecoderBlock(config(**kwargs)).double()
    return TransformerBlock(config(**kwargs), causal=causal).double()


def run(blk, x, ctx, mask=None):
    return blk(x, ctx, mask) if isinstance(blk, DecoderBlock) else blk(x, mask)


@pytest.mark.parametrize("prenorm", [False, True])
@pytest.mark.parametrize("cross", [False, True])
def test_causal_block_never_looks_ahead(prenorm, cross):
    blk = block(causal=True, prenorm=prenorm, cross=cross)
    x, ctx = torch.randn(2, 6, 16).double(), torch.randn(2, 4, 16).double()
    out = run(blk, x, ctx)
    changed = x.clone()
    changed[:, 3:] += 1.0
    torch.testing.assert_close(run(blk, changed, ctx)[:, :3], out[:, :3])
    assert not torch.allclose(run(blk, changed, ctx)[:, 3:], out[:, 3:])  # ... while later positions do change


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
    run(blk, torch.randn(2, 5, 16).double(), torch.randn(2, 4, 16).double()).pow(2).sum().backward()
    for name, p in blk.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_a_subclass_swaps_a_part_by_naming_its_class():
    class Doubled(torch.nn.Module):
        def __init__(self, emb):
            super().__init__()
            self.linear = torch.nn.Linear(emb, emb)

        @classmethod
        def from_config(cls, config, *, layer=0):
            return cls(config.emb)

        def forward(self, x, mask=None):  # a block passes every feed-forward network the padding mask
            return 2 * self.linear(x)

    class MyBlock(TransformerBlock):
        feedforward_classes = {**TransformerBlock.feedforward_classes, "relu": Doubled}

    blk = MyBlock(config(), causal=True)
    assert isinstance(blk.ff, Doubled) and blk.attention.causal
    assert blk(torch.randn(1, 3, 16)).shape == (1, 3, 16)


def test_errors():
    with pytest.raises(ValueError, match="activation must be one of 'relu', 'gelu', 'gelu_tanh', 'relu2', 'swiglu', 'geglu', 'geglu_tanh'; got"):
        config(activation="tanh")
    with pytest.raises(ValueError, match="ff_mult must be a positive int"):
        config(ff_mult=0)
    with pytest.raises(TypeError, match="cross"):
        TransformerBlock(config(), cross=True)  # a block with cross-attention is a DecoderBlock


@pytest.mark.parametrize("prenorm", [False, True])
@pytest.mark.parametrize("decoder", [False, True])
def test_nan_and_inf_padding_reach_no_real_output_nor_any_gradient(prenorm, decoder):
    """Padded rows holding NaN or inf: the real outputs and every gradient equal those of running each sequence
    alone, unpadded. (Attention ignored the padded rows, but the norms and the feed-forward network ran on them,
    and their weight gradients summed 0 * NaN.)"""
    torch.manual_seed(0)
    block = (DecoderBlock if decoder else TransformerBlock)(TransformerConfig(16, 2, prenorm=prenorm))
    context = torch.randn(2, 4, 16)
    lengths = [3, 4]
    x = torch.randn(2, 5, 16)
    x[0, 3:] = float("nan")
    x[1, 4] = float("inf")
    mask = torch.arange(5) < torch.tensor(lengths)[:, None]
    x.requires_grad_(True)
    y = block(x, context, mask) if decoder else block(x, mask)
    y[mask].sum().backward()
    padded_grads = {name: p.grad.clone() for name, p in block.named_parameters()}

    block.zero_grad()
    for i, n in enumerate(lengths):  # each sequence alone, with no padding at all
        xi = x.detach()[i:i + 1, :n].clone().requires_grad_(True)
        yi = block(xi, context[i:i + 1]) if decoder else block(xi)
        torch.testing.assert_close(y[i, :n], yi[0], rtol=1e-5, atol=1e-6)
        yi.sum().backward()
        torch.testing.assert_close(x.grad[i, :n], xi.grad[0], rtol=1e-5, atol=1e-6)
    assert torch.equal(x.grad[~mask], torch.zeros_like(x.grad[~mask]))  # padding gets no gradient
    for name, p in block.named_parameters():
        torch.testing.assert_close(padded_grads[name], p.grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("activation", ["relu", "swiglu"])
def test_zero_init_residual_starts_every_pre_norm_block_as_the_identity(activation):
    options = dict(prenorm=True, activation=activation, zero_init_residual=True)
    torch.manual_seed(0)
    encoder, decoder = TransformerBlock(config(**options), causal=True), DecoderBlock(config(**options))
    x, ctx = torch.randn(2, 5, 16), torch.randn(2, 3, 16)
    assert torch.equal(encoder(x), x) and torch.equal(run(decoder, x, ctx), x)  # every branch adds exactly 0
    outputs = [encoder.attention.unifyheads, decoder.attention.unifyheads, decoder.cross_attention.unifyheads,
               encoder.ff.w2 if activation == "swiglu" else encoder.ff.net[-1]]
    assert all(not p.any() for layer in outputs for p in layer.parameters())  # weight and bias
    # Only the initialisation changes: the zeros are trained (their gradient is the branch's input, not zero) and
    # the other weights are PyTorch's, as without the flag.
    (encoder(x) ** 2).sum().backward()
    assert encoder.attention.unifyheads.weight.grad.abs().sum() > 0
    torch.manual_seed(0)
    plain = TransformerBlock(config(prenorm=True, activation=activation), causal=True)
    assert torch.equal(plain.attention.toqueries.weight, encoder.attention.toqueries.weight)
    assert plain.attention.unifyheads.weight.any() and not torch.equal(plain(x), x)
