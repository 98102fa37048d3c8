"""torchformer.nn.latent: latent attention against its formula written out, the absorbed path against the plain one,
cached decoding against recomputing, and what its cache holds."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from torchformer import TransformerConfig, generate
from torchformer.families import LatentTransformer
from torchformer.nn.latent import LatentAttention, LatentOptions
from torchformer.nn.relative import InterleavedRotary, Rotary

OPTIONS = LatentOptions(kv_rank=12, rope_dim=8, q_rank=10, nope_dim=6, value_dim=5)


def layer(positions="rotary", options=OPTIONS, **fields):
    torch.manual_seed(0)
    config = TransformerConfig(32, 4, positions=positions, out_bias=False, options=(options,), **fields)
    attention = LatentAttention.from_config(config, causal=True).double()
    with torch.no_grad():
        for p in attention.parameters():
            p.add_(0.1 * torch.randn_like(p))  # the norms' gains off 1
    return attention


def batch():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 7, 32, generator=g, dtype=torch.float64)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, :2] = False  # left padding
    return x, mask


def rms(x, weight, eps=1e-5):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


@pytest.mark.parametrize("positions", ["rotary", "rotary_interleaved"])
def test_latent_attention_is_its_formula_written_out(positions):
    attention = layer(positions)
    x, _ = batch()
    t, h, n, r, v, R = 7, 4, 6, 8, 5, 12
    scheme = (Rotary if positions == "rotary" else InterleavedRotary)(r).double()
    pos = torch.arange(t)
    q = attention.q_up(rms(attention.q_down(x), attention.q_norm.weight)).view(2, t, h, n + r)  # (b, t, h, n + r)
    down = attention.kv_down(x)  # (b, t, R + r)
    c, k_rot = rms(down[..., :R], attention.kv_norm.weight), down[..., R:]
    kv = attention.kv_up(c).view(2, t, h, n + v)
    outputs = []
    for i in range(h):  # one head at a time
        qi = torch.cat([q[:, :, i, :n], scheme.rotate(q[:, None, :, i, n:], pos)[:, 0]], -1)  # (b, t, n + r)
        ki = torch.cat([kv[:, :, i, :n], scheme.rotate(k_rot[:, None], pos)[:, 0]], -1)
        scores = qi @ ki.transpose(1, 2) / math.sqrt(n + r)  # the scale of the query-key size
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        outputs.append(scores.softmax(-1) @ kv[:, :, i, n:])  # (b, t, v)
    expected = attention.unifyheads(torch.cat(outputs, -1))
    with torch.no_grad():
        torch.testing.assert_close(attention(x), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("q_rank", [10, None], ids=["compressed queries", "direct queries"])
def test_the_absorbed_path_is_the_plain_one_with_padding_forwards_and_backwards(q_rank):
    options = LatentOptions(kv_rank=12, rope_dim=8, q_rank=q_rank, nope_dim=6, value_dim=5)
    attention = layer(options=options)
    x, mask = batch()
    results = []
    for absorb in (False, True):
        attention.absorb = absorb
        attention.zero_grad()
        xs = x.clone().requires_grad_()
        out, weights = attention(xs, mask, return_weights=True)
        out.sum().backward()
        results.append([out, weights, xs.grad] + [p.grad for p in attention.parameters()])
    for plain, absorbed in zip(*results):
        torch.testing.assert_close(absorbed, plain, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("absorb", [False, True])
def test_cached_decoding_equals_recomputing_and_the_cache_holds_only_the_latents(absorb):
    torch.manual_seed(0)
    model = LatentTransformer(32, 4, 2, 16, 50, prenorm=True, norm="rms", positions="rotary", activation="swiglu",
                              out_bias=False, head_bias=False, options=(OPTIONS,)).double().eval()
    for attention in model.self_attention_layers():
        attention.absorb = absorb
    prompt = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(2))
    assert torch.equal(generate(model, prompt, 9, temperature=0), generate(model, prompt, 9, temperature=0,
                                                                           use_cache=False))
    caches = model.new_caches()
    with torch.no_grad():
        model(prompt, caches=caches, positions=torch.arange(5))
    latent, rotary_key = caches[0].self_attention.entries
    assert latent.shape == (2, 1, 16, 12) and rotary_key.shape == (2, 1, 16, 8)  # R + r = 20 numbers per position
    # against 2 g s = 2 * 4 * 8 = 64 for plain heads of the same width, 32 for grouped-query attention with g = 2


def test_a_latent_model_trains_every_parameter_and_comes_back_from_a_checkpoint(tmp_path):
    from torchformer import load_model
    from torchformer.train.checkpoint import save_checkpoint

    torch.manual_seed(0)
    model = LatentTransformer(32, 4, 2, 16, 50, prenorm=True, norm="rms", positions="rotary", activation="swiglu",
                              out_bias=False, options=(OPTIONS,))
    x = torch.randint(0, 50, (3, 16))
    F.nll_loss(model(x).transpose(1, 2), x).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    back = load_model(save_checkpoint(tmp_path / "latent.pt", model=model.eval(), step=0))
    assert type(back) is LatentTransformer and back.config.options_of(LatentOptions) == OPTIONS
    with torch.no_grad():
        torch.testing.assert_close(back(x), model(x), rtol=0, atol=0)


def test_options_and_arguments_that_do_not_apply_are_refused_by_name():
    with pytest.raises(ValueError, match="rope_dim must be even"):
        LatentOptions(rope_dim=5)
    with pytest.raises(ValueError, match="kv_rank must be a positive int"):
        LatentOptions(kv_rank=0)
    with pytest.raises(ValueError, match=r"kv_heads=2 \(a config's kv_heads\) does not apply to latent attention"):
        LatentAttention(32, 4, kv_rank=8, rope_dim=4, nope_dim=4, value_dim=4, kv_heads=2)
    with pytest.raises(ValueError, match=r"scale=0.1 \(a config's attention_scale\) does not apply"):
        LatentTransformer(32, 4, 1, 8, 20, positions="rotary", options=(OPTIONS,), attention_scale=0.1)
    for field in (dict(kqnorm=True), dict(kv_heads=2), dict(qkv_bias=True)):  # from a config: not silently ignored
        with pytest.raises(ValueError, match=f"{next(iter(field))}=.* does not apply to latent attention"):
            LatentTransformer(32, 4, 1, 8, 20, positions="rotary", options=(OPTIONS,), **field)


def test_a_layer_built_with_a_positions_name_rotates_its_rope_dim_coordinates():
    """Built directly with positions="rotary" (an odd nope_dim too), the layer equals one given Rotary for rope_dim."""
    sizes = dict(kv_rank=16, rope_dim=8, nope_dim=15, value_dim=16, causal=True)
    torch.manual_seed(0)
    named = LatentAttention(64, 4, positions="rotary", **sizes)
    torch.manual_seed(0)
    given = LatentAttention(64, 4, positions=Rotary.from_sizes(heads=4, head_size=8, causal=True), **sizes)
    x = torch.randn(2, 5, 64)
    torch.testing.assert_close(named(x), given(x), rtol=1e-6, atol=1e-6)
