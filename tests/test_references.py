"""torchformer's parts against independent references: PyTorch's own layers with copied weights, formulas written
out by hand, and parameter counts computed by hand.

Each comparison runs in float64 and at tight tolerances, so that small wrong numbers show: a LayerNorm eps of 1e-6
instead of 1e-5, GELU's tanh approximation instead of the exact erf form, a wrong attention scale, an ignored
``ff_mult``, a missing final norm. The inputs are fed at two scales: unit variance, and a scale of 1e-3, where a
LayerNorm's ``eps`` is comparable to the variance it divides by, so a wrong ``eps`` changes the output by a factor
and not by a rounding error.

torch.nn's layers are the reference for what they share with ours (narrow heads, LayerNorm, ReLU/GELU): their
``in_proj_bias`` is zero here, since our projections of queries, keys and values have no bias.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torchformer import (
    CrossAttention,
    DecoderBlock,
    GTransformer,
    SelfAttention,
    TransformerBlock,
    TransformerConfig,
)
from torchformer.nn.stacks import Decoder, Encoder

DOUBLE = dict(dtype=torch.float64)
EXACT = dict(atol=1e-10, rtol=1e-10)


def randomise(module: nn.Module, seed: int) -> nn.Module:
    """Every parameter of a torch.nn reference random (norm gains around 1), except the bias of the query, key and
    value projections, which ours do not have. torch.nn starts biases and norms at 0 and 1: a test with those would
    not see a bias or a gain put in the wrong place."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("in_proj_bias"):
                p.zero_()
            elif "norm" in name and name.endswith("weight"):
                p.copy_(0.5 + torch.rand(p.shape, generator=g, dtype=p.dtype))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module


def load_attention(ours: nn.Module, mha: nn.MultiheadAttention) -> None:
    """torch's packed ``in_proj_weight`` is ``[W_q; W_k; W_v]``; its ``out_proj`` is our ``unifyheads``."""
    e = mha.embed_dim
    w = mha.in_proj_weight
    with torch.no_grad():
        ours.toqueries.weight.copy_(w[:e])
        ours.tokeys.weight.copy_(w[e : 2 * e])
        ours.tovalues.weight.copy_(w[2 * e :])
        ours.unifyheads.weight.copy_(mha.out_proj.weight)
        ours.unifyheads.bias.copy_(mha.out_proj.bias)


def load_norm(ours: nn.Module, theirs: nn.LayerNorm) -> None:
    with torch.no_grad():
        ours.weight.copy_(theirs.weight)
        ours.bias.copy_(theirs.bias)


def load_feedforward(ours: nn.Module, layer: nn.Module) -> None:
    """``linear1``/``linear2`` of a torch layer are our ``net.0``/``net.3``; a hidden size other than
    ``ff_mult * emb`` fails here with a shape error."""
    with torch.no_grad():
        for mine, theirs in ((ours.net[0], layer.linear1), (ours.net[3], layer.linear2)):
            mine.weight.copy_(theirs.weight)
            mine.bias.copy_(theirs.bias)


def load_encoder_layer(block: TransformerBlock, layer: nn.TransformerEncoderLayer) -> None:
    load_attention(block.attention, layer.self_attn)
    load_feedforward(block.ff, layer)
    load_norm(block.norm1, layer.norm1)
    load_norm(block.norm2, layer.norm2)


def load_decoder_layer(block: DecoderBlock, layer: nn.TransformerDecoderLayer) -> None:
    """torch's decoder layer calls its norms 1, 2, 3 in order; ours are norm1, norm_cross, norm2."""
    load_attention(block.attention, layer.self_attn)
    load_attention(block.cross_attention, layer.multihead_attn)
    load_feedforward(block.ff, layer)
    load_norm(block.norm1, layer.norm1)
    load_norm(block.norm_cross, layer.norm2)
    load_norm(block.norm2, layer.norm3)


def causal(t: int) -> torch.Tensor:
    """torch's boolean attention mask: True where a query may NOT look (above the diagonal)."""
    return torch.ones(t, t, dtype=torch.bool).triu(1)


def inputs(scale: float, *shape: int, seed: int = 1) -> torch.Tensor:
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed), **DOUBLE)


# Right padding, first token always real: every query (causal or not) sees at least one key, so torch's layers
# give no NaN rows and every position can be compared.
MASK = torch.tensor([[True] * 6, [True] * 4 + [False] * 2, [True, True, False, True, False, False]])


# ---------------------------------------------------------------------------------------------- attention


@pytest.mark.parametrize("impl", ["sdpa", "reference"])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_self_attention_equals_torch_multihead_attention(impl, is_causal, masked):
    mha = randomise(nn.MultiheadAttention(16, 4, batch_first=True, **DOUBLE), seed=0)
    att = SelfAttention(16, 4, causal=is_causal, impl=impl).double()
    load_attention(att, mha)
    x = inputs(1.0, 3, 6, 16)
    mask = MASK if masked else None
    expected, weights = mha(x, x, x, key_padding_mask=None if mask is None else ~mask,
                            attn_mask=causal(6) if is_causal else None, average_attn_weights=False)
    real = mask if masked else torch.ones(3, 6, dtype=torch.bool)  # our padded queries are zeroed: compare real ones
    torch.testing.assert_close(att(x, mask)[real], expected[real], **EXACT)
    _, ours = att(x, mask, return_weights=True)
    torch.testing.assert_close(ours[real[:, None, :].expand(3, 4, 6)], weights[real[:, None, :].expand(3, 4, 6)],
                               **EXACT)


@pytest.mark.parametrize("impl", ["sdpa", "reference"])
def test_cross_attention_equals_torch_multihead_attention(impl):
    mha = randomise(nn.MultiheadAttention(16, 4, batch_first=True, **DOUBLE), seed=2)
    att = CrossAttention(16, 4, impl=impl).double()
    load_attention(att, mha)
    x, context = inputs(1.0, 3, 5, 16, seed=3), inputs(1.0, 3, 6, 16, seed=4)
    expected, _ = mha(x, context, context, key_padding_mask=~MASK)
    torch.testing.assert_close(att(x, context, MASK), expected, **EXACT)


def wide_attention_by_hand(att, x, *, is_causal, mask=None):
    """Wide heads written out (former's SelfAttentionWide): head i projects x to a full e-dimensional query, key and
    value with rows ``i*e .. (i+1)*e`` of the projections, and its dot products are scaled by ``1/sqrt(e)`` (the
    size of each head, which is all of e: not e/h)."""
    e, h = att.emb, att.heads
    t = x.size(1)
    heads = []
    for i in range(h):
        rows = slice(i * e, (i + 1) * e)
        q = x @ att.toqueries.weight[rows].T  # (b, t, e)
        k = x @ att.tokeys.weight[rows].T
        v = x @ att.tovalues.weight[rows].T
        scores = q @ k.transpose(1, 2) / math.sqrt(e)  # (b, t, t)
        if is_causal:
            scores = scores.masked_fill(causal(t), -math.inf)
        if mask is not None:
            scores = scores.masked_fill(~mask[:, None, :], -math.inf)
        heads.append(scores.softmax(-1) @ v)
    return torch.cat(heads, dim=-1) @ att.unifyheads.weight.T + att.unifyheads.bias  # (b, t, h*e) -> (b, t, e)


@pytest.mark.parametrize("impl", ["sdpa", "reference"])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("emb, heads", [(6, 4), (16, 4)])  # 6 / 4 is no integer: wide heads need no divisibility
def test_wide_heads_are_former_s_formula_scaled_by_the_full_embedding(impl, is_causal, emb, heads):
    torch.manual_seed(0)
    att = SelfAttention(emb, heads, wide=True, causal=is_causal, impl=impl).double()
    x = inputs(1.0, 2, 5, emb)
    torch.testing.assert_close(att(x), wide_attention_by_hand(att, x, is_causal=is_causal), **EXACT)
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])
    torch.testing.assert_close(att(x, mask)[mask], wide_attention_by_hand(att, x, is_causal=is_causal, mask=mask)[mask],
                               **EXACT)


@pytest.mark.parametrize("impl", ["sdpa", "reference"])
@pytest.mark.parametrize("wide", [False, True])
def test_kqnorm_normalises_queries_and_keys_per_head_before_the_scores(impl, wide):
    """kqnorm written out: every head's query and key vectors (s components) go through their own LayerNorm
    (gain and bias, eps 1e-5) before ``softmax(q k^T / sqrt(s)) v``; values are not normalised."""
    torch.manual_seed(0)
    att = SelfAttention(8, 2, wide=wide, causal=True, kqnorm=True, impl=impl).double()
    with torch.no_grad():  # gains and biases that are not 1 and 0, so the test sees where each one goes
        for norm in (att.qnorm, att.knorm):
            norm.weight.uniform_(0.5, 1.5), norm.bias.uniform_(-0.5, 0.5)
    x = inputs(1.0, 2, 5, 8)
    s, h = att.head_size, att.heads
    heads = []
    for i in range(h):
        rows = slice(i * s, (i + 1) * s)
        q = F.layer_norm(x @ att.toqueries.weight[rows].T, (s,), att.qnorm.weight, att.qnorm.bias, eps=1e-5)
        k = F.layer_norm(x @ att.tokeys.weight[rows].T, (s,), att.knorm.weight, att.knorm.bias, eps=1e-5)
        v = x @ att.tovalues.weight[rows].T
        scores = (q @ k.transpose(1, 2) / math.sqrt(s)).masked_fill(causal(5), -math.inf)
        heads.append(scores.softmax(-1) @ v)
    expected = torch.cat(heads, dim=-1) @ att.unifyheads.weight.T + att.unifyheads.bias
    torch.testing.assert_close(att(x), expected, **EXACT)


# ------------------------------------------------------------------------------------------------- blocks


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("prenorm", [False, True])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("scale", [1.0, 1e-3])  # 1e-3: a variance of about 1e-6, where LayerNorm's eps matters
def test_block_equals_torch_transformer_encoder_layer(activation, prenorm, is_causal, scale):
    # ff_mult 3: torch's dim_feedforward=48 only loads into a network whose hidden size follows ff_mult.
    layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=48, dropout=0.0, activation=activation,
                                       layer_norm_eps=1e-5, batch_first=True, norm_first=prenorm, **DOUBLE)
    randomise(layer, seed=5)
    if scale < 1:  # no output bias: a small input stays small up to the first norm (post-norm's too)
        nn.init.zeros_(layer.self_attn.out_proj.bias)
    block = TransformerBlock(TransformerConfig(16, 4, ff_mult=3, activation=activation, prenorm=prenorm),
                             causal=is_causal).double()
    load_encoder_layer(block, layer)
    x = inputs(scale, 3, 6, 16)
    layer.train()  # dropout is 0; train mode keeps torch off its fused "fast path", which skips padded positions
    expected = layer(x, src_mask=causal(6) if is_causal else None, src_key_padding_mask=~MASK, is_causal=is_causal)
    torch.testing.assert_close(block(x, MASK)[MASK], expected[MASK], **EXACT)
    torch.testing.assert_close(block(x), layer(x, src_mask=causal(6) if is_causal else None, is_causal=is_causal),
                               **EXACT)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("prenorm", [False, True])
@pytest.mark.parametrize("scale", [1.0, 1e-3])
def test_decoder_block_equals_torch_transformer_decoder_layer(activation, prenorm, scale):
    layer = nn.TransformerDecoderLayer(16, 4, dim_feedforward=32, dropout=0.0, activation=activation,
                                       layer_norm_eps=1e-5, batch_first=True, norm_first=prenorm, **DOUBLE)
    randomise(layer, seed=6)
    if scale < 1:
        nn.init.zeros_(layer.self_attn.out_proj.bias)
        nn.init.zeros_(layer.multihead_attn.out_proj.bias)
    block = DecoderBlock(TransformerConfig(16, 4, ff_mult=2, activation=activation, prenorm=prenorm)).double()
    load_decoder_layer(block, layer)
    x, context = inputs(scale, 3, 5, 16, seed=7), inputs(scale, 3, 6, 16, seed=8)
    layer.train()
    expected = layer(x, context, tgt_mask=causal(5), memory_key_padding_mask=~MASK, tgt_is_causal=True)
    torch.testing.assert_close(block(x, context, context_mask=MASK), expected, **EXACT)


def test_layer_norm_eps_is_torch_s_default():
    """What the scale-1e-3 cases above check end to end, here on the norms alone: eps = 1e-5, torch's default,
    in every LayerNorm of a block, of a decoder block and at the end of a pre-norm stack."""
    config = TransformerConfig(16, 4, depth=1, prenorm=True)
    block, decoder = DecoderBlock(config).double(), Decoder(config).double()
    x = inputs(1e-3, 2, 3, 16)
    for norm in (block.norm1, block.norm_cross, block.norm2, decoder.norm, Encoder(config).double().norm):
        torch.testing.assert_close(norm(x), F.layer_norm(x, (16,), eps=1e-5), **EXACT)  # fresh: gain 1, bias 0


# ------------------------------------------------------------------------------------------------- stacks


@pytest.mark.parametrize("prenorm", [False, True])
@pytest.mark.parametrize("scale", [1.0, 1e-3])
def test_encoder_stack_equals_torch_transformer_encoder(prenorm, scale):
    layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=64, dropout=0.0, batch_first=True, norm_first=prenorm,
                                       **DOUBLE)
    final = nn.LayerNorm(16, **DOUBLE) if prenorm else None  # pre-norm stacks end with a norm, post-norm ones don't
    reference = randomise(nn.TransformerEncoder(layer, 2, norm=final, enable_nested_tensor=False), seed=9).train()
    encoder = Encoder(TransformerConfig(16, 4, depth=2, prenorm=prenorm), causal=True).double()
    for block, theirs in zip(encoder.blocks, reference.layers):
        load_encoder_layer(block, theirs)
    if prenorm:
        load_norm(encoder.norm, reference.norm)
    x = inputs(scale, 3, 6, 16, seed=10)
    # scale 1e-3: the last block's residual stream is large again, so the final norm is what differs between
    # pre-norm with and without it
    expected = reference(x, mask=causal(6), src_key_padding_mask=~MASK, is_causal=True)
    torch.testing.assert_close(encoder(x, MASK)[MASK], expected[MASK], **EXACT)


@pytest.mark.parametrize("prenorm", [False, True])
def test_decoder_stack_equals_torch_transformer_decoder(prenorm):
    layer = nn.TransformerDecoderLayer(16, 4, dim_feedforward=64, dropout=0.0, batch_first=True, norm_first=prenorm,
                                       **DOUBLE)
    final = nn.LayerNorm(16, **DOUBLE) if prenorm else None
    reference = randomise(nn.TransformerDecoder(layer, 2, norm=final), seed=11).train()
    decoder = Decoder(TransformerConfig(16, 4, depth=2, prenorm=prenorm)).double()
    for block, theirs in zip(decoder.blocks, reference.layers):
        load_decoder_layer(block, theirs)
    if prenorm:
        load_norm(decoder.norm, reference.norm)
    x, context = inputs(1.0, 3, 5, 16, seed=12), inputs(1.0, 3, 6, 16, seed=13)
    expected = reference(x, context, tgt_mask=causal(5), memory_key_padding_mask=~MASK, tgt_is_causal=True)
    torch.testing.assert_close(decoder(x, context, context_mask=MASK), expected, **EXACT)


@pytest.mark.parametrize("stack", ["encoder", "decoder"])
def test_a_pre_norm_stack_ends_normalised(stack):
    """Without torch: every position leaving a fresh pre-norm stack has mean 0 and variance 1 (its final LayerNorm's
    gain is 1 and bias 0), while its last block's residual stream, x + f(norm(x)), does not."""
    torch.manual_seed(0)
    config = TransformerConfig(16, 4, depth=2, prenorm=True)
    x, context = 5 + 3 * inputs(1.0, 2, 5, 16), inputs(1.0, 2, 4, 16)
    if stack == "encoder":
        module = Encoder(config).double()
        out, last = module(x), module.blocks[1](module.blocks[0](x))
    else:
        module = Decoder(config).double()
        out, last = module(x, context), module.blocks[1](module.blocks[0](x, context), context)
    torch.testing.assert_close(out.mean(-1), torch.zeros(2, 5, **DOUBLE), atol=1e-10, rtol=0)
    torch.testing.assert_close(out.var(-1, unbiased=False), torch.ones(2, 5, **DOUBLE), atol=1e-4, rtol=0)
    assert not torch.allclose(last.mean(-1), torch.zeros(2, 5, **DOUBLE), atol=1e-3)


# ------------------------------------------------------------------------------------------ parameter counts


def count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# One TransformerBlock of emb e = 16, heads h = 4 (narrow head size s = 4), counted by hand.
#   attention: queries e * (h s), keys and values e * (g s) each (g = kv_heads), unifyheads (h s) * e + e
#   feed-forward: plain e * f + f + f * e + e with f = ff_mult * e; gated 3 * e * round(2/3 * ff_mult * e)
#   norms: 2 per block, 2e each (LayerNorm: gain and bias) or e (RMSNorm: gain)
BLOCK_COUNTS = [
    # default: attention 3*16*16 + 16*16+16 = 1040; ff 16*64+64 + 64*16+16 = 2128; norms 2*32 = 64
    (dict(), 3232),
    # ff_mult 2: ff 16*32+32 + 32*16+16 = 1072
    (dict(ff_mult=2), 1040 + 1072 + 64),
    # ff_mult 3: ff 16*48+48 + 48*16+16 = 1600
    (dict(ff_mult=3), 1040 + 1600 + 64),
    # ff_mult 1: ff 16*16+16 + 16*16+16 = 544
    (dict(ff_mult=1), 1040 + 544 + 64),
    # wide (s = 16): 3*16*64 + 64*16+16 = 4112
    (dict(wide=True), 4112 + 2128 + 64),
    # kv_heads 1 (multi-query): queries 16*16, keys and values 16*4 each, unifyheads 272 = 656
    (dict(kv_heads=1), 656 + 2128 + 64),
    # kv_heads 2: 256 + 2*16*8 + 272 = 784
    (dict(kv_heads=2), 784 + 2128 + 64),
    # wide and kv_heads 2: queries 16*64, keys and values 16*32 each, unifyheads 64*16+16: 1024+1024+1040 = 3088
    (dict(wide=True, kv_heads=2), 3088 + 2128 + 64),
    # kqnorm: a LayerNorm(s) for queries and one for keys, 2*4 each = 16
    (dict(kqnorm=True), 3232 + 16),
    # kqnorm with wide heads: LayerNorm(16) twice = 64
    (dict(kqnorm=True, wide=True), 4112 + 64 + 2128 + 64),
    # swiglu, ff_mult 4: h = 2/3 * 64 = 42.67 to the nearest multiple of 16 = 48, 3*16*48 = 2304, no biases
    (dict(activation="swiglu"), 1040 + 2304 + 64),
    # geglu, ff_mult 3: h = round(2/3 * 48) = 32, 3*16*32 = 1536
    (dict(activation="geglu", ff_mult=3), 1040 + 1536 + 64),
    # relu2 and gelu: the plain network's count
    (dict(activation="relu2"), 3232),
    (dict(activation="gelu", ff_mult=2), 2176),
    # RMSNorm: a gain only, 16 per norm
    (dict(norm="rms"), 1040 + 2128 + 32),
    # positions inside attention: rotary and ALiBi have no parameters; T5's relative bias has a (32 buckets, h) table
    (dict(positions="rotary"), 3232),
    (dict(positions="alibi"), 3232),
    (dict(positions="relative"), 3232 + 32 * 4),
]


@pytest.mark.parametrize("options, expected", BLOCK_COUNTS, ids=[str(o) for o, _ in BLOCK_COUNTS])
def test_block_parameter_count_per_option(options, expected):
    assert count(TransformerBlock(TransformerConfig(16, 4, **options))) == expected


def test_decoder_block_and_stack_parameter_counts():
    # A decoder block: two attentions (1040 each), ff 2128, three LayerNorms (32 each) = 4304.
    assert count(DecoderBlock(TransformerConfig(16, 4))) == 4304
    assert count(DecoderBlock(TransformerConfig(16, 4, ff_mult=2))) == 2 * 1040 + 1072 + 96
    # Stacks of 2: a pre-norm stack adds its final norm (32), a post-norm stack does not.
    assert count(Encoder(TransformerConfig(16, 4, depth=2))) == 2 * 3232
    assert count(Encoder(TransformerConfig(16, 4, depth=2, prenorm=True))) == 2 * 3232 + 32
    assert count(Decoder(TransformerConfig(16, 4, depth=2, prenorm=True))) == 2 * 4304 + 32
    assert count(Decoder(TransformerConfig(16, 4, depth=2, decoder_depth=3))) == 3 * 4304
    assert count(Encoder(TransformerConfig(16, 4, depth=2, prenorm=True, norm="rms"))) == 2 * 3200 + 16


@pytest.mark.parametrize("tie_weights", [False, True])
def test_generator_parameter_count_and_weight_tying(tie_weights):
    # emb 16, 1 block, seq_length 8, 11 tokens, pre-norm: tokens 11*16 = 176, learned positions 8*16 = 128,
    # block 3232, final norm 32, output layer 16*11 + 11 = 187, of which the 176 weights are the embedding's if tied.
    model = GTransformer(16, 4, 1, 8, 11, prenorm=True, tie_weights=tie_weights)
    assert count(model) == 176 + 128 + 3232 + 32 + 187 - (176 if tie_weights else 0)
    assert (model.head.toprobs.weight is model.embedding.tokens.weight) == tie_weights
