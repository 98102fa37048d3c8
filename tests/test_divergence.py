"""A model whose weights went NaN is named as such wherever it shows: in the training loop, when sampling, in beam
search and in evaluation, instead of a silent token or an error that blames something else."""

from __future__ import annotations

import math

import pytest
import torch

from torchformer import GTransformer, beam_search, bits_per_byte, generate
from torchformer.decoding.sampling import check_finite_logp, sample_next
from torchformer.train.training import TrainingDiverged, check_finite_losses


def diverged_model() -> GTransformer:
    torch.manual_seed(0)
    model = GTransformer(16, 2, 1, 16, 32)
    with torch.no_grad():
        model.blocks.blocks[0].attention.tovalues.weight[0, 0] = math.nan  # one weight spreads to every output
    return model


@pytest.mark.parametrize("temperature, top_k, top_p", [(0.0, None, None), (1.0, None, None), (0.7, 5, None),
                                                       (1.0, None, 0.9), (1.0, 1, None)])
def test_sampling_from_nan_raises_instead_of_picking_a_token(temperature, top_k, top_p):
    logp = torch.log_softmax(torch.randn(3, 10), dim=-1)
    logp[1, 4] = math.nan  # argmax would return 4 for row 1
    with pytest.raises(ValueError, match="hold NaN or \\+inf \\(in 1 of 3 rows, the first at row 1\\).*diverge"):
        sample_next(logp, temperature=temperature, top_k=top_k, top_p=top_p)
    logp[1, 4] = -math.inf  # an impossible token is fine
    assert sample_next(logp, temperature=0.0)[1] != 4


def test_check_finite_logp_takes_any_leading_shape():
    check_finite_logp(torch.zeros(2, 3, 5))
    logp = torch.zeros(2, 3, 5)
    logp[1, 2, 0] = math.nan
    with pytest.raises(ValueError, match="in 1 of 6 rows, the first at row 5"):
        check_finite_logp(logp)
    check_finite_logp(torch.zeros(2, 0))  # no entry: nothing wrong (and no row maximum to take)
    check_finite_logp(torch.zeros(0, 5))


def test_sample_next_takes_the_row_maxima_it_is_given_only_in_their_shape():
    logp = torch.zeros(3, 5)
    with pytest.raises(ValueError, match=r"peak must be logp's row maxima, shape \(3, 1\), got \(3,\)"):
        sample_next(logp, peak=torch.zeros(3))
    logp[1, 2] = math.nan
    with pytest.raises(ValueError, match="NaN"):  # the given maxima are what the check reads
        sample_next(logp, peak=logp.amax(-1, keepdim=True))


@pytest.mark.parametrize("call", [
    lambda m, p: generate(m, p, 4, temperature=0.0),
    lambda m, p: generate(m, p, 4, temperature=1.0),
    lambda m, p: generate(m, p, 4, temperature=0.0, use_cache=False),
    lambda m, p: beam_search(m, p, 4, beam_size=3),
])
def test_generation_with_a_diverged_model_raises(call):
    with pytest.raises(ValueError, match="NaN.*did training diverge"):
        call(diverged_model(), torch.tensor([[1, 2, 3]]))


def test_evaluation_of_a_diverged_model_names_the_divergence():
    with pytest.raises(ValueError, match="NaN or \\+inf.*did training diverge"):
        bits_per_byte(diverged_model(), torch.randint(0, 32, (100,)), context=16)


def test_check_finite_losses_names_the_first_bad_step_and_the_remedies():
    check_finite_losses([2.0, 1.5], [10, 11])
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(TrainingDiverged, match="diverged at step 12: the loss is .*lower learning rate.*kqnorm"):
            check_finite_losses([2.0, 1.5, bad, math.nan], [10, 11, 12, 13])
    with pytest.raises(ValueError, match="same length"):
        check_finite_losses([1.0], [1, 2])


def test_log_probabilities_are_float32_under_cpu_autocast():
    # docs/training.md says the log_softmax runs in float32 under autocast: on the CPU too.
    model = GTransformer(16, 2, 1, 16, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp = model(torch.tensor([[1, 2, 3]]))
    assert logp.dtype == torch.float32
    assert torch.allclose(logp.exp().sum(-1), torch.ones(()), atol=1e-5)
    assert model.double()(torch.tensor([[1, 2, 3]])).dtype == torch.float64  # float64 stays float64
