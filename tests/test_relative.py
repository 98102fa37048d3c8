"""Position schemes inside attention (rotary, ALiBi, relative bias), grouped-query attention and sliding windows:
each against an independent reference (the formula written out, an explicit mask or bias), plus the properties
that make them worth having (shift invariance, longer inputs) and cached = recomputed decoding."""

from __future__ import annotations

import math
import pickle

import pytest
import torch

from torchformer import (
    GTransformer, KVCache, SelfAttention, Seq2SeqTransformer, StaticCacheGenerator, TransformerConfig, generate,
    load_model, seq2seq_generate,
)
from torchformer.train.checkpoint import save_checkpoint
from torchformer.nn.masks import AttentionMask
from torchformer.nn.relative import (
    InterleavedRotary, RelativeBias, RotateHalves, Rotary, alibi_slopes, relative_bucket, rotate_halves,
)

torch.set_num_threads(2)
SCHEMES = ["rotary", "rotary_interleaved", "alibi", "relative"]


def attention(seed=0, **kwargs):
    torch.manual_seed(seed)
    att = SelfAttention(16, 4, **kwargs).double()
    for p in att.parameters():  # the relative bias starts at zero: give it values, or its tests test nothing
        if p.dim() == 2 and p.shape[-1] == 4 and p.abs().sum() == 0:
            torch.nn.init.normal_(p)
    return att


# ---- rotary ----------------------------------------------------------------------------------------------------


# Which coordinates each layout pairs: pair m of a head of size s.
PAIRS = {Rotary: lambda m, s: (m, m + s // 2), InterleavedRotary: lambda m, s: (2 * m, 2 * m + 1)}


@pytest.mark.parametrize("cls", [Rotary, InterleavedRotary])
def test_rotary_rotates_each_pair_by_its_angle(cls):
    rotary, s = cls(8), 8
    x = torch.randn(1, 1, 3, s, dtype=torch.float64)
    positions = torch.tensor([0, 5, 1000])
    out = rotary.rotate(x, positions)
    for t, p in enumerate(positions.tolist()):
        for m in range(s // 2):
            angle = p * 10000 ** (-2 * m / s)
            first, second = PAIRS[cls](m, s)
            a, b = x[0, 0, t, first].item(), x[0, 0, t, second].item()
            expected = (a * math.cos(angle) - b * math.sin(angle), a * math.sin(angle) + b * math.cos(angle))
            assert out[0, 0, t, first].item() == pytest.approx(expected[0], abs=1e-12)
            assert out[0, 0, t, second].item() == pytest.approx(expected[1], abs=1e-12)


def test_the_two_rotary_layouts_are_one_rotation_with_the_coordinates_permuted():
    """Interleaved = halves after moving coordinate 2m to m and 2m+1 to m + s/2 (and back): so a model of one layout
    is a model of the other with its query and key projections' rows permuted within each head."""
    s = 8
    x = torch.randn(2, 3, 5, s, dtype=torch.float64)
    positions = torch.tensor([0, 1, 7, 300, 4096])
    to_halves = torch.cat([torch.arange(0, s, 2), torch.arange(1, s, 2)])  # (0, 2, 4, 6, 1, 3, 5, 7)
    back = torch.argsort(to_halves)
    rotated = Rotary(s).rotate(x[..., to_halves], positions)[..., back]
    torch.testing.assert_close(rotated, InterleavedRotary(s).rotate(x, positions), rtol=0, atol=1e-12)


@pytest.mark.parametrize("layout", ["split heads", "split from a wider projection", "contiguous", "five dims"])
def test_fast_rotation_equals_the_formula_forward_backward_and_keeps_the_layout(layout, monkeypatch):
    # RotateHalves (written into x's layout, the gradient as the opposite rotation) against rotate_halves under
    # autograd. Queries as attention makes them (a transposed view of the projection (b, t, h, s), also of a wider
    # one) take the path on whole rows of h * s numbers; any other layout the path on halves.
    monkeypatch.setattr(RotateHalves, "rows_from", 0)  # the rows path for these few numbers too
    torch.manual_seed(0)
    rotary, positions = Rotary(8), torch.tensor([3, 4, 5, 9, 20])
    cos, sin = rotary.angles(positions, torch.float64)
    b, t, h, s = 2, 5, 3, 8
    projected = torch.randn(b, t, 2 * h * s, dtype=torch.float64)  # (b, t, 2 h s): queries, then something else
    results = []
    for rotate in (RotateHalves.apply, rotate_halves):
        leaf = projected.clone().requires_grad_()
        x = {"split heads": lambda p: p[..., :h * s].contiguous().view(b, t, h, s).transpose(1, 2),
             "split from a wider projection": lambda p: p[..., :h * s].view(b, t, h, s).transpose(1, 2),
             "contiguous": lambda p: p[..., :h * s].reshape(b, t, h, s).transpose(1, 2).contiguous(),
             "five dims": lambda p: p.view(b, t, 2, h, s).permute(2, 0, 3, 1, 4)}[layout](leaf)  # (b, h, t, s)
        out = rotate(x, cos, sin)
        grad = torch.linspace(-1, 1, out.numel(), dtype=torch.float64)
        # the gradient in the layout scaled_dot_product_attention's backward pass returns (heads side by side), so
        # that the backward pass takes the rows path where the forward pass does
        out.backward(grad.view(b, t, h, s).transpose(1, 2) if layout.startswith("split") else grad.view(out.shape))
        results.append((out, leaf.grad))
    torch.testing.assert_close(results[0], results[1], atol=1e-12, rtol=1e-12)
    assert RotateHalves.heads_side_by_side(x) == layout.startswith("split")
    assert results[0][0].transpose(-3, -2).is_contiguous() == layout.startswith("split")  # no copy on the way back
    x = projected[..., :h * s].reshape(b, t, h, s).transpose(1, 2).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: rotary.rotate(x, positions), (x,))
    assert torch.autograd.gradgradcheck(lambda x: rotary.rotate(x, positions), (x,))


def test_the_rows_path_is_taken_for_a_training_batch_not_for_a_decoding_step(monkeypatch):
    rows = []
    def rotate_rows(x, cos, sin):  # records the shapes that take the rows path
        rows.append(x.shape)
        return rotate_halves(x, cos, sin)

    monkeypatch.setattr(RotateHalves, "rotate_rows", rotate_rows)
    rotary, h, s = Rotary(32), 8, 32
    for b, t in [(16, 256), (1, 1), (4, 1)]:  # the presets' batch, then decoding steps of one and four sequences
        x = torch.randn(b, t, h * s).view(b, t, h, s).transpose(1, 2)  # as split_heads makes them
        rotary.rotate(x, torch.arange(t))
    assert rows == [(16, h, 256, s)]


def test_a_rotary_variant_with_learned_angles_gets_their_gradient():
    class LearnedFrequencies(Rotary):  # a variant: theta is a parameter, so the angles need a gradient
        def __init__(self, head_size):
            super().__init__(head_size)
            self.log_theta = torch.nn.Parameter(super().frequencies(torch.device("cpu")).log())

        def frequencies(self, device):
            return self.log_theta.exp()

    torch.manual_seed(0)
    rotary, x = LearnedFrequencies(8).double(), torch.randn(2, 3, 5, 8, dtype=torch.float64)
    rotary.rotate(x, torch.arange(5)).square().sum().backward()
    assert rotary.log_theta.grad is not None and rotary.log_theta.grad.abs().sum() > 0


@pytest.mark.parametrize("cls", [Rotary, InterleavedRotary])
def test_rotary_scores_depend_only_on_the_distance(cls):
    rotary = cls(16)
    q, k = torch.randn(1, 2, 1, 16), torch.randn(1, 2, 1, 16)
    def score(i, j):
        return (rotary.rotate(q, torch.tensor([i])) * rotary.rotate(k, torch.tensor([j]))).sum(-1)
    for i, j in [(3, 1), (10, 10), (7, 0)]:
        for shift in (1, 50, 900):
            torch.testing.assert_close(score(i + shift, j + shift), score(i, j), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(score(3, 1), score(3, 2))  # ... and does depend on it


def test_rotary_frequencies_are_kept_per_device_and_follow_a_new_base_or_scaling():
    rotary = Rotary(8)
    cpu = torch.device("cpu")
    assert rotary.frequencies(cpu) is rotary.frequencies(cpu)  # computed once
    torch.testing.assert_close(rotary.frequencies(cpu), 10000.0 ** (-torch.arange(4, dtype=torch.float64) / 4),
                               atol=0, rtol=1e-15)
    rotary.base = 500000.0
    torch.testing.assert_close(rotary.frequencies(cpu), 500000.0 ** (-torch.arange(4, dtype=torch.float64) / 4),
                               atol=0, rtol=1e-15)
    rotary.scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8}
    torch.testing.assert_close(rotary.frequencies(cpu), rotary.compute_frequencies(cpu), atol=0, rtol=0)
    assert not torch.equal(rotary.frequencies(cpu), 500000.0 ** (-torch.arange(4, dtype=torch.float64) / 4))


@pytest.mark.parametrize("cls", [Rotary, InterleavedRotary])
def test_rotation_without_gradients_equals_the_recorded_one(cls):
    rotary, x, positions = cls(8), torch.randn(2, 3, 5, 8), torch.arange(4, 9)
    with torch.no_grad():
        plain = rotary.rotate(x, positions)
    torch.testing.assert_close(plain, rotary.rotate(x.requires_grad_(), positions).detach(), atol=0, rtol=0)


def test_rotary_needs_an_even_head_size():
    with pytest.raises(ValueError, match="head size must be even, got 3"):
        SelfAttention(12, 4, positions="rotary")


# ---- ALiBi -------------------------------------------------------------------------------------------------------


def test_alibi_slopes_follow_the_paper():
    assert alibi_slopes(8).tolist() == [2.0 ** -i for i in range(1, 9)]
    # 6 heads: the 4 slopes of 4 heads, then every other slope of 8 heads
    assert alibi_slopes(6).tolist() == [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]


@pytest.mark.parametrize("causal", [True, False])
def test_alibi_equals_an_explicit_bias_through_the_reference_formula(causal):
    att = attention(causal=causal, positions="alibi", impl="reference")
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    q, k = att.project_queries(x), att.project_keys_values(x)[0]
    slopes = torch.tensor([2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8], dtype=torch.float64)
    i, j = torch.arange(6)[:, None], torch.arange(6)[None, :]
    bias = -slopes[:, None, None] * (i - j).abs()  # (h, t, t), written out
    scores = q @ k.transpose(-2, -1) / math.sqrt(4) + bias
    if causal:
        scores = scores.masked_fill(j > i, -math.inf)
    _, weights = att(x, return_weights=True)
    torch.testing.assert_close(weights, scores.softmax(-1), atol=1e-12, rtol=0)


# ---- relative bias -----------------------------------------------------------------------------------------------


def t5_bucket(n: int, bidirectional: bool, num_buckets: int = 32, max_distance: int = 128) -> int:
    """T5's bucket of n = query position - key position, as its definition reads, one integer at a time."""
    ret = 0
    if bidirectional:
        num_buckets //= 2
        if n < 0:
            ret += num_buckets
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return ret + n
    large = max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact))
    return ret + min(large, num_buckets - 1)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_relative_buckets_follow_their_definition(bidirectional):
    distances = torch.arange(-300, 301)
    buckets = relative_bucket(distances, bidirectional=bidirectional)
    assert buckets.tolist() == [t5_bucket(n, bidirectional) for n in distances.tolist()]


def test_relative_bias_is_shared_across_absolute_positions():
    bias = RelativeBias(4, bidirectional=True)
    torch.nn.init.normal_(bias.table.weight)
    near = bias.bias(AttentionMask(torch.arange(5), torch.arange(5)))
    far = bias.bias(AttentionMask(torch.arange(1000, 1005), torch.arange(1000, 1005)))
    torch.testing.assert_close(near, far, atol=0, rtol=0)  # (h, t, u): only i - j matters
    assert near.shape == (4, 5, 5) and not torch.allclose(near[:, 0, 1], near[:, 1, 0])  # before != after


# ---- every scheme: fast = reference, shift invariance, longer inputs, cached decoding -----------------------------


def forward_and_grads(att, x, mask):
    x = x.clone().requires_grad_(True)
    att.zero_grad()
    out = att(x, mask)
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
    return out.detach(), [x.grad] + [p.grad for p in att.parameters()]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("extra", [{}, {"kv_heads": 2}, {"window": 3}])
def test_fast_path_equals_reference_forward_and_backward(scheme, causal, masked, extra):
    fast = attention(causal=causal, positions=scheme, **extra)
    ref = attention(causal=causal, positions=scheme, impl="reference", **extra)
    ref.load_state_dict(fast.state_dict())
    x = torch.randn(3, 7, 16, dtype=torch.float64)
    mask = None
    if masked:
        mask = torch.rand(3, 7, generator=torch.Generator().manual_seed(1)) > 0.4
        mask[:, 0] = True
    out_f, grads_f = forward_and_grads(fast, x, mask)
    out_r, grads_r = forward_and_grads(ref, x, mask)
    torch.testing.assert_close(out_f, out_r, atol=1e-10, rtol=1e-10)
    for gf, gr in zip(grads_f, grads_r):
        if gr is not None:
            torch.testing.assert_close(gf, gr, atol=1e-10, rtol=1e-10)
    _, weights = fast(x, mask, return_weights=True)
    assert weights.shape == (3, 4, 7, 7)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 4, 7, dtype=torch.float64))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_outputs_are_invariant_to_shifting_every_position(scheme):
    att = attention(causal=True, positions=scheme)
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    torch.testing.assert_close(att(x, positions=torch.arange(500, 506)), att(x), atol=1e-8, rtol=1e-8)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_relative_schemes_accept_inputs_longer_than_seq_length(scheme):
    torch.manual_seed(0)
    model = GTransformer(16, 2, 2, 8, 20, positions=scheme).eval()
    out = model(torch.randint(0, 20, (1, 30)))  # trained length 8, run at 30
    assert out.shape == (1, 30, 20) and torch.isfinite(out).all()
    with pytest.raises(ValueError, match="seq_length=8"):  # learned positions still refuse
        GTransformer(16, 2, 2, 8, 20)(torch.randint(0, 20, (1, 9)))


def small_lm(**options):
    torch.manual_seed(0)
    return GTransformer(16, 4, 2, 12, 13, **options).double().eval()


@pytest.mark.parametrize("options", [{"positions": "rotary"}, {"positions": "alibi"}, {"positions": "relative"},
                                     {"kv_heads": 1}, {"kv_heads": 2, "positions": "rotary"}, {"window": 4},
                                     {"window": 3, "positions": "alibi", "kv_heads": 2}])
@pytest.mark.parametrize("new", [5, 15])  # 15 runs past the context of 12: the window slides
def test_cached_and_compiled_decoding_equal_recomputation(options, new):
    model = small_lm(**options)
    for p in model.parameters():  # relative biases start at zero; make them matter
        if p.shape[-1] == 4 and p.abs().sum() == 0:
            torch.nn.init.normal_(p)
    prompt = torch.randint(0, 13, (2, 4), generator=torch.Generator().manual_seed(1))
    sampling = dict(temperature=1.0, generator=None, return_logprobs=True)
    expected, lp_expected = generate(model, prompt, new, use_cache=False, **sampling | {"temperature": 0})
    tokens, lp = generate(model, prompt, new, **sampling | {"temperature": 0})
    assert torch.equal(tokens, expected)
    torch.testing.assert_close(lp, lp_expected, atol=1e-10, rtol=0)
    compiled = StaticCacheGenerator(model, compile=True, backend="eager")
    tokens, lp = compiled.generate(prompt, new, temperature=0, return_logprobs=True)
    assert torch.equal(tokens, expected)
    torch.testing.assert_close(lp, lp_expected, atol=1e-10, rtol=0)


# ---- grouped-query attention -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_grouped_query_attention_equals_multi_head_attention_with_repeated_weights(kv_heads):
    gqa = attention(kv_heads=kv_heads, causal=True)
    mha = attention(causal=True)
    group, s = 4 // kv_heads, 4
    with torch.no_grad():
        mha.toqueries.weight.copy_(gqa.toqueries.weight)
        mha.unifyheads.load_state_dict(gqa.unifyheads.state_dict())
        for name in ("tokeys", "tovalues"):  # (g * s, e) -> (h * s, e): each group's rows once per query head
            weight = getattr(gqa, name).weight.view(kv_heads, s, 16)
            getattr(mha, name).weight.copy_(weight.repeat_interleave(group, dim=0).reshape(4 * s, 16))
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    torch.testing.assert_close(gqa(x), mha(x), atol=1e-12, rtol=0)
    assert gqa.tokeys.weight.shape == (kv_heads * s, 16)


def test_the_cache_of_grouped_query_attention_stores_only_the_kv_heads():
    cache = KVCache(10)
    attention(kv_heads=1, causal=True)(torch.randn(3, 4, 16, dtype=torch.float64), positions=torch.arange(4),
                                       cache=cache)
    assert cache.keys.shape == (3, 1, 10, 4) and cache.values.shape == (3, 1, 10, 4)  # 1 head, not 4: 4x less memory


def test_kv_heads_must_divide_heads():
    with pytest.raises(ValueError, match=r"kv_heads \(3\) must divide heads \(4\)"):
        SelfAttention(16, 4, kv_heads=3)


# ---- sliding windows ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
def test_window_equals_an_explicit_banded_mask(causal):
    att = attention(causal=causal, window=3, impl="reference")
    x = torch.randn(2, 8, 16, dtype=torch.float64)
    i, j = torch.arange(8)[:, None], torch.arange(8)[None, :]
    band = (i - j).abs() < 3
    if causal:
        band &= j <= i  # each query: itself and the 2 positions before it
    _, weights = att(x, return_weights=True)
    assert (weights[..., ~band] == 0).all() and (weights[..., band] > 0).all()
    q, k = att.project_queries(x), att.project_keys_values(x)[0]
    scores = (q @ k.transpose(-2, -1) / 2).masked_fill(~band, -math.inf)
    torch.testing.assert_close(weights, scores.softmax(-1), atol=1e-12, rtol=0)


# ---- T5's relative bias: buckets of its own, one table per stack ---------------------------------------------------


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets, max_distance", [(8, 12), (6, 40)])
def test_relative_buckets_and_max_distance_follow_t5s_definition(bidirectional, num_buckets, max_distance):
    distances = torch.arange(-60, 61)
    buckets = relative_bucket(distances, bidirectional=bidirectional, num_buckets=num_buckets,
                              max_distance=max_distance)
    assert buckets.tolist() == [t5_bucket(n, bidirectional, num_buckets, max_distance) for n in distances.tolist()]
    config = TransformerConfig(16, 4, positions="relative", relative_buckets=num_buckets,
                               relative_max_distance=max_distance)
    layer = SelfAttention.from_config(config, causal=not bidirectional)
    assert (layer.relative.num_buckets, layer.relative.max_distance) == (num_buckets, max_distance)
    assert layer.relative.table.weight.shape == (num_buckets, 4) and layer.relative.bidirectional == bidirectional


def t5_model(shared, seed=0):
    torch.manual_seed(seed)
    return Seq2SeqTransformer(16, 4, 3, 12, 20, 20, decoder_depth=2, positions="relative", relative_buckets=8,
                              relative_max_distance=12, relative_shared=shared).double().eval()


def test_a_shared_table_is_one_table_per_stack_in_every_layer():
    model = t5_model(shared=True)
    for stack, causal in ((model.encoder, False), (model.decoder, True)):
        tables = {id(block.attention.relative) for block in stack.blocks}
        assert len(tables) == 1 and stack.blocks[0].attention.relative.bidirectional is not causal
    assert model.encoder.blocks[0].attention.relative is not model.decoder.blocks[0].attention.relative
    assert all(block.cross_attention.relative.bias(AttentionMask(torch.arange(3), None)) is None  # no positions
               for block in model.decoder.blocks)
    names = [name for name, _ in model.named_parameters() if "relative" in name]
    assert names == ["encoder.blocks.0.attention.relative.table.weight",
                     "decoder.blocks.0.attention.relative.table.weight"]  # where T5 stores them
    unshared = t5_model(shared=False)
    assert sum(p.numel() for p in unshared.parameters()) - sum(p.numel() for p in model.parameters()) == 3 * 8 * 4


def test_a_shared_table_equals_every_layer_holding_the_same_table():
    """The reference: the unshared model with each stack's tables set to one value computes the same, and the shared
    table's gradient is the sum of the layers' gradients."""
    shared, unshared = t5_model(shared=True), t5_model(shared=False)
    with torch.no_grad():
        for p in shared.parameters():
            p.normal_()
    unshared.load_state_dict(shared.state_dict())  # every layer's key holds its stack's table
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(0, 20, (2, 9), generator=g), torch.randint(0, 20, (2, 7), generator=g)
    src_mask = torch.tensor([[True] * 9, [True] * 5 + [False] * 4])
    torch.testing.assert_close(shared(src, tgt, src_mask), unshared(src, tgt, src_mask), atol=1e-12, rtol=0)
    shared(src, tgt, src_mask).sum().backward()
    unshared(src, tgt, src_mask).sum().backward()
    for name, stack in (("encoder", unshared.encoder), ("decoder", unshared.decoder)):
        summed = sum(block.attention.relative.table.weight.grad for block in stack.blocks)
        got = getattr(shared, name).blocks[0].attention.relative.table.weight.grad
        torch.testing.assert_close(got, summed, atol=1e-10, rtol=0)


def test_a_shared_table_decodes_with_the_cache_and_round_trips_through_a_checkpoint(tmp_path):
    model = t5_model(shared=True).float()
    with torch.no_grad():
        for block in (model.encoder.blocks[0], model.decoder.blocks[0]):
            torch.nn.init.normal_(block.attention.relative.table.weight)
    src = torch.randint(0, 20, (2, 9))
    cached = seq2seq_generate(model, src, 10, bos=0, eos=1)
    assert torch.equal(cached, seq2seq_generate(model, src, 10, bos=0, eos=1, use_cache=False))
    loaded = load_model(save_checkpoint(tmp_path / "t5.pt", model=model, step=0)).eval()
    assert loaded.decoder.blocks[1].attention.relative is loaded.decoder.blocks[0].attention.relative
    tgt = torch.randint(0, 20, (2, 6))
    torch.testing.assert_close(loaded(src, tgt), model(src, tgt), atol=0, rtol=0)


def test_the_relative_fields_are_refused_without_relative_positions():
    for changes in (dict(relative_shared=True), dict(relative_buckets=16), dict(relative_max_distance=64)):
        with pytest.raises(ValueError, match="apply to positions='relative' only, but positions is 'rotary'"):
            TransformerConfig(16, 4, positions="rotary", **changes)
    with pytest.raises(ValueError, match="relative_buckets must be an int >= 4"):
        TransformerConfig(16, 4, positions="relative", relative_buckets=2)
    with pytest.raises(ValueError, match="relative_max_distance must be an int >= 9"):
        TransformerConfig(16, 4, positions="relative", relative_buckets=16, relative_max_distance=8)


def test_a_relative_bias_variant_built_by_from_sizes_gets_the_configs_buckets():
    class Marked(RelativeBias):
        @classmethod
        def from_sizes(cls, *, heads, head_size, causal):
            bias = super().from_sizes(heads=heads, head_size=head_size, causal=causal)
            bias.marked = True  # a variant's own construction, which from_config must go through
            return bias

    class Attention(SelfAttention):
        position_classes = {**SelfAttention.position_classes, "relative": Marked}

    for buckets, distance in ((32, 128), (8, 12)):
        config = TransformerConfig(16, 4, positions="relative", relative_buckets=buckets,
                                   relative_max_distance=distance)
        bias = Attention.from_config(config, causal=True).relative
        assert type(bias) is Marked and bias.marked and bias.table.weight.shape == (buckets, 4)
        assert (bias.num_buckets, bias.max_distance, bias.bidirectional) == (buckets, distance, False)


def test_a_rotary_pickled_with_plain_base_and_scaling_attributes_still_rotates():
    # Before the frequencies were kept, base and scaling were plain attributes in the module's __dict__.
    rotary = Rotary(8, base=500000.0)
    state = dict(rotary.__dict__)
    state["base"], state["scaling"] = state.pop("_base"), state.pop("_scaling")
    del state["_theta"]
    old = Rotary.__new__(Rotary)
    old.__setstate__(state)
    x, positions = torch.randn(1, 2, 3, 8), torch.arange(3)
    assert old.base == 500000.0 and old.scaling is None
    torch.testing.assert_close(old.rotate(x, positions), rotary.rotate(x, positions), atol=0, rtol=0)


def test_rotary_reuses_the_angles_only_for_the_same_unchanged_positions():
    # A layer rotates its queries, then its keys, at one positions tensor: the second call reuses the angles. One
    # written in place (a decoding step's position, filled anew) or another tensor gets its own angles.
    rotary = Rotary(8)
    x = torch.randn(1, 2, 1, 8, dtype=torch.float64)
    position = torch.tensor([3])
    first = rotary.rotate(x, position)
    assert rotary.angles(position, torch.float64)[0] is rotary.angles(position, torch.float64)[0]
    position.fill_(5)
    torch.testing.assert_close(rotary.rotate(x, position), Rotary(8).rotate(x, torch.tensor([5])), atol=0, rtol=0)
    torch.testing.assert_close(rotary.rotate(x, torch.tensor([3])), first, atol=0, rtol=0)
    assert rotary.angles(position, torch.float32)[0].dtype == torch.float32  # another dtype: computed again
    with torch.inference_mode():  # inference tensors have no version counter: nothing is kept
        inference = torch.tensor([5])
        torch.testing.assert_close(rotary.rotate(x, inference), Rotary(8).rotate(x, inference), atol=0, rtol=0)
    rotary.base = 500.0  # new frequencies: the kept angles go too
    torch.testing.assert_close(rotary.rotate(x, position), Rotary(8, base=500.0).rotate(x, position), atol=0, rtol=0)
    assert pickle.loads(pickle.dumps(rotary))._last is None

    class LearnedFrequencies(Rotary):  # angles that are part of each step's graph are never kept
        def __init__(self) -> None:
            super().__init__(8)
            self.speed = torch.nn.Parameter(torch.ones((), dtype=torch.float64))

        def frequencies(self, device):
            return self.compute_frequencies(device) * self.speed

    learned = LearnedFrequencies()
    learned.rotate(x, position).sum().backward()
    assert learned._last is None and learned.speed.grad is not None


def test_kept_angles_never_cross_grad_modes_inference_mode_or_changed_frequencies():
    # A user calling a layer's rotation twice with one positions tensor, in different modes: each call gets angles
    # valid in its own mode (inference tensors cannot be saved for backward) and of the current frequencies.
    rotary, position = Rotary(8), torch.arange(4)
    x = torch.randn(1, 2, 4, 8, requires_grad=True)
    with torch.inference_mode():
        rotary.rotate(x.detach(), position)
    rotary.rotate(x, position).square().sum().backward()  # would raise with the inference-mode angles
    assert x.grad is not None and not rotary.angles(position, x.dtype)[0].is_inference()

    class LearnedInPlace(Rotary):  # frequencies a parameter, changed in place by an optimizer between calls
        def __init__(self) -> None:
            super().__init__(8)
            self.theta = torch.nn.Parameter(self.compute_frequencies(torch.device("cpu")))

        def frequencies(self, device):
            return self.theta

    learned = LearnedInPlace()
    with torch.no_grad():
        before = learned.rotate(x, position)
        learned.theta.mul_(2.0)
        after = learned.rotate(x, position)
    assert not torch.allclose(before, after)
    learned.rotate(x, position).sum().backward()  # after a no_grad call: the angles are part of this graph
    assert learned.theta.grad is not None and learned.theta.grad.abs().sum() > 0
