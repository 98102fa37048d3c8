"""Tests for torchformer.train.flops: the 6N + 12 L H Q T estimate, checked against counts done by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchformer import GTransformer
from torchformer.families import MoETransformer
from torchformer.nn.moe import MoEOptions
from torchformer.train.flops import (
    active_matmul_parameters, flops_per_token, matmul_parameters, mfu, model_flops_per_token, peak_bf16_tflops,
)

# GTransformer(emb=8, heads=2, depth=2, seq_length=16, num_tokens=32), post-norm, counted on paper:
#   attention: q, k, v 3 * 8 * 8 (no bias) + unifyheads 8 * 8 + 8          =  264
#   two layer norms 2 * (8 + 8)                                             =   32
#   feed-forward 8 * 32 + 32 + 32 * 8 + 8                                   =  552
#   one block 848, two blocks                                               = 1696
#   output head 8 * 32 + 32                                                 =  288
#   lookup tables (not multiplied): tokens 32 * 8 = 256, positions 16 * 8 = 128
HAND_N = 1696 + 288
HAND_ATTENTION = 12 * 2 * 8 * 16  # 12 * layers * (heads * head_size) * context


def tiny(**options) -> GTransformer:
    return GTransformer(8, 2, 2, 16, 32, **options)


def test_matmul_parameters_match_the_hand_count():
    model = tiny()
    assert matmul_parameters(model) == HAND_N
    assert sum(p.numel() for p in model.parameters()) == HAND_N + 256 + 128  # so the tables really were excluded


def test_flops_per_token_matches_the_hand_count():
    assert model_flops_per_token(tiny(), context=16) == 6 * HAND_N + HAND_ATTENTION
    assert flops_per_token(params=HAND_N, layers=2, attention_width=8, context=16) == 6 * HAND_N + HAND_ATTENTION


def test_tied_embedding_counts_once_as_the_head():
    # Tied, the token table *is* the head's (32, 8) matrix: it is multiplied, so it counts, but only once.
    assert matmul_parameters(tiny(tie_weights=True)) == HAND_N


def test_prenorm_final_norm_and_wide_heads():
    assert matmul_parameters(tiny(prenorm=True)) == HAND_N + 16  # the stack's final LayerNorm
    wide = tiny(wide=True)  # every head is 8 wide: q, k, v 8 -> 16, unifyheads 16 -> 8
    per_block_extra = 3 * 8 * 8 + 8 * 8  # what doubling the attention width adds to one block
    assert matmul_parameters(wide) == HAND_N + 2 * per_block_extra
    assert model_flops_per_token(wide, context=16) == 6 * (HAND_N + 2 * per_block_extra) + 2 * HAND_ATTENTION


def test_compiled_wrapper_counts_the_same():
    model = tiny()
    wrapped = torch.compile(model, backend="eager")
    assert model_flops_per_token(wrapped, context=16) == model_flops_per_token(model, context=16)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 10**6), st.integers(1, 10**5), st.integers(1, 2000))
def test_mfu_is_linear_and_one_at_peak(flops, context, tokens):
    peak = flops * tokens / 1e12  # TFLOP/s that these tokens per second need
    assert mfu(tokens, flops, peak_tflops=peak) == pytest.approx(1.0)
    assert mfu(2 * tokens, flops, peak_tflops=peak) == pytest.approx(2.0)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: flops_per_token(params=-1, layers=1, attention_width=8, context=4), "params must be an int >= 0"),
        (lambda: flops_per_token(params=1, layers=1, attention_width=8, context=0), "context must be an int >= 1"),
        (lambda: model_flops_per_token(tiny(), context=2.5), "context must be an int >= 1, got 2.5"),
        (lambda: mfu(100.0, 10, peak_tflops=0), "peak_tflops must be a positive number"),
        (lambda: mfu(-1.0, 10, peak_tflops=989), "tokens_per_second must be a number >= 0"),
    ],
)
def test_bad_arguments_name_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_matmul_parameters_rejects_non_modules():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        matmul_parameters("model")


def test_model_must_be_a_module_and_mfu_numbers_finite():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module .*got str 'gpt'"):
        model_flops_per_token("gpt", context=16)
    with pytest.raises(ValueError, match="tokens_per_second must be a number >= 0 .*got inf"):
        mfu(float("inf"), 10, peak_tflops=989)
    with pytest.raises(ValueError, match="peak_tflops must be a positive number .*got inf"):
        mfu(1.0, 10, peak_tflops=float("inf"))
    assert mfu(np.float32(1e12), np.int64(1), peak_tflops=np.float64(1.0)) == pytest.approx(1.0)  # NumPy numbers


@pytest.mark.parametrize(
    "name, peak",
    [
        ("NVIDIA H100 80GB HBM3", 989.0),  # SXM, the name torch reported on the H100 used so far
        ("NVIDIA H200", 989.0),
        ("NVIDIA GH200 480GB", 989.0),
        ("NVIDIA H100 PCIe", 756.0),  # lower clocks: not the SXM figure although the name contains "H100"
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200 NVL", 835.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("nvidia  h100 pcie", 756.0),  # case and spacing do not matter
        ("NVIDIA GeForce RTX 3090", None),  # unknown: the caller must give the peak
        ("cpu", None),
    ],
)
def test_peak_bf16_tflops_from_device_names(name, peak):
    assert peak_bf16_tflops(name) == peak


def test_peak_bf16_tflops_rejects_non_strings():
    with pytest.raises(TypeError, match="device_name must be a str .*got int 0"):
        peak_bf16_tflops(0)


def test_nanogpt_count_of_a_gpt2_sized_model():
    """The 12-layer, emb 768, context 1024 model of the GPU suite: 6N + 12 L H Q T, with N counted by hand."""
    model = GTransformer(768, 12, 12, 1024, 256, prenorm=True)
    # per block: q, k, v, unify 4 * 768^2 + 768 (unify bias); two norms 4 * 768; feed-forward 2 * 4 * 768^2 + 4 * 768
    # + 768; output head 768 * 256 + 256, final norm 2 * 768 (pre-norm); lookup tables excluded.
    block = 4 * 768**2 + 768 + 4 * 768 + 8 * 768**2 + 4 * 768 + 768
    n = 12 * block + 768 * 256 + 256 + 2 * 768
    assert matmul_parameters(model) == n
    assert model_flops_per_token(model, context=1024) == 6 * n + 12 * 12 * 768 * 1024


def test_a_mixture_counts_the_experts_a_token_uses():
    """Top-2 of 4 experts of hidden size 6, and a shared expert: a token is multiplied with the router, 2 experts
    and the shared one; the 2 other experts (3 * 8 * 6 weights each, per block) are idle."""
    options = (MoEOptions(experts=4, top_k=2, expert_hidden=6, shared_experts=1),)
    model = MoETransformer(8, 2, 2, 16, 32, activation="swiglu", options=options)
    total = matmul_parameters(model)
    assert total == sum(p.numel() for p in model.parameters()) - 256 - 128  # everything but the lookup tables
    assert active_matmul_parameters(model) == total - 2 * (2 * 3 * 8 * 6)
    assert model_flops_per_token(model, context=16) == 6 * active_matmul_parameters(model) + HAND_ATTENTION
    assert active_matmul_parameters(tiny()) == matmul_parameters(tiny())


def test_latent_attention_counts_its_scores_and_values_at_their_own_widths():
    """h = 4 heads scoring over n + r = 16 + 32 and weighting values of v = 16: 6 T h (n + r + v) per layer."""
    from torchformer.families import LatentTransformer
    from torchformer.nn.latent import LatentOptions

    options = (LatentOptions(kv_rank=8, rope_dim=32, nope_dim=16, value_dim=16),)
    model = LatentTransformer(8, 4, 2, 16, 32, positions="rotary", options=options)
    assert model_flops_per_token(model, context=16) == 6 * matmul_parameters(model) + 2 * 6 * 16 * 4 * (48 + 16)
