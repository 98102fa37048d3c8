"""Properties of torchformer.nn.attention: equivalence of the two paths, masking, causality, equivariance, cache."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchformer import CrossAttention, KVCache, SelfAttention
from torchformer.nn.attention import StaticKVCache
from torchformer.nn.attention import attention_fast, attention_reference, build_allowed

torch.set_num_threads(2)


def make(emb=16, heads=4, *, dtype=torch.float32, seed=0, **kwargs):
    torch.manual_seed(seed)
    return SelfAttention(emb, heads, **kwargs).to(dtype)


def random_mask(b, t, seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(b, t, generator=g) > 0.4
    mask[:, 0] = True  # at least one real token per row (rows without are tested separately)
    return mask


def forward_and_grads(module, x, mask):
    x = x.clone().requires_grad_(True)
    module.zero_grad()
    out = module(x, mask)
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
    grads = [x.grad] + [p.grad for p in module.parameters()]
    return out.detach(), grads


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_fast_path_equals_reference_forward_and_backward(dtype, tol, wide, causal, masked):
    fast = make(16, 4, wide=wide, causal=causal, dtype=dtype)
    ref = make(16, 4, wide=wide, causal=causal, dtype=dtype, impl="reference")
    ref.load_state_dict(fast.state_dict())
    x = torch.randn(3, 7, 16, dtype=dtype)
    mask = random_mask(3, 7) if masked else None
    out_f, grads_f = forward_and_grads(fast, x, mask)
    out_r, grads_r = forward_and_grads(ref, x, mask)
    torch.testing.assert_close(out_f, out_r, atol=tol, rtol=tol)
    for gf, gr in zip(grads_f, grads_r):
        torch.testing.assert_close(gf, gr, atol=tol, rtol=tol)


@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 3),
    t=st.integers(1, 9),
    heads=st.integers(1, 4),
    wide=st.booleans(),
    causal=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_fast_equals_reference_for_random_shapes(b, t, heads, wide, causal, seed):
    emb = 4 * heads
    fast = make(emb, heads, wide=wide, causal=causal, dtype=torch.float64, seed=seed)
    x = torch.randn(b, t, emb, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    mask = torch.rand(b, t, generator=torch.Generator().manual_seed(seed + 1)) > 0.3
    out_fast = fast(x, mask)
    fast.impl = "reference"
    torch.testing.assert_close(out_fast, fast(x, mask), atol=1e-10, rtol=1e-10)


def test_reference_matches_the_formula_written_out():
    """softmax(Q K^T / sqrt(s)) V per head, computed by hand from the module's own weight matrices."""
    att = make(8, 2, dtype=torch.float64, impl="reference")
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    q, k, v = (x @ lin.weight.T for lin in (att.toqueries, att.tokeys, att.tovalues))  # (b, t, e)
    heads = []
    for h in range(2):
        sl = slice(4 * h, 4 * h + 4)  # narrow heads: head h owns chunk h of the projected embedding
        w = torch.softmax(q[..., sl] @ k[..., sl].transpose(1, 2) / math.sqrt(4), dim=-1)
        heads.append(w @ v[..., sl])
    expected = att.unifyheads(torch.cat(heads, dim=-1))
    torch.testing.assert_close(att(x), expected)


def test_narrow_and_wide_head_sizes():
    narrow, wide = SelfAttention(12, 3), SelfAttention(12, 3, wide=True)
    assert narrow.toqueries.weight.shape == (12, 12) and narrow.head_size == 4
    assert wide.toqueries.weight.shape == (36, 12) and wide.head_size == 12
    assert wide.unifyheads.weight.shape == (12, 36)
    assert SelfAttention(10, 3, wide=True)(torch.randn(2, 4, 10)).shape == (2, 4, 10)  # no divisibility needed


def test_narrow_heads_require_divisibility():
    with pytest.raises(ValueError, match=r"emb \(10\).*heads \(3\)"):
        SelfAttention(10, 3)


@pytest.mark.parametrize("impl", ["sdpa", "reference"])
@pytest.mark.parametrize("wide", [False, True])
def test_causal_attention_never_looks_ahead(impl, wide):
    att = make(16, 4, causal=True, wide=wide, impl=impl)
    x = torch.randn(2, 8, 16)
    out = att(x)
    for j in range(8):
        changed = x.clone()
        changed[:, j:] = torch.randn(2, 8 - j, 16)
        torch.testing.assert_close(att(changed)[:, :j], out[:, :j])
        assert not torch.allclose(att(changed)[:, j], out[:, j])  # ... while position j itself does see x[j]


@pytest.mark.parametrize("impl", ["sdpa", "reference"])
def test_permutation_equivariance(impl):
    att = make(16, 4, impl=impl, dtype=torch.float64)
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    mask = random_mask(2, 9)
    perm = torch.randperm(9)
    torch.testing.assert_close(att(x[:, perm], mask[:, perm]), att(x, mask)[:, perm])


@pytest.mark.parametrize("impl", ["sdpa", "reference"])
@pytest.mark.parametrize("causal", [False, True])
def test_padding_does_not_change_real_positions(impl, causal):
    att = make(16, 4, impl=impl, causal=causal, dtype=torch.float64)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    padded = torch.cat([x, 100 * torch.randn(2, 4, 16, dtype=torch.float64)], dim=1)  # garbage in padding
    mask = torch.tensor([[True] * 5 + [False] * 4] * 2)
    torch.testing.assert_close(att(padded, mask)[:, :5], att(x))


@pytest.mark.parametrize("causal", [False, True])
def test_attention_weights_rows_sum_to_one_and_zero_where_masked(causal):
    att = make(16, 4, causal=causal)
    mask = random_mask(3, 6)
    x = torch.randn(3, 6, 16)
    out, weights = att(x, mask, return_weights=True)
    assert weights.shape == (3, 4, 6, 6)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 4, 6))
    assert (weights.masked_select(~mask[:, None, None, :].expand_as(weights)) == 0).all()
    if causal:
        assert (weights.triu(diagonal=1) == 0).all()
    torch.testing.assert_close(out, att(x, mask))  # the weights come with the same output as the fast path


@pytest.mark.parametrize("impl", ["sdpa", "reference"])
@pytest.mark.parametrize("causal", [False, True])
def test_query_without_any_real_key_gives_zero_not_nan(impl, causal):
    att = make(16, 4, impl=impl, causal=causal)
    x = torch.randn(2, 4, 16, requires_grad=True)
    mask = torch.tensor([[False] * 4, [False, True, True, True]])
    out = att(x, mask)
    assert torch.isfinite(out).all()
    assert (out[0] == 0).all()  # no real key at all
    if causal:
        assert (out[1, 0] == 0).all()  # query 0 may only see key 0, which is padding
    out.sum().backward()
    assert torch.isfinite(x.grad).all() and all(torch.isfinite(p.grad).all() for p in att.parameters())


def test_every_parameter_gets_a_gradient():
    for kwargs in [{}, {"wide": True}, {"kqnorm": True}]:
        att = make(16, 4, **kwargs)
        att(torch.randn(2, 5, 16)).pow(2).sum().backward()
        for name, p in att.named_parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_kqnorm_paths_agree():
    fast = make(16, 4, kqnorm=True, causal=True, dtype=torch.float64)
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    out = fast(x)
    fast.impl = "reference"
    torch.testing.assert_close(out, fast(x))


def test_dtype_and_device_follow_inputs():
    att = make(16, 4, dtype=torch.float64)
    assert att(torch.randn(1, 3, 16, dtype=torch.float64)).dtype == torch.float64


# ---- cross-attention ---------------------------------------------------------------------------------------


def make_cross(emb=16, heads=4, *, seed=0, **kwargs):
    torch.manual_seed(seed)
    return CrossAttention(emb, heads, **kwargs).double()


@pytest.mark.parametrize("wide", [False, True])
def test_cross_attention_paths_agree_and_ignore_context_padding(wide):
    att = make_cross(wide=wide)
    x = torch.randn(2, 3, 16, dtype=torch.float64)
    ctx = torch.randn(2, 5, 16, dtype=torch.float64)
    padded = torch.cat([ctx, torch.randn(2, 2, 16, dtype=torch.float64)], dim=1)
    mask = torch.tensor([[True] * 5 + [False] * 2] * 2)
    out = att(x, ctx)
    assert out.shape == (2, 3, 16)
    torch.testing.assert_close(att(x, padded, mask), out)
    att.impl = "reference"
    torch.testing.assert_close(att(x, padded, mask), out)
    _, weights = att(x, padded, mask, return_weights=True)
    assert weights.shape == (2, 4, 3, 7) and (weights[..., 5:] == 0).all()


def test_cross_attention_errors():
    att = make_cross()
    with pytest.raises(ValueError, match="same batch size"):
        att(torch.randn(2, 3, 16).double(), torch.randn(3, 5, 16).double())
    with pytest.raises(ValueError, match=r"context_mask must have shape"):
        att(torch.randn(2, 3, 16).double(), torch.randn(2, 5, 16).double(), torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="cannot be causal"):
        CrossAttention(16, 4, causal=True)


# ---- KV cache ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["sdpa", "reference"])
@pytest.mark.parametrize("chunks", [[1] * 7, [3, 1, 2, 1], [7]])
def test_incremental_decoding_with_cache_equals_full_causal_pass(impl, chunks):
    att = make(16, 4, causal=True, impl=impl, dtype=torch.float64)
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    cache, outs, start = KVCache(), [], 0
    for n in chunks:
        outs.append(att(x[:, start : start + n], cache=cache))
        start += n
    assert len(cache) == 7
    torch.testing.assert_close(torch.cat(outs, dim=1), att(x), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("impl", ["sdpa", "reference"])
@pytest.mark.parametrize("wide", [False, True])
def test_static_cache_steps_equal_the_growing_cache(impl, wide):
    # Prompt of 3 into a growing cache, copied into buffers of 8 slots, then 4 one-token steps at a position tensor.
    att = make(16, 4, causal=True, wide=wide, impl=impl, dtype=torch.float64)
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    grown = KVCache()
    att(x[:, :3], cache=grown)
    position = torch.zeros((), dtype=torch.long)
    static = StaticKVCache.from_cache(grown, 8, position)
    keys = static.keys
    for i in range(3, 7):
        expected = att(x[:, i : i + 1], cache=grown)
        position.fill_(i)
        torch.testing.assert_close(att(x[:, i : i + 1], cache=static), expected, atol=1e-12, rtol=1e-12)
    assert static.keys is keys and keys.shape == (2, 4, 8, 16 if wide else 4)  # written in place, never resized
    torch.testing.assert_close(static.keys[:, :, :7], grown.keys, atol=0, rtol=0)
    assert static.key_mask(None).tolist() == [[True] * 7 + [False]] * 2  # slots 0..position are the keys


def test_static_cache_ignores_what_its_unfilled_slots_hold():
    att = make(16, 4, causal=True, dtype=torch.float64)
    x = torch.randn(1, 3, 16, dtype=torch.float64)
    grown = KVCache()
    att(x[:, :2], cache=grown)
    position = torch.tensor(2)
    clean = StaticKVCache.from_cache(grown, 6, position)
    dirty = StaticKVCache.from_cache(grown, 6, position)
    dirty.keys[:, :, 3:], dirty.values[:, :, 3:] = 1e4, -1e4  # slots after the new token's
    torch.testing.assert_close(att(x[:, 2:], cache=dirty), att(x[:, 2:], cache=clean), atol=0, rtol=0)
    dirty.load(grown)  # loading again clears the slots beyond the prompt
    assert dirty.keys[:, :, 2:].abs().sum() == 0


def test_static_cache_reorder_is_in_place_and_errors_are_clear():
    att = make(16, 4, causal=True)
    grown = KVCache()
    att(torch.randn(3, 2, 16), cache=grown)
    static = StaticKVCache.from_cache(grown, 4, torch.tensor(2))
    keys, before = static.keys, static.keys.clone()
    static.reorder(torch.tensor([2, 0, 1]))
    assert static.keys is keys and torch.equal(keys, before[[2, 0, 1]])
    with pytest.raises(ValueError, match=r"keeps its batch size \(3\).*got 2"):
        static.reorder(torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"one new position per step.*got \(3, 4, 2, 4\)"):
        att(torch.randn(3, 2, 16), cache=static)
    with pytest.raises(ValueError, match="mask cannot be used with a StaticKVCache"):
        att(torch.randn(3, 1, 16), torch.ones(3, 3, dtype=torch.bool), cache=static)
    with pytest.raises(TypeError, match="does not know its length on the host"):
        len(static)
    assert static  # truthy although len() cannot answer, so `if cache:` works
    with pytest.raises(TypeError, match="new keys have dtype torch.float64 but the cache holds torch.float32"):
        att.double()(torch.randn(3, 1, 16, dtype=torch.float64), cache=static)
    with pytest.raises(ValueError, match=r"position must be a 0-dim torch.long tensor.*shape \(1,\)"):
        StaticKVCache(keys, keys.clone(), torch.tensor([2]))
    with pytest.raises(ValueError, match="do not fit buffers of shape"):
        StaticKVCache.from_cache(grown, 1, torch.tensor(0))  # 2 cached positions, 1 slot
    with pytest.raises(ValueError, match="cache is empty"):
        StaticKVCache.from_cache(KVCache(), 4, torch.tensor(0))


def test_cross_attention_cache_reuses_context_keys():
    att = make_cross()
    x, ctx = torch.randn(2, 1, 16).double(), torch.randn(2, 5, 16).double()
    cache = KVCache()
    first = att(x, ctx, cache=cache)
    keys = cache.keys
    second = att(x, ctx * 0, cache=cache)  # the cached context wins: it does not change during decoding
    assert cache.keys is keys
    torch.testing.assert_close(first, second)


def test_build_allowed_with_offset_is_causal_in_absolute_positions():
    allowed = build_allowed(None, causal=True, t=2, u=5, device=torch.device("cpu"))
    # the two queries are positions 3 and 4 of 5
    assert allowed.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]


def test_attention_functions_agree_directly():
    q, k, v = (torch.randn(2, 3, 4, 8, dtype=torch.float64) for _ in range(3))
    allowed = torch.rand(2, 1, 4, 4) > 0.5
    ref, _ = attention_reference(q, k, v, allowed)
    torch.testing.assert_close(attention_fast(q, k, v, allowed), ref)


# ---- bad input ---------------------------------------------------------------------------------------------


def test_bad_inputs_raise_clear_errors():
    att = make(16, 4)
    with pytest.raises(ValueError, match=r"x must have shape \(b, t, 16\).*got shape \(5, 16\)"):
        att(torch.randn(5, 16))
    with pytest.raises(ValueError, match=r"embedding size 16.*got shape \(2, 5, 12\)"):
        att(torch.randn(2, 5, 12))
    with pytest.raises(TypeError, match="floating point.*torch.int64"):
        att(torch.ones(2, 5, 16, dtype=torch.long))
    with pytest.raises(ValueError, match=r"mask must have shape \(b, t\) = \(2, 5\), got \(2, 4\)"):
        att(torch.randn(2, 5, 16), torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask must have dtype torch.bool.*torch.int64"):
        att(torch.randn(2, 5, 16), torch.ones(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="impl must be one of"):
        SelfAttention(16, 4, impl="fast")
    with pytest.raises(ValueError, match="dropout must be a float in"):
        SelfAttention(16, 4, dropout=1.5)
    with pytest.raises(ValueError, match="heads must be a positive int, got 0"):
        SelfAttention(16, 0)


def test_a_failed_cached_call_leaves_the_cache_unchanged():
    att = make(16, 4, causal=True)
    x, cache = torch.randn(2, 5, 16), KVCache()
    att(x[:, :2], cache=cache)
    bad_mask = torch.ones(2, 2, dtype=torch.bool)  # must cover the 2 cached + 1 new positions
    with pytest.raises(ValueError, match=r"mask must have shape \(b, len\(cache\) \+ t\) = \(2, 3\), got \(2, 2\)"):
        att(x[:, 2:3], bad_mask, cache=cache)
    assert len(cache) == 2


def test_dtype_mismatch_is_a_clear_error_except_under_autocast():
    att = make(16, 4)
    with pytest.raises(TypeError, match=r"x has dtype torch.float64 but the module's parameters are torch.float32"):
        att(torch.randn(2, 5, 16, dtype=torch.float64))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert att(torch.randn(2, 5, 16)).dtype == torch.bfloat16
    with pytest.raises(TypeError, match="context has dtype torch.float64"):
        make_cross().float()(torch.randn(1, 2, 16), torch.randn(1, 3, 16, dtype=torch.float64))


# --- CUDA only: the fast path really reaches the fused kernels, and stays equal to the reference in bf16 ---------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
@pytest.mark.parametrize("wide", [False, True])
def test_causal_fast_path_runs_on_the_flash_kernel_on_cuda(wide):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    attn = make(128, 2, wide=wide, causal=True).cuda()
    x = torch.randn(2, 64, 128, device="cuda")
    # With only flash attention allowed, SDPA raises if our call (mask, shapes, dtype) cannot use it.
    with torch.autocast("cuda", dtype=torch.bfloat16), sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        out = attn(x)
    ref = make(128, 2, wide=wide, causal=True, dtype=torch.float64, impl="reference").cuda()
    ref.load_state_dict(attn.state_dict())
    expected = ref(x.double())
    error = (out.double() - expected).norm() / expected.norm()
    assert error < 1e-2, f"bf16 relative error {error:.2e}"  # bf16 operands: 1e-3 to 1e-2


@cuda
def test_padding_mask_fast_path_matches_float64_reference_on_cuda():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    fast = make(64, 4).cuda()
    ref = make(64, 4, dtype=torch.float64, impl="reference").cuda()
    ref.load_state_dict(fast.state_dict())
    x = torch.randn(3, 33, 64, device="cuda")
    mask = random_mask(3, 33).cuda()
    # A boolean mask rules flash attention out; the memory-efficient kernel must take it.
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        out = fast(x, mask)
    expected = ref(x.double(), mask)
    assert ((out.double() - expected).norm() / expected.norm()) < 1e-5  # float32 (tf32 is off by default)
    assert torch.isfinite(out).all()
