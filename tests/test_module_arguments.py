"""The modules' documented defaults, what a config reaches inside them, and bad arguments failing with the
argument's name.

A default that drifts (``ff_mult=5``, ``dropout=1.0``, a cross-attention that ignores ``kqnorm``) builds a
working module that computes something else, and no shape error says so. These tests pin the defaults and the
config plumbing the docstrings promise; the mutation pass of docs/testing.md found each of them unchecked.
"""

import pytest
import torch
from torch import nn

from torchformer import (
    AttentionMask,
    CrossAttention,
    DecoderBlock,
    FeedForward,
    GatedFeedForward,
    RMSNorm,
    SelfAttention,
    TransformerBlock,
    TransformerConfig,
)
from torchformer.decoding.sampling import sample_next
from torchformer.nn.attention import MultiHeadAttention
from torchformer.nn.masks import causal_mask
from torchformer.nn.relative import ALiBi, AttentionPositions, RelativeBias, Rotary

# ------------------------------------------------------------------------------------------------ defaults


def test_feedforward_defaults():
    """``FeedForward(e)``: ReLU, hidden size 4e, no dropout; ``GatedFeedForward(e)``: SwiGLU of hidden size
    round(2/3 * 4e), no biases, no dropout."""
    ff = FeedForward(12)
    assert ff.net[0].weight.shape == (48, 12) and ff.net[3].weight.shape == (12, 48)
    assert type(ff.net[1]) is nn.ReLU and ff.net[2].p == 0.0
    gated = GatedFeedForward(12)
    assert gated.w1.weight.shape == gated.v.weight.shape == (32, 12) and gated.w2.weight.shape == (12, 32)
    assert type(gated.act) is nn.SiLU and gated.drop.p == 0.0
    assert [name for name, _ in gated.named_parameters()] == ["w1.weight", "v.weight", "w2.weight"]
    x = torch.randn(2, 3, 12)
    ff.train(), gated.train()  # no dropout by default: training mode is deterministic
    torch.testing.assert_close(ff(x), ff(x), atol=0, rtol=0)
    torch.testing.assert_close(gated(x), gated(x), atol=0, rtol=0)


def test_attention_defaults():
    """8 heads, narrow, not causal, no dropout, no kqnorm, the fast path, every head its own keys and values."""
    for att in (SelfAttention(16), CrossAttention(16)):
        assert (att.heads, att.kv_heads, att.head_size, att.wide, att.causal) == (8, 8, 2, False, False)
        assert (att.dropout, att.kqnorm, att.impl, att.window) == (0.0, False, "sdpa", None)
        assert type(att.qnorm) is nn.Identity and type(att.knorm) is nn.Identity
        assert type(att.relative) is AttentionPositions  # positions added to the embeddings act nowhere here


def test_attention_repr_names_its_options():
    options = SelfAttention(16, 4, wide=True, causal=True, dropout=0.1, kqnorm=True, impl="reference", kv_heads=2,
                            window=3).extra_repr()
    assert options == ("emb=16, heads=4, wide=True, causal=True, dropout=0.1, kqnorm=True, impl='reference', "
                       "kv_heads=2, window=3")
    assert SelfAttention(16, 4).extra_repr() == (
        "emb=16, heads=4, wide=False, causal=False, dropout=0.0, kqnorm=False, impl='sdpa'"
    )
    assert RMSNorm(8).extra_repr() == "8, eps=1e-05" and RMSNorm(8, eps=1e-6).extra_repr() == "8, eps=1e-06"


# ------------------------------------------------------------------------------- what the config reaches


def test_from_config_is_not_causal_unless_asked():
    config = TransformerConfig(16, 4)
    assert not SelfAttention.from_config(config).causal
    assert SelfAttention.from_config(config, causal=True).causal
    assert not TransformerBlock(config).attention.causal and TransformerBlock(config, causal=True).attention.causal


@pytest.mark.parametrize("positions, kind", [("learned", AttentionPositions), ("sinusoidal", AttentionPositions),
                                             ("none", AttentionPositions), ("rotary", Rotary), ("alibi", ALiBi),
                                             ("relative", RelativeBias)])
def test_positions_of_the_config_act_inside_attention_only_when_relative(positions, kind):
    block = TransformerBlock(TransformerConfig(16, 4, positions=positions))
    assert type(block.attention.relative) is kind


@pytest.mark.parametrize("options", [dict(wide=True), dict(kqnorm=True), dict(kv_heads=2), dict(impl="reference"),
                                     dict(dropout=0.25), dict(heads=2)])
def test_every_attention_of_a_decoder_block_follows_the_config(options):
    """Self- and cross-attention of a decoder block read the same fields (except causal, window and positions,
    which mean nothing for another sequence)."""
    config = TransformerConfig(16, options.pop("heads", 4), **options)
    block = DecoderBlock(config)
    for att in (block.attention, block.cross_attention):
        assert (att.heads, att.wide, att.kqnorm, att.kv_heads, att.impl, att.dropout) == (
            config.heads, config.wide, config.kqnorm, config.kv_heads or config.heads, config.impl, config.dropout)
        assert type(att.qnorm) is (nn.LayerNorm if config.kqnorm else nn.Identity)
    assert block.attention.causal and not block.cross_attention.causal


@pytest.mark.parametrize("activation", ["relu", "swiglu"])
def test_the_window_and_dropout_of_the_config_reach_every_part(activation):
    config = TransformerConfig(16, 4, window=3, dropout=0.25, activation=activation)
    block, decoder_block = TransformerBlock(config, causal=True), DecoderBlock(config)
    assert block.attention.window == decoder_block.attention.window == 3
    assert decoder_block.cross_attention.window is None  # the context is another sequence: no window there
    for b in (block, decoder_block):
        dropouts = [m.p for m in b.modules() if isinstance(m, nn.Dropout)]
        assert dropouts == [0.25, 0.25], dropouts  # the feed-forward's hidden layer, and after each sublayer
        assert b.attention.dropout == 0.25


def test_cross_attention_keyword_arguments_reach_the_layer():
    att = CrossAttention(16, 4, wide=True, dropout=0.5, kqnorm=True, impl="reference", kv_heads=2)
    assert (att.wide, att.dropout, att.kqnorm, att.impl, att.kv_heads) == (True, 0.5, True, "reference", 2)
    assert att.tokeys.weight.shape == (2 * 16, 16)  # g = 2 key heads of size e (wide)


def test_cross_attention_tells_attend_the_query_positions():
    """``mask.query_positions`` is documented for every attention (docs/extending.md): ``0 .. t-1`` by default,
    the given positions otherwise. Cross-attention's keys have none."""
    seen = []

    class Recording(CrossAttention):
        def attend(self, q, k, v, mask, *, return_weights=False):
            seen.append((mask.query_positions.clone(), mask.key_positions))
            return super().attend(q, k, v, mask, return_weights=return_weights)

    att = Recording(16, 4)
    x, context = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    att(x, context)
    att(x, context, positions=torch.tensor([4, 5, 6]))
    assert torch.equal(seen[0][0], torch.arange(3)) and torch.equal(seen[1][0], torch.tensor([4, 5, 6]))
    assert seen[0][1] is None and seen[1][1] is None


def test_causal_mask_is_boolean_and_square_by_default():
    assert causal_mask(3).dtype == torch.bool
    assert causal_mask(3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    with pytest.raises(ValueError, match=r"u \(keys\) must be at least t \(queries\), got t=3, u=2"):
        causal_mask(3, 2)  # its first query would see no key
    assert causal_mask(2, 4).dtype == torch.bool
    assert causal_mask(2, 4).tolist() == [[True, True, True, False], [True, True, True, True]]


def test_cross_attention_masks_have_no_distance():
    mask = AttentionMask(torch.arange(3), None)
    with pytest.raises(ValueError, match="^cross-attention keys have no positions in the queries' sequence"):
        mask.distance()


# --------------------------------------------------------------------------------------------- bad arguments


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: FeedForward(0), "emb must be a positive int, got 0"),
        (lambda: FeedForward(8, ff_mult=0), "ff_mult must be a positive int, got 0"),
        (lambda: FeedForward(8, dropout=1.0), r"dropout must be a float in \[0, 1\), got 1.0"),
        (lambda: GatedFeedForward(0), "emb must be a positive int, got 0"),
        (lambda: GatedFeedForward(8, ff_mult=0), "ff_mult must be a positive int, got 0"),
        (lambda: GatedFeedForward(8, dropout=-0.5), r"dropout must be a float in \[0, 1\), got -0.5"),
        (lambda: RMSNorm(0), "emb must be a positive int, got 0"),
        (lambda: RMSNorm(8, eps=True), "eps must be a positive float, got True"),
        (lambda: RMSNorm(8, eps="1e-5"), "eps must be a positive float, got '1e-5'"),
        (lambda: RMSNorm(8, eps=-1e-5), "eps must be a positive float, got -1e-05"),
        (lambda: SelfAttention(0, 1), "emb must be a positive int, got 0"),
        (lambda: SelfAttention(16, 4, kv_heads=0), "kv_heads must be a positive int, got 0"),
        (lambda: SelfAttention(16, 4, window=0), "window must be a positive int, got 0"),
        (lambda: CrossAttention(16, 4, kv_heads=3), r"kv_heads \(3\) must divide heads \(4\)"),
        (lambda: CrossAttention(10, 4), r"emb \(10\) must be divisible by heads \(4\)"),
    ],
)
def test_bad_module_arguments_name_the_argument(build, message):
    with pytest.raises(ValueError, match=message):
        build()


LOGP = torch.zeros(2, 5)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: sample_next(torch.zeros(5)), r"logp must be a float tensor of shape \(n, v\).*got \(5,\)"),
        (lambda: sample_next(torch.zeros(2, 3, 5)), r"logp must be a float tensor of shape \(n, v\).*got \(2, 3, 5\)"),
        (lambda: sample_next(torch.zeros(2, 5, dtype=torch.long)), r"got \(2, 5\)"),
        (lambda: sample_next([[0.0, 1.0]]), r"logp must be a float tensor of shape \(n, v\).*got list"),
        (lambda: sample_next(LOGP, temperature=True), "temperature must be a finite float >= 0"),
        (lambda: sample_next(LOGP, temperature="1"), "temperature must be a finite float >= 0"),
        (lambda: sample_next(LOGP, temperature=-0.5), "temperature must be a finite float >= 0"),
        (lambda: sample_next(LOGP, top_k=0), "top_k must be a positive int, got 0"),
        (lambda: sample_next(LOGP, top_k=2.0), "top_k must be a positive int, got 2.0"),
        (lambda: sample_next(LOGP, top_p=0.0), r"top_p must be a float in \(0, 1\], got 0.0"),
        (lambda: sample_next(LOGP, top_p=True), r"top_p must be a float in \(0, 1\], got True"),
        (lambda: sample_next(LOGP, top_p="0.5"), r"top_p must be a float in \(0, 1\], got '0.5'"),
    ],
)
def test_bad_sampling_arguments_name_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_top_p_of_one_and_top_k_of_the_vocabulary_keep_every_token():
    """The whole distribution: with top_p = 1 (or k >= v) even a token of probability 2.5e-3 is drawn now and then."""
    logits = torch.tensor([[0.0, -5.3, 0.0]]).expand(4000, -1)  # token 1: about exp(-5.3) / 2 = 2.5e-3 of the mass
    for options in (dict(top_p=1.0), dict(top_k=3), dict(top_k=50)):
        tokens = sample_next(logits, generator=torch.Generator().manual_seed(0), **options)
        assert set(tokens.tolist()) == {0, 1, 2}, options


def test_an_attention_mask_is_not_causal_unless_asked():
    positions = torch.arange(4)
    assert AttentionMask(positions, positions).allowed() is None  # every key
    assert AttentionMask(positions, positions, causal=True).allowed().tolist() == causal_mask(4).tolist()
    key_mask = torch.tensor([[True, False, True, True]])
    assert torch.equal(AttentionMask(positions, positions, key_mask).allowed(), key_mask[:, None, None, :])


@pytest.mark.parametrize("causal", [False, True])
def test_a_relative_bias_is_one_sided_exactly_when_attention_is_causal(causal):
    """T5's buckets: a causal layer spends all of them on keys at or before the query, a bidirectional one half on
    each side."""
    for att in (SelfAttention(16, 4, causal=causal, positions="relative"),
                TransformerBlock(TransformerConfig(16, 4, positions="relative"), causal=causal).attention):
        assert att.relative.bidirectional is (not causal)


@pytest.mark.parametrize("impl", ["sdpa", "reference"])
def test_impl_picks_the_function_that_computes_attention(impl, monkeypatch):
    """``impl="reference"`` is plain matmul-softmax-matmul and never calls scaled_dot_product_attention (for
    debugging, or where SDPA misbehaves); ``"sdpa"`` calls it unless the weights are asked for."""
    import torch.nn.functional as F

    calls = []
    sdpa = F.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(1)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counting)
    x = torch.randn(2, 5, 16)
    for causal in (False, True):
        for mask in (None, torch.tensor([[True] * 5, [True, True, True, False, False]])):
            calls.clear()
            SelfAttention(16, 4, causal=causal, impl=impl)(x, mask)
            CrossAttention(16, 4, impl=impl)(x, x, mask)
            assert len(calls) == (2 if impl == "sdpa" else 0)
    calls.clear()
    SelfAttention(16, 4, impl="sdpa")(x, return_weights=True)  # the weights come from the reference path
    assert calls == []


def test_a_decoder_block_gives_its_cross_attention_the_query_positions():
    """A cross-attention variant (``DecoderBlock.cross_attention_class``) reads the same absolute positions as the
    block's self-attention, with and without a cache."""
    from torchformer.nn.cache import BlockCache

    seen = []

    class Recording(CrossAttention):
        def attend(self, q, k, v, mask, *, return_weights=False):
            seen.append(mask.query_positions.clone())
            return super().attend(q, k, v, mask, return_weights=return_weights)

    class Block(DecoderBlock):
        cross_attention_class = Recording

    block = Block(TransformerConfig(16, 4))
    x, context = torch.randn(2, 3, 16), torch.randn(2, 4, 16)
    block(x, context)
    block(x, context, positions=torch.tensor([5, 6, 7]))
    cache = BlockCache(8)
    block.fill_cache(cache, context)
    block(x[:, :2], positions=torch.arange(2), cache=cache)
    block(x[:, 2:], positions=torch.tensor([2]), cache=cache)
    assert [p.tolist() for p in seen] == [[0, 1, 2], [5, 6, 7], [0, 1], [2]]


def test_attention_refuses_the_positions_that_belong_to_the_embeddings():
    """'learned' and 'sinusoidal' are added to the token embeddings: given to an attention layer they did nothing
    (its output stayed order-equivariant), silently."""
    from torchformer import SelfAttention

    for scheme in ("learned", "sinusoidal"):
        with pytest.raises(ValueError, match=rf"positions='{scheme}' is added to the token embeddings, outside "
                                             rf"attention: give it to the model"):
            SelfAttention(16, 2, positions=scheme)


def test_a_mask_or_memory_on_another_device_is_named():
    """The meta device stands in for a GPU: the mask's device was not checked (positions' was), and the error came
    from inside torch ('Tensor on device cpu is not on the expected device meta!')."""
    from torchformer import CTransformer, Seq2SeqTransformer

    classifier = CTransformer(16, 2, 1, 8, 20, 2)
    ids = torch.randint(0, 20, (1, 4))
    with pytest.raises(ValueError, match=r"mask must be on the inputs' device, cpu, got meta"):
        classifier(ids, torch.ones(1, 4, dtype=torch.bool, device="meta"))
    s2s = Seq2SeqTransformer(16, 2, 1, 8, 20, 12)
    memory, tgt = s2s.encode(ids), torch.randint(0, 12, (1, 3))
    with pytest.raises(ValueError, match=r"src_mask must be on the inputs' device, cpu, got meta"):
        s2s.decode(tgt, memory, torch.ones(1, 4, dtype=torch.bool, device="meta"))
    with pytest.raises(ValueError, match=r"memory must be on tgt's device, cpu, got meta"):
        s2s.decode(tgt, memory.to("meta"))
