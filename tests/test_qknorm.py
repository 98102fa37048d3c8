"""torchformer.nn.qknorm: each variant against its formula written out, and cached decoding equal to recomputing."""

from __future__ import annotations

import pytest
import torch

from torchformer import GTransformer, TransformerBlock, generate
from torchformer.nn.attention import attention_reference
from torchformer.nn.qknorm import GatedHeadsAttention, HeadRMSNormAttention, ProjectionRMSNormAttention


def rms(x, weight, eps):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def built(cls):
    torch.manual_seed(0)
    eps = {} if cls is GatedHeadsAttention else {"qk_eps": 1e-6}
    attention = cls(32, 4, kv_heads=2, causal=True, **eps).double()
    with torch.no_grad():
        for p in attention.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return attention


def heads(x, n):  # (b, t, n s) -> (b, n, t, s)
    return x.view(x.size(0), x.size(1), n, -1).transpose(1, 2)


@pytest.mark.parametrize("cls", [HeadRMSNormAttention, ProjectionRMSNormAttention, GatedHeadsAttention])
def test_each_variant_is_its_formula(cls):
    attention = built(cls)
    x = torch.randn(2, 6, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    q, k, v = attention.toqueries(x), attention.tokeys(x), attention.tovalues(x)  # (b, t, h s), (b, t, g s) x2
    if cls is HeadRMSNormAttention:  # one gain of s, shared by the heads
        q, k = heads(q, 4), heads(k, 2)
        q, k = rms(q, attention.qnorm.weight, 1e-6), rms(k, attention.knorm.weight, 1e-6)
    elif cls is ProjectionRMSNormAttention:  # over the whole projection, before the heads
        q, k = heads(rms(q, attention.qnorm.weight, 1e-6), 4), heads(rms(k, attention.knorm.weight, 1e-6), 2)
    else:
        q, k = heads(q, 4), heads(k, 2)
    v = heads(v, 2)
    k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    out, _ = attention_reference(q, k, v, causal)  # (b, h, t, s)
    if cls is GatedHeadsAttention:
        out = out * torch.sigmoid(x @ attention.gate.weight.T).transpose(1, 2)[..., None]
    expected = attention.unifyheads(out.transpose(1, 2).reshape(2, 6, 32))
    with torch.no_grad():
        torch.testing.assert_close(attention(x), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("cls", [HeadRMSNormAttention, ProjectionRMSNormAttention, GatedHeadsAttention])
def test_cached_decoding_equals_recomputing(cls):
    block = type("Block", (TransformerBlock,), {"attention_class": cls})
    model = type("GPT", (GTransformer,), {"block_class": block})
    torch.manual_seed(0)
    net = model(32, 4, 2, 16, 50, prenorm=True, positions="rotary", kv_heads=2, kqnorm=True).double().eval()
    prompt = torch.randint(0, 50, (2, 4), generator=torch.Generator().manual_seed(3))
    assert torch.equal(generate(net, prompt, 10, temperature=0), generate(net, prompt, 10, temperature=0,
                                                                        use_cache=False))


def test_a_closed_gate_silences_its_head():
    attention = built(GatedHeadsAttention)
    x = torch.randn(1, 5, 32, dtype=torch.float64)
    with torch.no_grad():
        attention.unifyheads.bias.zero_()
        attention.gate.weight.zero_()
        attention.gate.weight[:, 0] = -1e4  # every gate shut where x_0 > 0
        x[..., 0] = 1.0
        assert attention(x).abs().max() < 1e-12
