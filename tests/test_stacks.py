"""Properties of torchformer.nn.stacks: encoder and decoder."""

import pytest
import torch

from torchformer import Decoder, Encoder, TransformerConfig


def test_encoder_padding_invariance_and_depth():
    torch.manual_seed(0)
    enc = Encoder(TransformerConfig(16, 4, 3, prenorm=True)).double()
    assert len(enc.blocks) == 3 and isinstance(enc.norm, torch.nn.LayerNorm)
    x = torch.randn(2, 5, 16).double()
    padded = torch.cat([x, torch.randn(2, 2, 16).double()], dim=1)
    mask = torch.tensor([[True] * 5 + [False] * 2] * 2)
    torch.testing.assert_close(enc(padded, mask)[:, :5], enc(x))


def test_decoder_is_causal_in_target_and_ignores_context_padding():
    torch.manual_seed(0)
    dec = Decoder(TransformerConfig(16, 4, 2)).double()
    x, ctx = torch.randn(2, 6, 16).double(), torch.randn(2, 4, 16).double()
    out = dec(x, ctx)
    changed = x.clone()
    changed[:, 4:] = 0
    torch.testing.assert_close(dec(changed, ctx)[:, :4], out[:, :4])
    padded = torch.cat([ctx, torch.randn(2, 3, 16).double()], dim=1)
    mask = torch.tensor([[True] * 4 + [False] * 3] * 2)
    torch.testing.assert_close(dec(x, padded, context_mask=mask), out)
    # the context matters: a different context changes the output
    assert not torch.allclose(dec(x, ctx + 1), out)


def test_decoder_depth_and_stack_options():
    assert len(Decoder(TransformerConfig(16, 4, 2, decoder_depth=3)).blocks) == 3
    assert all(block.attention.causal for block in Encoder(TransformerConfig(16, 4, 2), causal=True).blocks)
    with pytest.raises(ValueError, match="depth must be a positive int, got 0"):
        TransformerConfig(16, 4, 0)
