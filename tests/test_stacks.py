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


@pytest.mark.parametrize("prenorm", [False, True])
@pytest.mark.parametrize("impl", ["sdpa", "reference"])
@pytest.mark.parametrize("chunks", [[4, 1, 1, 1], [4, 3], [1] * 7])
def test_cached_decoding_of_a_left_padded_prompt_equals_recomputation(prenorm, impl, chunks):
    """Prompts of different lengths, left-padded to one length, then decoded a few positions at a time with caches:
    after the prompt every call has fewer queries than keys, and some of the cached keys are padding. Each call's
    output equals the full causal pass over the whole sequence with the same mask, at every position: a padded
    position sees no real key (left padding comes before every real token) and its attention gives exactly zero
    in both. Row 2's prompt holds a single real token."""
    from torchformer.nn.cache import BlockCache

    torch.manual_seed(0)
    enc = Encoder(TransformerConfig(16, 4, 2, prenorm=prenorm, impl=impl), causal=True).double()
    x = torch.randn(3, 7, 16, dtype=torch.float64)
    mask = torch.tensor([[True] * 7, [False, False] + [True] * 5, [False] * 3 + [True] * 4])
    caches = [BlockCache(8) for _ in enc.blocks]
    outs, start = [], 0
    for n in chunks:
        part = slice(start, start + n)
        outs.append(enc(x[:, part], mask[:, part], positions=torch.arange(start, start + n), caches=caches))
        start += n
    full = enc(x, mask)
    torch.testing.assert_close(torch.cat(outs, dim=1), full, atol=1e-12, rtol=1e-12)
    # the real positions do not depend on the padding: row 1 alone, unpadded, at positions 0 .. 4
    torch.testing.assert_close(full[1, 2:], enc(x[1:2, 2:])[0], atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("prenorm", [False, True])
def test_decoder_target_padding_is_invisible(prenorm):
    """Left padding of the target comes before every real token, so the causal rule alone would let the real
    positions see it: the target mask must reach every block."""
    torch.manual_seed(0)
    dec = Decoder(TransformerConfig(16, 4, 2, prenorm=prenorm)).double()
    x, ctx = torch.randn(2, 4, 16).double(), torch.randn(2, 3, 16).double()
    padded = torch.cat([100 * torch.randn(2, 3, 16).double(), x], dim=1)
    mask = torch.tensor([[False] * 3 + [True] * 4] * 2)
    torch.testing.assert_close(dec(padded, ctx, mask)[:, 3:], dec(x, ctx))


def test_a_cached_decoder_projects_the_context_once():
    """With caches, fill_caches computes each block's cross-attention keys and values of the context once; the
    steps, given no context, read them from the caches, with the same result as the uncached pass."""
    from torchformer.nn.cache import BlockCache

    torch.manual_seed(0)
    dec = Decoder(TransformerConfig(16, 4, 2)).double()
    x, ctx = torch.randn(2, 5, 16).double(), torch.randn(2, 3, 16).double()
    mask = torch.tensor([[True] * 3, [True, True, False]])
    caches = [BlockCache(8) for _ in dec.blocks]
    projections = []
    for block in dec.blocks:
        block.cross_attention.tokeys.register_forward_hook(lambda *args: projections.append(1))
    with pytest.raises(ValueError, match="never filled"):  # refused before any block writes into its cache
        dec(x[:, :2], positions=torch.arange(2), caches=caches)
    assert all(c.self_attention.empty for c in caches)
    dec.fill_caches(caches, ctx, mask)
    assert all(c.cross_attention.keys.shape == (2, 4, 3, 4) for c in caches) and len(projections) == 2
    first = dec(x[:, :2], positions=torch.arange(2), caches=caches)
    steps = [dec(x[:, i : i + 1], positions=torch.tensor([i]), caches=caches) for i in range(2, 5)]
    assert len(projections) == 2  # no block projected the context again
    torch.testing.assert_close(torch.cat([first, *steps], dim=1), dec(x, ctx, None, mask), atol=1e-12, rtol=1e-12)
    with pytest.raises(ValueError, match="context and context_mask must be None with a cache"):
        dec(x[:, :1], ctx, positions=torch.tensor([5]), caches=caches)
    with pytest.raises(ValueError, match=r"caches must be a list of one BlockCache per block \(2\), got 1"):
        dec.fill_caches(caches[:1], ctx)


@pytest.mark.parametrize("positions", ["rotary", "rotary_interleaved", "alibi"])
def test_a_stack_builds_one_parameter_free_scheme_for_all_its_blocks(positions):
    # Rotary positions and ALiBi have no parameters and compute the same in every layer: one scheme serves the
    # stack (a decoding step computes the angles once), and the model equals one whose blocks built their own.
    from torchformer.nn.blocks import TransformerBlock

    config = TransformerConfig(16, 4, 3, positions=positions, prenorm=True)
    torch.manual_seed(0)
    enc = Encoder(config).double()
    schemes = [block.attention.relative for block in enc.blocks]
    assert all(scheme is schemes[0] for scheme in schemes)

    class OwnSchemes(TransformerBlock):
        @classmethod
        def stack_positions(cls, config, *, causal):
            return None

    torch.manual_seed(0)
    own = Encoder(config, block_class=OwnSchemes).double()
    assert own.blocks[0].attention.relative is not own.blocks[1].attention.relative
    assert enc.state_dict().keys() == own.state_dict().keys()
    own.load_state_dict(enc.state_dict())
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    torch.testing.assert_close(enc(x), own(x), atol=1e-12, rtol=0)


def test_a_scheme_with_parameters_stays_one_per_block_and_is_never_built_for_nothing():
    # The relative bias learns a table per layer (unless relative_shared): the stack decides from its class, so
    # the random stream that initialises the model is the one it always was.
    from torchformer.nn.blocks import TransformerBlock

    config = TransformerConfig(16, 4, 3, positions="relative")
    torch.manual_seed(0)
    enc = Encoder(config)
    tables = [block.attention.relative for block in enc.blocks]
    assert len({id(table) for table in tables}) == 3

    class Unshared(TransformerBlock):
        @classmethod
        def stack_positions(cls, config, *, causal):
            return None

    torch.manual_seed(0)
    expected = Encoder(config, block_class=Unshared)
    for (name, value), (_, other) in zip(enc.state_dict().items(), expected.state_dict().items()):
        assert torch.equal(value, other), name


def test_a_block_whose_constructor_takes_no_positions_still_shares_the_parameter_free_scheme():
    # The stack hands a scheme without parameters to the built blocks (share_positions), not to their constructor,
    # so a variant written with __init__(config, *, causal, layer) builds rotary models and shares one scheme.
    from torchformer.nn.blocks import TransformerBlock

    class Plain(TransformerBlock):
        def __init__(self, config, *, causal=False, layer=0):
            super().__init__(config, causal=causal, layer=layer)

    enc = Encoder(TransformerConfig(16, 4, 3, positions="rotary"), block_class=Plain)
    assert len({id(block.attention.relative) for block in enc.blocks}) == 1


def test_a_shared_scheme_must_equal_each_layers_own():
    # A layer whose scheme differs by depth cannot take the stack's: the error names the way out, and a block class
    # that says so (stack_positions returning None) keeps one scheme per layer.
    from torchformer.nn.attention import SelfAttention
    from torchformer.nn.blocks import TransformerBlock

    class BaseByDepth(SelfAttention):
        @classmethod
        def from_config(cls, config, *, causal=False, layer=0, positions=None):
            layer_config = config.replace(rotary_base=10000.0 * (layer + 1))
            return super().from_config(layer_config, causal=causal, layer=layer, positions=positions)

    class ByDepth(TransformerBlock):
        attention_class = BaseByDepth

    config = TransformerConfig(16, 4, 3, positions="rotary")
    with pytest.raises(ValueError, match=r"share_positions: .*must be a shareable scheme equal to this layer's own"):
        Encoder(config, block_class=ByDepth)

    class OwnByDepth(ByDepth):
        @classmethod
        def stack_positions(cls, config, *, causal):
            return None

    enc = Encoder(config, block_class=OwnByDepth)
    assert [block.attention.relative.base for block in enc.blocks] == [10000.0, 20000.0, 30000.0]
