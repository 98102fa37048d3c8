"""Properties of torchformer.nn.positions: the sinusoidal formula, lengths, absolute positions, errors."""

import math

import pytest
import torch

from torchformer import LearnedPositions, SinusoidalPositions
from torchformer.nn.positions import sinusoidal_table


@pytest.mark.parametrize("emb", [8, 7, 1])
def test_sinusoidal_values_follow_the_formula(emb):
    table = sinusoidal_table(torch.arange(50), emb, dtype=torch.float64)
    for p in range(50):
        for d in range(emb):
            i = d // 2
            angle = p / 10000 ** (2 * i / emb)
            expected = math.sin(angle) if d % 2 == 0 else math.cos(angle)
            assert table[p, d].item() == pytest.approx(expected, abs=1e-12)


def test_sinusoidal_adds_to_input_has_no_parameters_and_works_for_any_length():
    pos = SinusoidalPositions(16)
    assert list(pos.parameters()) == []
    x = torch.randn(2, 5000, 16)
    out = pos(x)
    torch.testing.assert_close(out - x, sinusoidal_table(torch.arange(5000), 16).expand(2, -1, -1))


def test_positions_give_the_later_vectors():
    # With a KV cache, x holds only the newest tokens; positions say where they sit.
    x = torch.zeros(1, 10, 16, dtype=torch.float64)
    for pos in (SinusoidalPositions(16), LearnedPositions(16, 10).double()):
        torch.testing.assert_close(pos(x[:, 7:], torch.arange(7, 10)), pos(x)[:, 7:], atol=0, rtol=0)
        # any order: each vector belongs to its position, not to its index in x
        torch.testing.assert_close(pos(x[:, :3], torch.tensor([5, 0, 9])), pos(x)[:, [5, 0, 9]], atol=0, rtol=0)


def test_dtype_follows_input():
    assert SinusoidalPositions(8)(torch.zeros(1, 3, 8, dtype=torch.float64)).dtype == torch.float64
    assert LearnedPositions(8, 4)(torch.zeros(1, 3, 8, dtype=torch.float64)).dtype == torch.float64


def test_learned_positions_are_learned():
    pos = LearnedPositions(8, 6)
    pos(torch.randn(3, 6, 8)).sum().backward()
    assert pos.embedding.weight.grad is not None and pos.embedding.weight.grad.abs().sum() > 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="max_len must be a positive int, got 0"):
        LearnedPositions(8, 0)
    with pytest.raises(ValueError, match="emb must be a positive int"):
        SinusoidalPositions(0)


def test_learned_positions_refuse_a_longer_input_naming_max_len_and_check_the_shape():
    positions = LearnedPositions(8, 10)
    assert positions(torch.zeros(1, 10, 8)).shape == (1, 10, 8)  # every position it has
    with pytest.raises(ValueError, match=r"x has 11 positions, but LearnedPositions has vectors for max_len=10 "
                                         r"positions only \(0 \.\. 9\)"):
        positions(torch.zeros(1, 11, 8))
    for module in (positions, SinusoidalPositions(8)):
        with pytest.raises(ValueError, match="x must have embedding size 8"):
            module(torch.zeros(1, 3, 7))
        with pytest.raises(ValueError, match=r"x must have shape \(b, t, 8\)"):
            module(torch.zeros(3, 8))
