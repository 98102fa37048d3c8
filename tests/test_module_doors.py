"""Every public module checks what it is given at its door, as torch.nn does: a wrong width, a mask of the wrong
shape or dtype, a context of another batch is a clear error naming the argument, the expected and the received
value, instead of a RuntimeError from inside a matrix multiplication.

The checks read shapes and dtypes only (Python integers: no device sync), so a compiled step runs them at trace
time and never again.
"""

import pytest
import torch

from torchformer import (
    CrossAttention, Decoder, DecoderBlock, Encoder, SelfAttention, TransformerBlock, TransformerConfig,
)

E, H, B, T, U = 16, 2, 2, 5, 3  # embedding, heads, batch, target and context lengths
CONFIG = TransformerConfig(E, H, 2, 8, 10)
BOOL = dict(dtype=torch.bool)


def self_attention_like():
    """The modules whose forward is ``(x, mask=None, ...)``."""
    return {
        "SelfAttention": SelfAttention(E, H),
        "TransformerBlock": TransformerBlock(CONFIG),
        "Encoder": Encoder(CONFIG),
    }


def cross_attention_like():
    """The modules whose forward is ``(x, context, mask?, context_mask?, ...)``, with a call that takes them by
    keyword wherever the signatures differ."""
    return {
        "CrossAttention": (CrossAttention(E, H), "context_mask"),
        "DecoderBlock": (DecoderBlock(CONFIG), "context_mask"),
        "Decoder": (Decoder(CONFIG), "context_mask"),
    }


@pytest.mark.parametrize("name", list(self_attention_like()))
def test_a_wrong_width_names_both_widths(name):
    module = self_attention_like()[name]
    with pytest.raises(ValueError, match=r"x must have embedding size 16 .* got shape \(2, 5, 12\)"):
        module(torch.randn(B, T, 12))


@pytest.mark.parametrize("name", list(self_attention_like()))
def test_a_mask_of_the_wrong_length_names_both_lengths(name):
    module = self_attention_like()[name]
    with pytest.raises(ValueError, match=r"mask must have shape \(b, t\) = \(2, 5\), got \(2, 4\)"):
        module(torch.randn(B, T, E), torch.ones(B, T - 1, **BOOL))
    with pytest.raises(ValueError, match=r"mask must have shape \(b, t\) = \(2, 5\), got \(3, 5\)"):
        module(torch.randn(B, T, E), torch.ones(B + 1, T, **BOOL))
    with pytest.raises(TypeError, match="mask must have dtype torch.bool"):
        module(torch.randn(B, T, E), torch.ones(B, T))


@pytest.mark.parametrize("name", list(self_attention_like()))
def test_other_bad_inputs_are_named(name):
    module = self_attention_like()[name]
    with pytest.raises(ValueError, match=r"x must have shape \(b, t, 16\) \(3 dimensions\), got shape \(5, 16\)"):
        module(torch.randn(T, E))
    with pytest.raises(TypeError, match="x must be a floating point tensor"):
        module(torch.ones(B, T, E, dtype=torch.long))
    with pytest.raises(TypeError, match="x has dtype torch.float64 but the module's parameters are torch.float32"):
        module(torch.randn(B, T, E, dtype=torch.float64))


@pytest.mark.parametrize("name", list(cross_attention_like()))
def test_cross_attention_modules_name_the_context(name):
    module, mask_name = cross_attention_like()[name]
    x, context = torch.randn(B, T, E), torch.randn(B, U, E)
    with pytest.raises(ValueError, match=r"x must have embedding size 16 .* got shape \(2, 5, 12\)"):
        module(torch.randn(B, T, 12), context)
    with pytest.raises(ValueError, match=r"context must have embedding size 16 .* got shape \(2, 3, 12\)"):
        module(x, torch.randn(B, U, 12))
    with pytest.raises(ValueError, match=r"context must have shape \(b, u, 16\) with b = 2 .* got shape \(3, 3, 16\)"):
        module(x, torch.randn(B + 1, U, E))
    with pytest.raises(ValueError, match=r"context_mask must have shape \(b, u\) = \(2, 3\), got \(2, 5\)"):
        module(x, context, **{mask_name: torch.ones(B, T, **BOOL)})


@pytest.mark.parametrize("name", ["DecoderBlock", "Decoder"])
def test_a_decoder_names_a_target_mask_of_the_wrong_length(name):
    module, _ = cross_attention_like()[name]
    with pytest.raises(ValueError, match=r"mask must have shape \(b, t\) = \(2, 5\), got \(2, 3\)"):
        module(torch.randn(B, T, E), torch.randn(B, U, E), torch.ones(B, U, **BOOL))


def test_positions_of_the_wrong_length_are_named():
    with pytest.raises(ValueError, match=r"positions must have shape \(t,\) = \(5,\), one per token, got \(4,\)"):
        SelfAttention(E, H)(torch.randn(B, T, E), positions=torch.arange(4))
    with pytest.raises(ValueError, match=r"positions must have shape \(t,\) = \(5,\), one per token, got \(4,\)"):
        Encoder(CONFIG)(torch.randn(B, T, E), positions=torch.arange(4))


def test_the_checks_change_nothing_for_good_inputs():
    """Good inputs of every accepted kind still run: no mask, a mask, under autocast with another dtype."""
    x, context, mask = torch.randn(B, T, E), torch.randn(B, U, E), torch.ones(B, T, **BOOL)
    for module in self_attention_like().values():
        assert module(x).shape == module(x, mask).shape == (B, T, E)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert module(x.bfloat16()).shape == (B, T, E)
    for module, _ in cross_attention_like().values():
        assert module(x, context).shape == (B, T, E)


def test_a_compiled_module_still_checks_at_trace_time():
    # Not fullgraph: a raise is where dynamo breaks the graph, and the error then comes from Python as it is.
    attention = torch.compile(SelfAttention(E, H), backend="eager")
    assert attention(torch.randn(B, T, E)).shape == (B, T, E)
    with pytest.raises(ValueError, match="x must have embedding size 16"):
        attention(torch.randn(B, T, 12))


def test_a_variant_with_other_projections_passes_the_door():
    """The dtype check reads any parameter, not one attribute: a fused projection (no toqueries) still runs."""

    class Fused(SelfAttention):
        def __init__(self, emb, heads=8, **options):
            super().__init__(emb, heads, **options)
            del self.toqueries, self.tokeys, self.tovalues
            self.qkv = torch.nn.Linear(emb, 3 * emb, bias=False)

        def project_queries(self, x):
            return self.split_heads(self.qkv(x).chunk(3, dim=-1)[0])

        def project_keys_values(self, y):
            _, k, v = self.qkv(y).chunk(3, dim=-1)
            return self.split_heads(k), self.split_heads(v)

    assert Fused(E, H)(torch.randn(B, T, E)).shape == (B, T, E)
    with pytest.raises(TypeError, match="x has dtype torch.float64"):
        Fused(E, H)(torch.randn(B, T, E, dtype=torch.float64))


def test_the_context_s_dtype_and_empty_inputs_are_named():
    with pytest.raises(TypeError, match="context has dtype torch.float64 but the module's parameters are torch.float32"):
        CrossAttention(E, H)(torch.randn(B, T, E), torch.randn(B, U, E, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"x must hold at least one sequence of at least one position, got shape \(2, 0, 16\)"):
        SelfAttention(E, H)(torch.randn(B, 0, E))
