"""Properties of torchformer.nn.attention: equivalence of the two paths, masking, causality, equivariance, cache."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchformer import AttentionMask, ContextCache, CrossAttention, KVCache, SelfAttention
from torchformer.nn.attention import attention_fast, attention_reference
from torchformer.nn.masks import causal_mask

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


def test_cross_attention_has_no_causal_option():
    with pytest.raises(TypeError, match="causal"):
        CrossAttention(16, 4, causal=True)


# ---- KV cache ----------------------------------------------------------------------------------------------


def run_in_chunks(att, x, chunks, cache, mask=None):
    """Feed ``x`` through ``att`` chunk by chunk with a cache, each chunk at its absolute positions."""
    outs, start = [], 0
    for n in chunks:
        positions = torch.arange(start, start + n)
        part_mask = None if mask is None else mask[:, start : start + n]
        outs.append(att(x[:, start : start + n], part_mask, positions=positions, cache=cache))
        start += n
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("impl", ["sdpa", "reference"])
@pytest.mark.parametrize("chunks", [[1] * 7, [3, 1, 2, 1], [7]])
@pytest.mark.parametrize("capacity", [7, 12])
def test_incremental_decoding_with_cache_equals_full_causal_pass(impl, chunks, capacity):
    att = make(16, 4, causal=True, impl=impl, dtype=torch.float64)
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    cache = KVCache(capacity)
    out = run_in_chunks(att, x, chunks, cache)
    assert cache.keys.shape == (2, 4, capacity, 4)  # allocated once, at its capacity
    torch.testing.assert_close(out, att(x), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("impl", ["sdpa", "reference"])
@pytest.mark.parametrize("chunks", [[1] * 7, [4, 3], [2, 1, 4]])
def test_cached_decoding_with_padding_equals_the_full_masked_pass(impl, chunks):
    # Fewer queries than keys and padding among the cached keys: the cache must remember which slots were padding,
    # and a query that sees no real key (row 1 starts with padding) must be exactly zero.
    att = make(16, 4, causal=True, impl=impl, dtype=torch.float64)
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    mask = torch.tensor([[True, True, False, True, False, True, True], [False, False, True, True, True, False, True]])
    out = run_in_chunks(att, x, chunks, KVCache(8), mask)
    full = att(x, mask)
    torch.testing.assert_close(out[mask], full[mask], atol=1e-12, rtol=1e-12)
    assert (out[1, :2] == 0).all() and (full[1, :2] == 0).all()


def test_cache_ignores_what_its_unwritten_slots_hold():
    att = make(16, 4, causal=True, dtype=torch.float64)
    x = torch.randn(1, 3, 16, dtype=torch.float64)
    clean, dirty = KVCache(6), KVCache(6)
    for cache in (clean, dirty):
        att(x[:, :2], positions=torch.arange(2), cache=cache)
    dirty.keys[:, :, 3:], dirty.values[:, :, 3:] = 1e4, -1e4  # slots after the new token's
    step = dict(positions=torch.tensor([2]))
    torch.testing.assert_close(att(x[:, 2:], cache=dirty, **step), att(x[:, 2:], cache=clean, **step), atol=0, rtol=0)


def test_only_written_slots_are_keys_whatever_the_positions():
    # A cache written at positions 5, 6, 7 and then 9: slots 0-4 and 8 were never written and hold zeros, which the
    # query at position 9 must not see, causal or not. Positions are only labels here (no position encoding).
    x, y = torch.randn(2, 3, 16, dtype=torch.float64), torch.randn(2, 1, 16, dtype=torch.float64)
    for causal in (True, False):
        att = make(16, 4, causal=causal, dtype=torch.float64)
        cache = KVCache(10)
        torch.testing.assert_close(att(x, positions=torch.arange(5, 8), cache=cache), att(x), atol=1e-12, rtol=0)
        out = att(y, positions=torch.tensor([9]), cache=cache)
        torch.testing.assert_close(out, att(torch.cat([x, y], dim=1))[:, -1:], atol=1e-12, rtol=0)
        keys = cache.keys
        cache.reset()  # forget, keep the memory: nothing of the first sequence is visible afterwards
        torch.testing.assert_close(att(y, positions=torch.tensor([2]), cache=cache), att(y), atol=1e-12, rtol=0)
        assert cache.keys is keys


def test_a_reset_cross_attention_cache_reads_the_new_context():
    att = make_cross()
    x, ctx = torch.randn(2, 1, 16).double(), torch.randn(2, 5, 16).double()
    cache = ContextCache()
    att.fill_cache(cache, ctx)
    att(x, cache=cache)
    cache.reset()
    assert not cache.filled
    att.fill_cache(cache, 2 * ctx[:, :3])  # another context, of another length
    torch.testing.assert_close(att(x, cache=cache), att(x, 2 * ctx[:, :3]))


def test_cache_is_written_in_place_and_reorder_keeps_or_reallocates():
    att = make(16, 4, causal=True)
    cache = KVCache(4)
    att(torch.randn(3, 2, 16), positions=torch.arange(2), cache=cache)
    keys = cache.keys
    att(torch.randn(3, 1, 16), positions=torch.tensor([2]), cache=cache)
    assert cache.keys is keys  # the same memory: what a compiled step or CUDA graph needs
    before = keys.clone()
    cache.reorder(torch.tensor([2, 0, 1]))
    assert cache.keys is keys and torch.equal(keys, before[[2, 0, 1]])
    cache.reorder(torch.tensor([0, 0, 1, 1]))  # another number of rows (beams): new buffers
    assert cache.keys.shape[0] == 4 and torch.equal(cache.keys, before[[2, 2, 0, 0]])


def test_cache_misuse_is_a_clear_error():
    att = make(16, 4, causal=True)
    cache = KVCache(4)
    att(torch.randn(3, 2, 16), positions=torch.arange(2), cache=cache)
    with pytest.raises(ValueError, match=r"holds keys of shape \(b, h, c, s\) = \(3, 4, 4, 4\).*\(2, 4, 1, 4\)"):
        att(torch.randn(2, 1, 16), positions=torch.tensor([2]), cache=cache)  # another batch size
    with pytest.raises(ValueError, match="holds keys of shape"):
        make(16, 2, causal=True)(torch.randn(3, 1, 16), positions=torch.tensor([2]), cache=cache)  # another model
    with pytest.raises(TypeError, match="holds keys of dtype torch.float32.*torch.float64"):
        att.double()(torch.randn(3, 1, 16, dtype=torch.float64), positions=torch.tensor([2]), cache=cache)
    with pytest.raises(ValueError, match="capacity must be a positive int"):
        KVCache(0)
    with pytest.raises(ValueError, match="4 slots"):
        att.float()(torch.randn(1, 5, 16), positions=torch.arange(5), cache=KVCache(4))


def test_cross_attention_cache_is_filled_once_and_read_by_every_step():
    att = make_cross()
    x, ctx = torch.randn(2, 3, 16).double(), torch.randn(2, 5, 16).double()
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    cache = ContextCache()
    att.fill_cache(cache, ctx, mask)
    keys, values = cache.keys, cache.values
    assert keys.shape == values.shape == (2, 4, 5, 4) and cache.mask is mask
    expected = att(x, ctx, mask)
    ctx.zero_()  # the cached keys are read, not recomputed: changing the context in place shows it
    steps = [att(x[:, i : i + 1], cache=cache, positions=torch.tensor([i])) for i in range(3)]
    torch.testing.assert_close(torch.cat(steps, dim=1), expected)  # the padding too comes from the cache
    assert cache.keys is keys and cache.values is values  # never rewritten
    # A context given with the cache would be a second source of the same keys, which could only disagree.
    with pytest.raises(ValueError, match="context and context_mask must be None with a cache"):
        att(x, ctx, cache=cache)
    with pytest.raises(ValueError, match="context and context_mask must be None with a cache"):
        att(x, None, mask, cache=cache)
    with pytest.raises(ValueError, match=r"already filled, with a context of 5 positions.*reset\(\)"):
        att.fill_cache(cache, ctx)
    with pytest.raises(ValueError, match="context must be given without a cache"):
        att(x)


def test_mask_from_positions_is_the_causal_mask_in_absolute_positions():
    # two queries at positions 3 and 4, keys in slots 0..5: the explicit mask for "the last t of u", then slot 5
    # (not written yet) hidden from both
    mask = AttentionMask(torch.tensor([3, 4]), torch.arange(6), causal=True)
    assert mask.allowed().tolist() == [row + [False] for row in causal_mask(2, 5).tolist()]
    assert mask.distance()[0].tolist() == [3, 2, 1, 0, -1, -2]
    assert AttentionMask(torch.arange(4), torch.arange(4), causal=True, aligned=True).needs_tensor is False


@pytest.mark.parametrize("causal", [True, False])
def test_one_query_at_the_last_key_needs_no_mask_tensor_and_its_rule_allows_every_key(causal):
    last = AttentionMask(torch.tensor([5]), torch.arange(6), causal=causal, ends_aligned=True)
    assert last.needs_tensor is False
    assert last.allowed() is None or bool(last.allowed().all())  # the rule itself: every key
    # Two queries (the causal rule hides slot 5 from the first), a window, or a key mask still need a tensor.
    assert AttentionMask(torch.tensor([4, 5]), torch.arange(6), causal=True, ends_aligned=True).needs_tensor
    assert AttentionMask(torch.tensor([5]), torch.arange(6), causal=causal, window=3, ends_aligned=True).needs_tensor
    assert AttentionMask(torch.tensor([5]), torch.arange(6), torch.ones(1, 6, dtype=torch.bool), causal=causal,
                         ends_aligned=True).needs_tensor


def test_attention_functions_agree_directly():
    q, k, v = (torch.randn(2, 3, 4, 8, dtype=torch.float64) for _ in range(3))
    allowed = torch.rand(2, 1, 4, 4) > 0.5
    ref, _ = attention_reference(q, k, v, allowed)
    torch.testing.assert_close(attention_fast(q, k, v, allowed), ref)


# ---- bad input (the models check their inputs; the modules check their arguments) ---------------------------


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="impl must be one of"):
        SelfAttention(16, 4, impl="fast")
    with pytest.raises(ValueError, match="dropout must be a float in"):
        SelfAttention(16, 4, dropout=1.5)
    with pytest.raises(ValueError, match="heads must be a positive int, got 0"):
        SelfAttention(16, 0)


def test_autocast_runs_in_low_precision():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert make(16, 4)(torch.randn(2, 5, 16)).dtype == torch.bfloat16


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


# ---- padding that holds garbage -----------------------------------------------------------------------------


@pytest.mark.parametrize("impl", ["sdpa", "reference"])
@pytest.mark.parametrize("garbage", [float("nan"), float("inf"), -float("inf")])
def test_nan_or_inf_in_padding_never_reaches_real_positions(impl, garbage):
    att = make(16, 4, causal=False, impl=impl, dtype=torch.float64)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    mask = torch.tensor([[True, True, True, False, False], [True, False, True, True, False]])
    dirty = x.masked_fill(~mask[:, :, None], garbage)
    torch.testing.assert_close(att(dirty, mask)[mask], att(x, mask)[mask], atol=0, rtol=0)
    cross = make_cross(impl=impl)
    q = torch.randn(2, 3, 16, dtype=torch.float64)
    torch.testing.assert_close(cross(q, dirty, mask), cross(q, x, mask), atol=0, rtol=0)


def test_a_cache_needs_positions_and_a_cross_cache_needs_filling():
    att = make(16, 4, causal=True)
    cache = KVCache(8)
    att(torch.randn(1, 3, 16), positions=torch.arange(3), cache=cache)
    with pytest.raises(ValueError, match="positions must be given with a cache"):
        att(torch.randn(1, 1, 16), cache=cache)  # the default 0 .. t-1 would overwrite slot 0
    cross, cross_cache = make_cross(), ContextCache()
    x = torch.randn(1, 1, 16).double()
    with pytest.raises(ValueError, match=r"never filled.*model.fill_caches\(caches, memory, src_mask\).*"
                                         r"CrossAttention.fill_cache"):
        cross(x, cache=cross_cache)
    cross.fill_cache(cross_cache, torch.randn(1, 7, 16).double())
    with pytest.raises(ValueError, match="holds a context of batch size 1, but the queries have batch size 2"):
        cross(torch.randn(2, 1, 16).double(), cache=cross_cache)
    cross_cache.reset()  # a new source: its keys are computed again, at its own length
    shorter = torch.randn(1, 4, 16).double()
    cross.fill_cache(cross_cache, shorter)
    torch.testing.assert_close(cross(x, cache=cross_cache), cross(x, shorter))


# ---- the two attention functions on their own ---------------------------------------------------------------


@pytest.mark.parametrize("t", [1, 2, 3, 5])
def test_attention_fast_without_a_mask_is_all_keys_or_plain_causal(t):
    """``allowed=None``: every key by default, the causal triangle with ``causal=True`` (for every length; t = 1
    and t = 2 are the small cases a length condition could get wrong)."""
    q, k, v = (torch.randn(2, 3, t, 4, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(attention_fast(q, k, v), attention_reference(q, k, v)[0])
    torch.testing.assert_close(attention_fast(q, k, v, causal=True), attention_reference(q, k, v, causal_mask(t))[0])


def test_attention_fast_gives_a_query_without_keys_zeros_as_the_reference_does():
    """The documented rule of both functions, called directly: a row of ``allowed`` with no True gives zero weights
    and a zero output, not NaN; the other rows are unaffected. (Modules zero such queries again afterwards, so only
    a direct call shows a missing guard.)"""
    q, k, v = (torch.randn(2, 3, n, 5, dtype=torch.float64) for n in (4, 6, 6))  # 4 queries, 6 keys
    allowed = torch.rand(2, 1, 4, 6, generator=torch.Generator().manual_seed(0)) > 0.3
    allowed[:, :, :, 0] = True
    allowed[0, 0, 2] = False  # query 2 of batch row 0 sees no key
    allowed[1, 0, 0] = False
    reference, weights = attention_reference(q, k, v, allowed)
    assert (weights[0, :, 2] == 0).all() and (reference[0, :, 2] == 0).all() and (reference[1, :, 0] == 0).all()
    fast = attention_fast(q, k, v, allowed)
    assert torch.isfinite(fast).all()
    torch.testing.assert_close(fast, reference)


@pytest.mark.parametrize("p", [0.2, 0.6])
@pytest.mark.parametrize("masked", [False, True])
def test_attention_dropout_drops_weights_with_probability_p_and_rescales_the_rest(p, masked):
    """With the identity as values, the output is the (dropped-out) weights themselves: a fraction p of them is
    exactly zero, the others are the weights divided by 1 - p. Both functions, on 4 x 3 x 24 x 24 weights."""
    torch.manual_seed(0)
    q, k = (torch.randn(4, 3, 24, 8, dtype=torch.float64) for _ in range(2))
    identity = torch.eye(24, dtype=torch.float64).expand(4, 3, 24, 24)
    allowed = causal_mask(24) if masked else None
    _, weights = attention_reference(q, k, identity, allowed)
    real = weights > 0
    for mixed in (attention_reference(q, k, identity, allowed, dropout=p)[0],
                  attention_fast(q, k, identity, allowed, dropout=p, causal=False)):
        dropped = (mixed[real] == 0).double().mean().item()
        assert abs(dropped - p) < 0.03, dropped  # about 4 * 3 * 300 = 3600 weights or more: sd of 0.008 or less
        kept = mixed[real] != 0
        torch.testing.assert_close(mixed[real][kept], weights[real][kept] / (1 - p))
        assert (mixed[~real] == 0).all()


@pytest.mark.parametrize("impl", ["sdpa", "reference"])
@pytest.mark.parametrize("masked", [False, True])
def test_attention_dropout_acts_in_training_only(impl, masked):
    att = make(16, 4, causal=True, dropout=0.5, impl=impl, dtype=torch.float64)
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    mask = random_mask(2, 6) if masked else None
    torch.manual_seed(1)
    trained = att.train()(x, mask)
    assert not torch.allclose(trained, att.eval()(x, mask))
    torch.testing.assert_close(att.eval()(x, mask), make(16, 4, causal=True, impl=impl, dtype=torch.float64)(x, mask))


@pytest.mark.parametrize("impl", ["sdpa", "reference"])
@pytest.mark.parametrize("kv_heads", [None, 2])
def test_cached_decoding_keeps_the_sliding_window(impl, kv_heads):
    """Past the prompt, each cached step must still see only the last ``window`` positions."""
    att = make(16, 4, causal=True, window=3, impl=impl, kv_heads=kv_heads, dtype=torch.float64)
    x = torch.randn(2, 8, 16, dtype=torch.float64)
    out = run_in_chunks(att, x, [3, 1, 1, 2, 1], KVCache(8))
    torch.testing.assert_close(out, att(x), atol=1e-12, rtol=1e-12)
    assert not torch.allclose(out, make(16, 4, causal=True, impl=impl, kv_heads=kv_heads, dtype=torch.float64)(x))


@pytest.mark.parametrize("impl", ["sdpa", "reference"])
def test_attend_returns_no_weights_unless_asked(impl):
    """A subclass calling ``super().attend(q, k, v, mask)`` gets ``(out, None)`` (docs/extending.md)."""
    att = make(16, 4, causal=True, impl=impl)
    q = k = v = torch.randn(2, 4, 5, 4)
    mask = AttentionMask(torch.arange(5), torch.arange(5), causal=True, aligned=True)
    out, weights = att.attend(q, k, v, mask)
    assert weights is None and out.shape == (2, 4, 5, 4)
    out_w, weights = att.attend(q, k, v, mask, return_weights=True)
    assert weights.shape == (2, 4, 5, 5)
    torch.testing.assert_close(out_w, out)


def test_plain_self_attention_passes_no_mask_tensor():
    """Without padding or a cache, the mask is "everything" or "plain causal", which SDPA applies by itself: no mask
    tensor, so the fused flash kernels stay available on a GPU. With padding there is one."""
    masks = []

    class Recording(SelfAttention):
        def attend(self, q, k, v, mask, *, return_weights=False):
            masks.append(mask)
            return super().attend(q, k, v, mask, return_weights=return_weights)

    x = torch.randn(2, 5, 16)
    for causal in (False, True):
        Recording(16, 4, causal=causal)(x)
        assert masks[-1].needs_tensor is False and masks[-1].aligned
    Recording(16, 4, causal=True)(x, random_mask(2, 5))
    assert masks[-1].needs_tensor is True


def test_a_cross_attention_cache_follows_the_reordered_rows():
    """Beam search reorders the cross-attention cache's rows, the padding's too, with the self-attention's."""
    att = make_cross()
    x, ctx = torch.randn(3, 1, 16).double(), torch.randn(3, 5, 16).double()
    mask = torch.tensor([[True] * 5, [True] * 2 + [False] * 3, [True] * 4 + [False]])
    cache = ContextCache()
    att.fill_cache(cache, ctx, mask)
    rows = torch.tensor([1, 1, 2, 0])  # another number of rows, as beams repeat their prompt
    cache.reorder(rows)
    torch.testing.assert_close(att(x[rows], cache=cache), att(x[rows], ctx[rows], mask[rows]))
    ContextCache().reorder(rows)  # an empty cache is left as it is


@pytest.mark.parametrize("masked", [False, True])
def test_attention_dropout_acts_on_the_fast_path(masked):
    # With no mask at all, SDPA itself must apply the dropout (its dropout_p): training mode is random, evaluation
    # mode is not, and the training output differs from the evaluation one.
    torch.manual_seed(0)
    attention = SelfAttention(16, 4, dropout=0.5)
    x = torch.randn(2, 6, 16)
    mask = torch.ones(2, 6, dtype=torch.bool) if masked else None
    attention.train()
    first, second = attention(x, mask), attention(x, mask)
    attention.eval()
    plain = attention(x, mask)
    assert not torch.allclose(first, second) and not torch.allclose(first, plain)
    torch.testing.assert_close(attention(x, mask), plain, rtol=0, atol=0)


def test_every_tensor_follows_the_input_device():
    # On the meta device a tensor made without device= (on the CPU) cannot meet the inputs: every mask, position
    # and cache tensor must be made where the inputs are. Covers the CUDA rule on a machine without a GPU.
    from torchformer import GTransformer, Seq2SeqTransformer

    meta = torch.device("meta")
    x = torch.zeros(2, 5, dtype=torch.long, device=meta)
    mask = torch.ones(2, 5, dtype=torch.bool, device=meta)
    for positions in ("learned", "alibi"):
        model = GTransformer(16, 4, 2, 12, 30, positions=positions).to(meta)
        assert model(x).device == meta
        caches = model.new_caches()
        assert model(x, caches=caches, positions=torch.arange(5, device=meta)).device == meta
    seq2seq = Seq2SeqTransformer(16, 4, 1, 12, 30, tgt_tokens=20).to(meta)
    assert seq2seq(x, torch.zeros(2, 4, dtype=torch.long, device=meta), mask).device == meta
    attention = SelfAttention(16, 4, causal=True).to(meta)
    assert attention(torch.randn(2, 5, 16, device=meta), mask).device == meta
    cross = CrossAttention(16, 4).to(meta)
    context = torch.randn(2, 7, 16, device=meta)
    assert cross(torch.randn(2, 5, 16, device=meta), context).device == meta
    cache = ContextCache()
    cross.fill_cache(cache, context, mask[:, :1].expand(2, 7))
    assert cross(torch.randn(2, 1, 16, device=meta), cache=cache).device == meta
    assert causal_mask(3, device=meta).device == meta


@pytest.mark.parametrize("name", ["wide", "causal"])
def test_a_flag_that_is_not_a_bool_is_named(name):
    with pytest.raises(TypeError, match=rf"^{name} must be a bool"):
        SelfAttention(16, 4, **{name: 1})


@pytest.mark.parametrize("impl", ["sdpa", "reference"])
def test_a_window_of_one_sees_only_itself(impl):
    # window=1 is the smallest window: each query's only key is its own position, so the attention weights are the
    # identity and each output is its own value vector, mixed by unifyheads.
    torch.manual_seed(0)
    attention = SelfAttention(16, 4, causal=True, window=1, impl=impl)
    x = torch.randn(2, 6, 16)
    values = attention.tovalues(x)  # (b, t, h * s): with weights = identity, the merged heads are the values
    torch.testing.assert_close(attention(x), attention.unifyheads(values), rtol=1e-5, atol=1e-6)


def test_positions_are_required_with_a_cache_and_the_message_says_so():
    attention = SelfAttention(16, 4, causal=True)
    with pytest.raises(ValueError, match=r"^positions must be given with a cache"):
        attention(torch.randn(1, 2, 16), cache=KVCache(4))


@pytest.mark.parametrize("positions", ["alibi", "relative"])
def test_a_float32_bias_meets_bfloat16_scores_under_autocast(positions):
    # Under autocast the projections give bfloat16 queries while the bias (ALiBi's slopes, the relative table) stays
    # float32: the fast path must bring the bias to the queries' dtype (SDPA refuses a float mask of another
    # dtype), and both paths must agree.
    torch.manual_seed(0)
    x = torch.randn(2, 6, 16)
    outputs = []
    for impl in ("sdpa", "reference"):
        torch.manual_seed(1)
        attention = SelfAttention(16, 4, causal=True, positions=positions, impl=impl)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = attention(x)
        outputs.append(out.float())
    torch.testing.assert_close(outputs[0], outputs[1], rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_grouped_heads_are_shared_without_a_copy_and_equal_the_reference_path(kv_heads):
    # The fast path hands SDPA the g key/value heads (enable_gqa); the reference path repeats them: equal outputs and
    # gradients, with padding and with a cache.
    fast = make(16, 4, causal=True, kv_heads=kv_heads, dtype=torch.float64)
    reference = make(16, 4, causal=True, kv_heads=kv_heads, impl="reference", dtype=torch.float64)
    reference.load_state_dict(fast.state_dict())
    x = torch.randn(2, 6, 16, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True] * 6, [False, True, True, True, True, True]])
    seen = []
    original = fast.attend
    fast.attend = lambda q, k, v, m, **kw: (seen.append(k.size(1)), original(q, k, v, m, **kw))[1]
    out = fast(x, mask)
    del fast.attend
    assert seen == [kv_heads]  # attend received the g heads themselves
    expected = reference(x, mask)
    torch.testing.assert_close(out[mask], expected[mask], atol=1e-12, rtol=0)
    (grad,) = torch.autograd.grad(out[mask].sum(), x)
    (expected_grad,) = torch.autograd.grad(expected[mask].sum(), x)
    torch.testing.assert_close(grad, expected_grad, atol=1e-12, rtol=0)
    with torch.no_grad():
        cached = run_in_chunks(fast, x.detach(), [4, 1, 1], KVCache(8))
    torch.testing.assert_close(cached, reference(x.detach()), atol=1e-12, rtol=0)


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_one_query_per_head_attends_as_rows_of_its_key_head(kv_heads):
    # A decoding step's single query per head, every key allowed: the fast path attends the h / g query heads of a
    # key head as h / g rows against it. Equal to the reference with the keys repeated per query head, also for
    # values of another head size than the queries' and for a cache's strided slice of keys.
    torch.manual_seed(0)
    q = torch.randn(3, 8, 1, 6, dtype=torch.float64)
    buffer = torch.randn(3, kv_heads, 9, 6, dtype=torch.float64)
    values = torch.randn(3, kv_heads, 9, 5, dtype=torch.float64)
    k, v = buffer[:, :, :7], values[:, :, :7]  # (b, g, u, s): the filled prefix of a preallocated cache
    repeated = [x.repeat_interleave(8 // kv_heads, dim=1) for x in (k, v)]
    for scale in (None, 0.5):
        expected, _ = attention_reference(q, *repeated, scale=scale)
        out = attention_fast(q, k, v, causal=True, scale=scale)
        assert out.shape == (3, 8, 1, 5)
        torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)
