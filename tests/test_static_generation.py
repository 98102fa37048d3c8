"""Tests for torchformer.decoding.compiled: static caches and the compiled step give generate's tokens exactly."""

from __future__ import annotations

import math
import shutil

import pytest
import torch

from torchformer import SelfAttention, TransformerBlock
from torchformer.decoding.generation import generate
from torchformer.models import GTransformer
from torchformer.decoding.compiled import StaticCacheGenerator

from test_generation import SharpAttention, small_lm  # the same small models as generate's tests

def prompt_of(b: int, t: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 13, (b, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "none"])
@pytest.mark.parametrize("new", [4, 15])  # 15 runs past the context of 12: the window slides
def test_static_generation_equals_generate(positions, new):
    model = small_lm(positions)
    prompt = prompt_of(3, 5)
    expected, lp_expected = generate(model, prompt, new, temperature=0, return_logprobs=True)
    tokens, lp = StaticCacheGenerator(model).generate(prompt, new, temperature=0, return_logprobs=True)
    assert torch.equal(tokens, expected)
    torch.testing.assert_close(lp, lp_expected, rtol=0, atol=1e-10)


def test_sampling_and_eos_match_generate():
    model = small_lm()
    prompt = prompt_of(4, 3, seed=2)
    options = dict(temperature=1.3, top_k=6, top_p=0.9, eos=5, return_logprobs=True)
    expected, lp_expected = generate(model, prompt, 9, generator=torch.Generator().manual_seed(0), **options)
    tokens, lp = StaticCacheGenerator(model).generate(
        prompt, 9, generator=torch.Generator().manual_seed(0), **options
    )
    assert torch.equal(tokens, expected)
    torch.testing.assert_close(lp, lp_expected, rtol=0, atol=1e-10)


def test_buffers_are_reused_across_calls_and_kept_per_batch_size():
    model = small_lm()
    static = StaticCacheGenerator(model)
    for b, t, seed in [(2, 7, 3), (2, 3, 4), (5, 4, 5), (2, 9, 6)]:  # a long prompt, then a short one into the
        prompt = prompt_of(b, t, seed)  # same buffers: slots left over from the long one must not leak in
        assert torch.equal(static.generate(prompt, 3, temperature=0), generate(model, prompt, 3, temperature=0))
    assert len(static._kept) == 2  # batch sizes 2 and 5


def test_one_compiled_graph_serves_every_position_and_prompt_length():
    graphs = []

    def counting_backend(gm, example_inputs):  # a torch.compile backend that records each graph and runs it eagerly
        graphs.append(gm)
        return gm.forward

    model = small_lm("sinusoidal")
    static = StaticCacheGenerator(model, compile=True, backend=counting_backend)
    for t in (3, 6):
        prompt = prompt_of(2, t, seed=t)
        tokens, lp = static.generate(prompt, 5, temperature=0, return_logprobs=True)
        expected, lp_expected = generate(model, prompt, 5, temperature=0, return_logprobs=True)
        assert torch.equal(tokens, expected)
        torch.testing.assert_close(lp, lp_expected, rtol=0, atol=1e-10)
    assert len(graphs) == 1  # 8 steps at 8 different positions: traced once, no recompilation


@pytest.mark.skipif(
    not any(shutil.which(cc) for cc in ("c++", "g++", "clang++")), reason="inductor needs a C++ compiler on a CPU"
)
def test_inductor_compiled_step_equals_eager():
    # The real compiler (C++ on a CPU); float64 keeps the comparison tight. Any failure of it fails the test.
    model = small_lm()
    prompt = prompt_of(2, 4, seed=7)
    expected, lp_expected = generate(model, prompt, 6, temperature=0, return_logprobs=True)
    tokens, lp = StaticCacheGenerator(model, compile=True).generate(prompt, 6, temperature=0, return_logprobs=True)
    assert torch.equal(tokens, expected)
    torch.testing.assert_close(lp, lp_expected, rtol=0, atol=1e-10)


def test_bad_arguments_are_clear_errors():
    model = small_lm()
    with pytest.raises(ValueError, match="mode .*reduce-overhead.* is a torch.compile mode; pass compile=True"):
        StaticCacheGenerator(model, mode="reduce-overhead")
    static = StaticCacheGenerator(model)
    with pytest.raises(ValueError, match=r"prompt must hold token ids in \[0, 13\)"):
        static.generate(torch.tensor([[1, 13]]), 2)
    with pytest.raises(ValueError, match="max_new_tokens must be a positive int, got 0"):
        static.generate(prompt_of(1, 2), 0)
    with pytest.raises(ValueError, match="temperature must be a finite float >= 0"):
        static.generate(prompt_of(1, 2), 2, temperature=-1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_compiled_step_on_cuda_equals_eager(mode):
    # "reduce-overhead" records the step as a CUDA graph: the buffers must be written in place, the output copied.
    torch.manual_seed(0)
    model = GTransformer(64, 4, 2, 32, 50).cuda().eval()
    prompt = torch.randint(0, 50, (3, 5), device="cuda")
    expected, lp_expected = generate(model, prompt, 20, temperature=0, return_logprobs=True)
    static = StaticCacheGenerator(model, compile=True, mode=mode)
    for _ in range(2):  # the second call replays what the first one compiled (and recorded)
        tokens, lp = static.generate(prompt, 20, temperature=0, return_logprobs=True)
        assert torch.equal(tokens, expected)
        torch.testing.assert_close(lp, lp_expected, rtol=1e-4, atol=1e-4)


def test_many_batch_sizes_share_at_most_three_compiled_graphs():
    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    model = small_lm()
    static = StaticCacheGenerator(model, compile=True, backend=counting_backend)
    for b in [3, 2, 1, 4, 5, 6, 7, 8, 9, 10]:  # more batch sizes than torch.compile keeps graphs for one function (8)
        prompt = prompt_of(b, 4, seed=b)
        assert torch.equal(static.generate(prompt, 3, temperature=0), generate(model, prompt, 3, temperature=0))
    # Batch size 3, then one graph with a symbolic batch size, and batch size 1 on its own; fewer if this process
    # has already seen the step's shapes vary (torch.compile remembers that across generators).
    assert 1 <= len(graphs) <= 3
    static.clear()
    assert static._kept == {}


def test_float32_and_prenorm_wide_kqnorm_models_match_generate():
    torch.manual_seed(3)
    model = GTransformer(32, 4, 3, 16, 40, prenorm=True, wide=True, kqnorm=True, positions="sinusoidal").eval()
    prompt = torch.randint(0, 40, (4, 6), generator=torch.Generator().manual_seed(3))
    expected, lp_expected = generate(model, prompt, 14, temperature=0, return_logprobs=True)
    tokens, lp = StaticCacheGenerator(model).generate(prompt, 14, temperature=0, return_logprobs=True)
    assert torch.equal(tokens, expected)  # a random model's near-ties could flip, but do not for this seed
    torch.testing.assert_close(lp, lp_expected, rtol=0, atol=1e-5)  # float32: masked slots sum in another order


def test_keys_and_values_of_different_dtypes():
    # kqnorm under CUDA autocast: layer norm runs in float32, so the keys are float32 and the values bfloat16.
    model = small_lm().float()
    for block in model.blocks.blocks:
        block.attention.knorm.register_forward_hook(lambda module, inputs, out: out.float())
    prompt = prompt_of(2, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = generate(model, prompt, 5, temperature=0)
        assert torch.equal(StaticCacheGenerator(model).generate(prompt, 5, temperature=0), expected)


def test_buffers_made_in_inference_mode_do_not_leak_out_of_it():
    model = small_lm()
    static = StaticCacheGenerator(model)
    prompt = prompt_of(2, 4)
    with torch.inference_mode():
        inside = static.generate(prompt, 3, temperature=0)
    assert torch.equal(static.generate(prompt, 3, temperature=0), inside)  # outside: its own buffers


class DistanceAttention(SelfAttention):
    """An attention variant that uses positions: a linear distance penalty on the scores (ALiBi-like)."""

    def attend(self, q, k, v, mask, *, return_weights=False):
        k, v = self.share_kv_heads(k), self.share_kv_heads(v)  # (b, g, u, s) -> (b, h, u, s)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (b, h, t, u)
        scores = scores - 0.7 * mask.distance().abs().to(scores.dtype)  # (t, u): |i - j| in absolute positions
        allowed = mask.allowed()
        if allowed is not None:
            scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        weights = scores.softmax(dim=-1)
        return weights @ v, (weights if return_weights else None)


def with_attention(model: GTransformer, attention: type) -> GTransformer:
    """A subclass of ``model``'s class whose blocks use ``attention``, with ``model``'s weights."""
    block = type("Block", (TransformerBlock,), {"attention_class": attention})
    variant = type("Variant", (GTransformer,), {"block_class": block}).from_config(model.config).double().eval()
    variant.load_state_dict(model.state_dict())
    return variant


@pytest.mark.parametrize("attention", [SharpAttention, DistanceAttention])
@pytest.mark.parametrize("backend", [None, "eager", "inductor"])
def test_attend_overrides_decode_identically_with_the_compiled_step_without_a_flag(attention, backend):
    if backend == "inductor" and not any(shutil.which(cc) for cc in ("c++", "g++", "clang++")):
        pytest.skip("inductor needs a C++ compiler on a CPU")
    model = with_attention(small_lm("none"), attention)  # no position vectors: DistanceAttention alone orders tokens
    prompt = prompt_of(2, 3)
    # The reference recomputes every window without a cache; the penalty depends on positions, so a wrong position
    # in the cache or the compiled step would change the tokens.
    expected, lp_expected = generate(model, prompt, 8, temperature=0, use_cache=False, return_logprobs=True)
    static = StaticCacheGenerator(model, compile=backend is not None, backend=backend or "inductor")
    tokens, lp = static.generate(prompt, 8, temperature=0, return_logprobs=True)
    assert torch.equal(tokens, expected)
    torch.testing.assert_close(lp, lp_expected, rtol=0, atol=1e-10)
    if attention is DistanceAttention:  # the variant matters: without it the model decodes other log-probabilities
        assert not torch.allclose(generate(small_lm("none"), prompt, 8, temperature=0, return_logprobs=True)[1], lp)


def test_the_compiled_step_reads_a_power_of_two_of_slots_with_three_graphs_for_every_position():
    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    model = GTransformer(16, 2, 2, seq_length=64, num_tokens=13, positions="rotary")
    static = StaticCacheGenerator(model, compile=True, backend=counting_backend)
    prompt = prompt_of(2, 3)
    # Positions 3 .. 52 read 16, 32 and 64 slots: one graph for the first horizon, one with it symbolic, and one
    # for the whole cache (torch.compile tells a slice of every slot from a shorter one).
    assert torch.equal(static.generate(prompt, 50, temperature=0), generate(model, prompt, 50, temperature=0))
    assert len(graphs) == 3
    assert torch.equal(static.generate(prompt, 50, temperature=0), generate(model, prompt, 50, temperature=0))
    assert len(graphs) == 3  # the next sequence reuses them
