"""What sampling draws from, measured: empirical frequencies of many seeded draws against the distribution the
documentation promises, softmax(logits / T) restricted to the top-k / nucleus support; and ``eos`` in sampled (not
greedy) generation.

The frequency tests use Pearson's chi-square statistic, sum (observed - expected)^2 / expected over the support,
against its 1 - 1e-6 quantile for the degrees of freedom (support size - 1), taken from scipy.stats.chi2.ppf:
a correct sampler fails one in a million seeds, and the seeds are fixed, so the tests are deterministic. A sampler
that multiplies by the temperature instead of dividing, or applies it after the top-p cut, is off by thousands.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from torchformer import TransformerConfig
from torchformer.decoding.generation import generate
from torchformer.decoding.sampling import sample_next

# chi2.ppf(1 - 1e-6, df) for df = 1 .. 4
CRITICAL = {1: 23.93, 2: 27.63, 3: 30.66, 4: 33.38}

# Distinct probabilities in scrambled order: ranked 3 (0.4), 1 (0.3), 4 (0.15), 2 (0.1), 0 (0.05).
PROBS = torch.tensor([0.05, 0.3, 0.1, 0.4, 0.15], dtype=torch.float64)
# Logits, not log-probabilities: shifted by a constant, which softmax does not see.
LOGITS = PROBS.log() + 3.0
N = 20_000


def draw(logits: torch.Tensor, n: int = N, seed: int = 0, **options) -> torch.Tensor:
    """Token counts ``(v,)`` of ``n`` draws, one per row of ``logits`` repeated ``n`` times."""
    tokens = sample_next(logits.expand(n, -1), generator=torch.Generator().manual_seed(seed), **options)
    return torch.bincount(tokens, minlength=logits.size(-1))


def assert_follows(counts: torch.Tensor, probs: torch.Tensor) -> None:
    """``counts`` are draws from ``probs``: nothing outside its support, and a chi-square within bounds."""
    n = counts.sum().item()
    support = probs > 0
    assert counts[~support].sum() == 0, f"drew tokens outside the support: {counts.tolist()}"
    if support.sum() == 1:  # a single token: it must be every draw, which the line above has checked
        return
    expected = n * probs[support]
    statistic = ((counts[support] - expected) ** 2 / expected).sum().item()
    df = int(support.sum()) - 1
    assert statistic < CRITICAL[df], (
        f"chi-square {statistic:.1f} >= {CRITICAL[df]} (df {df}): frequencies {(counts / n).tolist()}, "
        f"expected {probs.tolist()}"
    )


def tempered(temperature: float, keep: list[int] | None = None) -> torch.Tensor:
    """softmax(logits / T), renormalised over ``keep`` (all tokens if None)."""
    probs = (LOGITS / temperature).softmax(-1)
    if keep is not None:
        mask = torch.zeros_like(probs, dtype=torch.bool)
        mask[keep] = True
        probs = probs.masked_fill(~mask, 0.0)
        probs = probs / probs.sum()
    return probs


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0, 4.0])
def test_temperature_samples_the_softmax_of_the_logits_divided_by_it(temperature):
    assert_follows(draw(LOGITS, temperature=temperature), tempered(temperature))


def test_the_chi_square_check_sees_a_wrong_temperature():
    """The test above has the power it needs: draws at T = 2 are far from the distribution at T = 1/2 (what
    multiplying by T would give) and from T = 1 (temperature ignored)."""
    counts = draw(LOGITS, temperature=2.0)
    for wrong in (tempered(0.5), tempered(1.0)):
        with pytest.raises(AssertionError, match="chi-square"):
            assert_follows(counts, wrong)


def test_temperature_towards_zero_becomes_greedy():
    for temperature in (0.05, 1e-4):  # p(3) / p(1) = (4/3) ** (1/T): 3e2 at 0.05, astronomically large at 1e-4
        counts = draw(LOGITS, temperature=temperature, n=2000)
        assert counts[3] >= 1990 and counts.sum() == 2000, counts.tolist()
    assert draw(LOGITS, temperature=1e-4, n=2000)[3] == 2000
    # temperature 0 is argmax itself, ties resolved to the lowest id
    tie = torch.tensor([[1.0, 3.0, 3.0, 0.0]])
    assert sample_next(tie, temperature=0).item() == 1


def test_the_smallest_temperatures_pick_each_row_s_argmax_without_overflow():
    """Just above the smallest normal float32 (1.2e-38), logits / T overflow float32 unless each row is first
    shifted by its own maximum; rows at very different levels must each keep their own most likely token."""
    logits = torch.tensor([[5.0, 1.0, 0.0], [-300.0, -301.0, -299.0], [2.0, 4.0, 3.0]])
    for temperature in (2e-38, 1e-30, 1e-6):
        tokens = sample_next(logits, temperature=temperature, generator=torch.Generator().manual_seed(0))
        assert tokens.tolist() == [0, 2, 1], temperature


def test_double_precision_logits_are_sampled_in_double_precision():
    """Only half precision is widened; float64 logits keep differences float32 cannot hold: at T = 1e-12 logits
    1e-12 apart are e : 1 odds (token 1 drawn about 73% of the time), where float32 would see a tie (50%)."""
    logits = torch.tensor([[1.0, 1.0 + 1e-12]], dtype=torch.float64)
    counts = draw(logits, n=4000, temperature=1e-12)
    assert_follows(counts, (logits[0] / 1e-12 - logits[0].max() / 1e-12).softmax(-1))
    assert counts[1] > 2700, counts.tolist()


def test_top_k_samples_the_tempered_distribution_renormalised_over_the_k_likeliest():
    assert_follows(draw(LOGITS, temperature=2.0, top_k=3), tempered(2.0, keep=[3, 1, 4]))
    assert_follows(draw(LOGITS, temperature=0.5, top_k=2), tempered(0.5, keep=[3, 1]))


def test_top_p_cuts_the_nucleus_of_the_tempered_distribution():
    """Temperature first, then the nucleus. At T = 2 the probabilities are about (0.106, 0.260, 0.150, 0.300, 0.184):
    tokens 3, 1, 4 hold 0.744 < 0.8, so the nucleus of 0.8 also takes token 2 (at T = 1 it would stop at 3, 1, 4:
    0.85). At T = 1/2, token 3 alone holds 0.561 >= 0.55 (at T = 1 it needs token 1 too)."""
    assert_follows(draw(LOGITS, temperature=2.0, top_p=0.8), tempered(2.0, keep=[3, 1, 4, 2]))
    assert_follows(draw(LOGITS, temperature=0.5, top_p=0.55), tempered(0.5, keep=[3]))
    assert_follows(draw(LOGITS, temperature=1.0, top_p=0.8), tempered(1.0, keep=[3, 1, 4]))


def test_half_precision_logits_are_sampled_in_float32():
    """The documented float32 upcast: bfloat16 and float16 logits give exactly the tokens their float32 values
    give, with the same generator."""
    logits = (LOGITS + 0.37 * torch.randn(2000, 5, generator=torch.Generator().manual_seed(3), dtype=torch.float64))
    for dtype in (torch.bfloat16, torch.float16):
        low = logits.to(dtype)
        for options in (dict(temperature=0.7), dict(temperature=1.3, top_p=0.7), dict(temperature=0.9, top_k=3)):
            a = sample_next(low, generator=torch.Generator().manual_seed(4), **options)
            b = sample_next(low.float(), generator=torch.Generator().manual_seed(4), **options)
            assert torch.equal(a, b), (dtype, options)


# ------------------------------------------------------------------------------------- through generate()


class FixedModel(nn.Module):
    """Predicts the same next-token distribution at every position, whatever the input; counts its calls."""

    def __init__(self, probs: list[float], seq_length: int = 32) -> None:
        super().__init__()
        self.logp = torch.tensor(probs, dtype=torch.float64).log()
        self.config = TransformerConfig(1, 1, seq_length=seq_length, num_tokens=len(probs))
        self.calls = 0

    def forward(self, x, *, caches=None, positions=None, horizon=None, keep_last=None):
        self.calls += 1
        return self.logp.expand(x.size(0), x.size(1) if keep_last is None else keep_last, -1)

    def new_caches(self, capacity=None):
        return []


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_generate_samples_the_tempered_distribution_and_returns_the_untempered_one(temperature):
    model = FixedModel(PROBS.tolist())
    tokens, logprobs = generate(model, torch.zeros(N, 1, dtype=torch.long), 1, temperature=temperature,
                                generator=torch.Generator().manual_seed(1), return_logprobs=True)
    probs = (PROBS.log() / temperature).softmax(-1)
    assert_follows(torch.bincount(tokens[:, 1], minlength=5), probs)
    torch.testing.assert_close(logprobs[0, 0], PROBS.log())  # the model's, before temperature


@pytest.mark.parametrize("options", [dict(temperature=1.0), dict(temperature=0.7, top_k=4), dict(top_p=0.9)])
def test_sampled_generation_pads_with_eos_after_it(options):
    # eos (token 2) has probability 0.25 at every step: rows finish at every step, and some never do.
    eos, steps = 2, 12
    model = FixedModel([0.2, 0.3, 0.25, 0.15, 0.1])
    tokens, logprobs = generate(model, torch.zeros(300, 1, dtype=torch.long), steps, eos=eos,
                                generator=torch.Generator().manual_seed(2), return_logprobs=True, **options)
    new = tokens[:, 1:]
    assert new.shape == (300, steps)
    finished = (new == eos).any(dim=1)
    first = torch.where(finished, (new == eos).long().argmax(dim=1), steps)  # step of the first eos, or steps
    after = torch.arange(steps)[None, :] > first[:, None]  # (300, steps): strictly after the first eos
    assert (new[after] == eos).all(), "a row went on sampling after its eos"
    before = ~after
    assert (new[before & (torch.arange(steps)[None, :] < first[:, None])] != eos).all()
    # the rows are not all alike: eos came at the first step, late, and never
    assert (first == 0).any() and (first >= 5).any() and (first == steps).any() and after.any()
    # the log-probabilities: the model's until eos is drawn, then a point mass on eos
    point = torch.full((5,), -math.inf, dtype=torch.float64)
    point[eos] = 0.0
    assert torch.equal(logprobs[after], point.expand(int(after.sum()), -1))
    torch.testing.assert_close(logprobs[before], model.logp.expand(int(before.sum()), -1))


def test_sampled_generation_stops_when_every_row_has_finished():
    model = FixedModel([1e-12, 1.0, 1e-12])  # eos = 1 is all but certain
    tokens = generate(model, torch.zeros(8, 2, dtype=torch.long), 10, eos=1, temperature=1.0,
                      generator=torch.Generator().manual_seed(0))
    assert tokens.shape == (8, 12) and (tokens[:, 2:] == 1).all()
    assert model.calls == 1  # the prompt's pass; every row finished with its first token, so no more steps


def test_nan_is_named_with_its_rows_whatever_the_vocabulary_size():
    from torchformer.decoding.sampling import check_finite_logp

    for v in (1, 3):
        logp = torch.zeros(4, v)
        logp[1, 0] = math.nan
        logp[3, -1] = math.inf
        with pytest.raises(ValueError, match=r"hold NaN or \+inf \(in 2 of 4 rows, the first at row 1\)"):
            check_finite_logp(logp)
        with pytest.raises(ValueError, match=r"in 2 of 8 rows, the first at row 1"):
            check_finite_logp(torch.cat([logp, torch.zeros(4, v)]).view(2, 4, v))
