"""Properties of torchformer.nn.positions: the sinusoidal formula, lengths, offsets, errors."""

import math

import pytest
import torch

from torchformer import LearnedPositions, SinusoidalPositions
from torchformer.nn.positions import sinusoidal_table


@pytest.mark.parametrize("emb", [8, 7, 1])
def test_sinusoidal_values_follow_the_formula(emb):
    table = sinusoidal_table(50, emb, dtype=torch.float64)
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
    torch.testing.assert_close(out - x, sinusoidal_table(5000, 16).expand(2, -1, -1))


def test_offset_gives_the_later_positions():
    pos = SinusoidalPositions(16)
    x = torch.zeros(1, 10, 16, dtype=torch.float64)
    torch.testing.assert_close(pos(x[:, 7:], offset=7), pos(x)[:, 7:])
    learned = LearnedPositions(16, 10)
    torch.testing.assert_close(learned(x[:, 7:].float(), offset=7), learned(x.float())[:, 7:])


def test_a_tensor_offset_gives_the_same_positions_as_an_int():
    # A compiled decoding step passes its position as a 0-dim tensor (see torchformer.decoding.compiled).
    x = torch.randn(2, 3, 16, dtype=torch.float64)
    for pos in (SinusoidalPositions(16), LearnedPositions(16, 10).double()):
        torch.testing.assert_close(pos(x, offset=torch.tensor(6)), pos(x, offset=6), atol=0, rtol=0)


def test_dtype_follows_input():
    assert SinusoidalPositions(8)(torch.zeros(1, 3, 8, dtype=torch.float64)).dtype == torch.float64
    assert LearnedPositions(8, 4)(torch.zeros(1, 3, 8, dtype=torch.float64)).dtype == torch.float64


def test_learned_positions_are_learned_and_bounded():
    pos = LearnedPositions(8, 6)
    x = torch.randn(3, 6, 8)
    pos(x).sum().backward()
    assert pos.embedding.weight.grad is not None
    with pytest.raises(ValueError, match=r"position 6.*max_len=6"):
        pos(torch.randn(3, 7, 8))
    with pytest.raises(ValueError, match=r"offset 4.*max_len=6"):
        pos(torch.randn(3, 3, 8), offset=4)


def test_bad_input():
    with pytest.raises(ValueError, match=r"embedding size 8"):
        SinusoidalPositions(8)(torch.zeros(1, 3, 4))
    with pytest.raises(ValueError, match="max_len must be a positive int, got 0"):
        LearnedPositions(8, 0)
