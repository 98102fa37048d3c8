"""The sparse transformer's attention patterns (torchformer.nn.masks): each against a dense mask written out from
the paper's definition, composed with the causal rule, windows and padding, on every attention path, with a cache."""

import math

import pytest
import torch

from torchformer import GTransformer, TransformerConfig
from torchformer.nn.attention import SelfAttention, attention_reference
from torchformer.nn.masks import AttentionMask, FixedPattern, StridedPattern

# Eager flex attention (the CPU's) computes the whole score matrix and says so: the point here is its values.
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def strided_by_hand(n, stride):
    """Child et al. (2019), section 4.2: A(1) = {t, t-1, ..., t-l} (the previous l positions, as a window of
    l: |i - j| < l) and A(2) = {j : (i - j) mod l = 0}; the union, without the causal rule."""
    return torch.tensor([[abs(i - j) < stride or (i - j) % stride == 0 for j in range(n)] for i in range(n)])


def fixed_by_hand(n, stride, summary):
    """A(1) = {j : floor(j / l) = floor(i / l)}, A(2) = {j : j mod l in {l - c, ..., l - 1}}; the union."""
    return torch.tensor([[i // stride == j // stride or j % stride in range(stride - summary, stride)
                          for j in range(n)] for i in range(n)])


@pytest.mark.parametrize("n,stride", [(16, 4), (17, 5), (9, 1), (10, 12)])
def test_the_patterns_are_the_papers(n, stride):
    positions = torch.arange(n)
    assert torch.equal(StridedPattern(stride).allows(positions, positions), strided_by_hand(n, stride))
    for summary in {1, max(1, stride // 2), stride}:
        assert torch.equal(FixedPattern(stride, summary).allows(positions, positions),
                           fixed_by_hand(n, stride, summary))


def test_a_query_sees_about_two_sqrt_n_keys():
    n = 1024
    l = int(math.sqrt(n))
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    positions = torch.arange(n)
    for pattern in (StridedPattern(l), FixedPattern(l, 1)):
        pairs = (pattern.allows(positions, positions) & causal).sum().item()
        assert pairs <= 2 * n * math.sqrt(n)  # at most 2 sqrt(n) keys per query ...
        assert pairs < causal.sum().item() / 10  # ... against n / 2 on average for dense causal attention


@pytest.mark.parametrize("sparse, summary", [("strided", 1), ("fixed", 1), ("fixed", 3)])
@pytest.mark.parametrize("positions", ["rotary", "alibi", "none"])
def test_every_path_computes_attention_under_the_written_out_mask(sparse, summary, positions):
    torch.manual_seed(0)
    b, t, e = 2, 13, 16
    config = TransformerConfig(e, 4, positions=positions, sparse=sparse, sparse_stride=4, sparse_summary=summary,
                               window=9, kv_heads=2)
    x = torch.randn(b, t, e, dtype=torch.float64)
    mask = torch.ones(b, t, dtype=torch.bool)
    mask[1, 2:5] = False  # padding inside row 1
    outputs = {}
    for impl in ("reference", "sdpa", "flex"):
        torch.manual_seed(1)
        layer = SelfAttention.from_config(config.replace(impl=impl), causal=True).double()
        with torch.no_grad():
            outputs[impl] = layer(x, mask)
    # The reference written out: queries, keys and values by the layer's own projections, the mask by hand.
    hand = fixed_by_hand(t, 4, summary) if sparse == "fixed" else strided_by_hand(t, 4)
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    allowed = hand & (j <= i) & ((i - j).abs() < 9) & mask[:, None, None, :]  # (b, 1, t, t)
    x = x.masked_fill(~mask[..., None], 0.0)  # the layer's first step: padded rows hold nothing
    with torch.no_grad():
        q = layer.relative.rotate(layer.project_queries(x), torch.arange(t))
        k, v = layer.project_keys_values(x)
        k = layer.share_kv_heads(layer.relative.rotate(k, torch.arange(t)))
        v = layer.share_kv_heads(v)
        bias = layer.relative.bias(AttentionMask(torch.arange(t), torch.arange(t), causal=True))
        out, _ = attention_reference(q, k, v, allowed, bias=bias)
        expected = layer.unifyheads(layer.merge_heads(out)).masked_fill(~allowed.any(-1)[:, 0, :, None], 0.0)
    for impl, got in outputs.items():
        assert (got - expected).abs().max() < 1e-10, impl


@pytest.mark.parametrize("sparse", ["strided", "fixed"])
def test_sparse_generators_stay_causal_and_cached_decoding_equals_recomputing(sparse):
    torch.manual_seed(0)
    model = GTransformer(16, 2, 2, 20, 11, positions="rotary", sparse=sparse, sparse_stride=3).double().eval()
    x = torch.randint(0, 11, (2, 20))
    full = model(x)
    changed = x.clone()
    changed[:, 12:] = (x[:, 12:] + 1) % 11
    torch.testing.assert_close(model(changed)[:, :12], full[:, :12], atol=1e-12, rtol=0)  # the future is unseen
    caches = model.new_caches()
    steps = [model(x[:, :5], caches=caches, positions=torch.arange(5))]
    steps += [model(x[:, p:p + 1], caches=caches, positions=torch.tensor([p])) for p in range(5, 20)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-10, rtol=0)
    dense = GTransformer(16, 2, 2, 20, 11, positions="rotary").double().eval()
    dense.load_state_dict(model.state_dict())
    assert not torch.allclose(dense(x)[:, 5:], full[:, 5:])  # the pattern changed something: the test can fail


def test_the_errors_name_what_is_wrong():
    with pytest.raises(ValueError, match="sparse='strided' needs sparse_stride"):
        TransformerConfig(16, 2, sparse="strided")
    with pytest.raises(ValueError, match="sparse must be one of"):
        TransformerConfig(16, 2, sparse="dense", sparse_stride=4)
    with pytest.raises(ValueError, match="sparse_stride and sparse_summary apply to a sparse pattern only"):
        TransformerConfig(16, 2, sparse_stride=4)
    with pytest.raises(ValueError, match="sparse_summary must be at most sparse_stride=4, got 5"):
        TransformerConfig(16, 2, sparse="fixed", sparse_stride=4, sparse_summary=5)
    with pytest.raises(ValueError, match="sparse_summary applies to sparse='fixed' only"):
        TransformerConfig(16, 2, sparse="strided", sparse_stride=4, sparse_summary=2)
    with pytest.raises(ValueError, match="summary must be a positive int, got 0"):
        FixedPattern(3, 0)
    with pytest.raises(ValueError, match="summary must be an int in \\[1, stride=3\\], got 4"):
        FixedPattern(3, 4)
    with pytest.raises(ValueError, match="stride must be a positive int, got 0"):
        StridedPattern(0)
    with pytest.raises(ValueError, match="impl='flex' has no dropout"):
        SelfAttention(16, 2, impl="flex", dropout=0.1)
    with pytest.raises(TypeError, match="pattern must be an AttentionPattern"):
        SelfAttention(16, 2, pattern="strided")
    layer = SelfAttention(16, 2, causal=True, impl="flex", pattern=StridedPattern(2))
    with pytest.raises(ValueError, match="impl='flex' cannot compute gradients on the CPU"):
        layer(torch.randn(1, 4, 16))
    with pytest.raises(ValueError, match="an attention pattern needs the keys' positions"):
        AttentionMask(torch.arange(3), None, pattern=StridedPattern(2))


def test_flex_decodes_a_batch_with_a_cache_as_sdpa_does():
    from torchformer import generate

    torch.manual_seed(0)
    sdpa = GTransformer(16, 2, 2, 12, 20, positions="rotary", sparse="strided", sparse_stride=3).eval()
    flex = GTransformer(16, 2, 2, 12, 20, positions="rotary", sparse="strided", sparse_stride=3, impl="flex").eval()
    flex.load_state_dict(sdpa.state_dict())
    prompt = torch.randint(0, 20, (2, 4))  # two rows: the cache's mask of written slots is one row for both
    a, logp_a = generate(sdpa, prompt, 6, temperature=0, return_logprobs=True)
    b, logp_b = generate(flex, prompt, 6, temperature=0, return_logprobs=True)
    assert torch.equal(a, b)
    torch.testing.assert_close(logp_a, logp_b, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="impl='flex' has no dropout"):
        TransformerConfig(16, 2, impl="flex", dropout=0.1)
