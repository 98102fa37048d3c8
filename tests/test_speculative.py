"""Tests for torchformer.decoding.speculative: greedy output equal to plain greedy decoding for every position scheme
and cache kind, sampled output distributed as the target's (the accept/reject rule alone, and whole sequences of a
model whose distribution is known exactly), and the refusals of generate's draft options.

The frequency tests use Pearson's chi-square statistic against its 1 - 1e-6 quantile (scipy.stats.chi2.ppf), as
tests/test_sampling_distribution.py does: a correct sampler fails one in a million seeds, and the seeds are fixed.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from torchformer import TransformerConfig
from torchformer.decoding.generation import generate
from torchformer.decoding.speculative import accept
from torchformer.families import LatentTransformer, MoETransformer
from torchformer.models import GTransformer, MLMTransformer, Seq2SeqTransformer
from torchformer.nn.latent import LatentOptions
from torchformer.nn.moe import MoEOptions

from test_generation import TableModel

# chi2.ppf(1 - 1e-6, df)
CRITICAL = {3: 30.66, 26: 75.55}


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's statistic of ``counts`` against ``probs`` (every cell with probability > 0)."""
    expected = counts.sum() * probs
    assert counts[probs == 0].sum() == 0, "drew a token of probability 0"
    keep = probs > 0
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


# ---- the accept/reject rule ------------------------------------------------------------------------------------


P = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
Q = torch.tensor([[0.1, 0.6, 0.2, 0.1], [0.4, 0.3, 0.2, 0.1]], dtype=torch.float64)


def test_every_token_of_a_round_has_the_targets_distribution():
    # 400,000 rounds of one fixed (p, q): the first token ~ p_1; given one proposal stood, the second ~ p_2; given
    # both stood, the third ~ p_3 (here p does not depend on the earlier tokens, so these are its rows).
    n, g = 400_000, torch.Generator().manual_seed(0)
    p, q = P.expand(n, 3, 4), Q.expand(n, 2, 4)
    drafts = torch.multinomial(Q.repeat(n, 1), 1, generator=g).view(n, 2)
    accepted, tokens = accept(p, q, drafts, generator=g)
    for position in range(3):
        rows = accepted >= position
        counts = torch.bincount(tokens[rows, position], minlength=4).double()
        assert chi_square(counts, P[position]) < CRITICAL[3], (position, (counts / counts.sum()).tolist())
    # A proposal stands with probability sum_x min(p(x), q(x)): 0.1 + 0.3 + 0.15 + 0.05 = 0.6 for the first.
    first = (accepted >= 1).double().mean().item()
    assert abs(first - 0.6) < 5 * (0.6 * 0.4 / n) ** 0.5
    stands = torch.minimum(P[:2], Q).sum(-1)  # (0.6, 0.6)
    both = (accepted == 2).double().mean().item()
    assert abs(both - stands.prod().item()) < 5 * (0.36 * 0.64 / n) ** 0.5


def test_a_draft_equal_to_the_target_is_always_accepted_and_one_that_is_never_right_never():
    n, g = 1000, torch.Generator().manual_seed(1)
    drafts = torch.multinomial(P[:2].repeat(n, 1), 1, generator=g).view(n, 2)
    accepted, tokens = accept(P.expand(n, 3, 4), P[:2].expand(n, 2, 4), drafts, generator=g)
    assert (accepted == 2).all() and torch.equal(tokens[:, :2], drafts)
    elsewhere = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)  # p(3) = 0.05
    target = torch.tensor([[0.5, 0.5, 0.0, 0.0]] * 3, dtype=torch.float64)
    accepted, tokens = accept(target.expand(n, 3, 4), elsewhere.expand(n, 2, 4), torch.full((n, 2), 3),
                              generator=g)
    assert (accepted == 0).all() and (tokens[:, 0] < 2).all()  # the residual is p itself: tokens 0 and 1


# ---- whole sequences, sampled -------------------------------------------------------------------------------------


def tables(seed: int, v: int = 3, length: int = 8) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (2 * torch.randn(length, v, v, generator=g, dtype=torch.float64)).log_softmax(-1)


def sequence_probs(model: TableModel, prompt: list[int], new: int, **options) -> dict[tuple[int, ...], float]:
    """The exact probability of every continuation of ``prompt`` by ``new`` tokens, under the sampling options."""
    from torchformer.decoding.sampling import filtered_logits, row_peaks

    v, out = model.config.num_tokens, {}
    for cont in itertools.product(range(v), repeat=new):
        seq, total = list(prompt), 1.0
        for token in cont:
            logp = model.table[len(seq) - 1, seq[-1]][None]  # (1, v)
            probs = filtered_logits(logp, row_peaks(logp), **options).softmax(-1)[0]
            total *= float(probs[token])
            seq.append(token)
        out[cont] = total
    return out


PLAIN, TOP_K, NUCLEUS = (dict(temperature=1.0, top_k=None, top_p=None), dict(temperature=0.7, top_k=2, top_p=None),
                         dict(temperature=1.3, top_k=None, top_p=0.8))


# One row: every path of a round (a rejection at each place, all accepted and the token after); seven rows: the
# fewest kept by any row, the rest drafted again.
@pytest.mark.parametrize("options, rows, lookahead, draws", [(TOP_K, 1, 2, 6_000), (PLAIN, 7, 3, 14_000),
                                                             (TOP_K, 7, 3, 14_000), (NUCLEUS, 7, 3, 14_000)])
def test_sampled_sequences_have_the_targets_distribution(options, rows, lookahead, draws):
    target, draft = TableModel(tables(0)), TableModel(tables(1))  # a draft that is often wrong
    prompt, new = [2, 0], 3
    exact = sequence_probs(target, prompt, new, **options)
    g = torch.Generator().manual_seed(2)
    counts = dict.fromkeys(exact, 0)
    for _ in range(draws // rows):
        out = generate(target, torch.tensor([prompt] * rows), new, draft=draft, lookahead=lookahead, generator=g,
                       **options)
        for row in out[:, len(prompt):].tolist():
            counts[tuple(row)] += 1
    keys = sorted(exact)
    statistic = chi_square(torch.tensor([counts[k] for k in keys], dtype=torch.float64),
                           torch.tensor([exact[k] for k in keys], dtype=torch.float64))
    assert statistic < CRITICAL[26], statistic


# ---- greedy: plain greedy decoding's tokens ------------------------------------------------------------------------


def lm(cls=GTransformer, depth=2, seed=0, **options):
    torch.manual_seed(seed)
    model = cls(16, 4, depth, 24, 13, **options).double().eval()
    with torch.no_grad():
        for p in model.parameters():  # relative biases and norm gains start at 0 or 1: make them matter
            p.add_(0.05 * torch.randn_like(p))
    return model


SCHEMES = [{}, {"positions": "sinusoidal"}, {"positions": "rotary"}, {"positions": "rotary_interleaved"},
           {"positions": "alibi"}, {"positions": "relative"}, {"positions": "none"}, {"kv_heads": 2, "positions":
           "rotary"}, {"window": 5, "positions": "alibi"}]


@pytest.mark.parametrize("options", SCHEMES)
def test_greedy_speculative_decoding_gives_the_tokens_of_plain_greedy_decoding(options):
    model, draft = lm(**options), lm(depth=1, seed=1, **options)
    prompt = torch.randint(0, 13, (3, 4), generator=torch.Generator().manual_seed(3))
    expected, lp_expected = generate(model, prompt, 16, temperature=0, use_cache=False, return_logprobs=True)
    for lookahead in (1, 3, 6):
        tokens, lp = generate(model, prompt, 16, temperature=0, draft=draft, lookahead=lookahead,
                              return_logprobs=True)
        assert torch.equal(tokens, expected)
        torch.testing.assert_close(lp, lp_expected, atol=1e-10, rtol=0)
    assert torch.equal(generate(model, prompt, 16, temperature=0, draft=model), expected)  # every proposal stands


@pytest.mark.parametrize("kind", ["latent", "moe"])
def test_greedy_speculative_decoding_with_latent_caches_and_experts(kind):
    if kind == "latent":
        options = (LatentOptions(kv_rank=12, rope_dim=4, q_rank=10, nope_dim=4, value_dim=4),)
        model = lm(LatentTransformer, positions="rotary", out_bias=False, options=options)
    else:
        model = lm(MoETransformer, activation="swiglu", options=(MoEOptions(experts=4, top_k=2),))
    draft = lm(depth=1, seed=1, positions="rotary")  # another family entirely: only the vocabulary is shared
    prompt = torch.randint(0, 13, (2, 3), generator=torch.Generator().manual_seed(4))
    expected = generate(model, prompt, 12, temperature=0, use_cache=False)
    assert torch.equal(generate(model, prompt, 12, temperature=0, draft=draft, lookahead=4), expected)


def test_greedy_speculative_decoding_with_eos_and_a_one_token_prompt():
    model, draft = lm(positions="rotary"), lm(depth=1, seed=1, positions="rotary")
    prompt = torch.randint(0, 13, (4, 1), generator=torch.Generator().manual_seed(5))
    plain = generate(model, prompt, 12, temperature=0)
    eos = int(plain[0, 3])  # a token the first row emits early
    expected, lp_expected = generate(model, prompt, 12, temperature=0, eos=eos, return_logprobs=True)
    tokens, lp = generate(model, prompt, 12, temperature=0, eos=eos, draft=draft, return_logprobs=True)
    assert torch.equal(tokens, expected)
    torch.testing.assert_close(lp, lp_expected, atol=1e-10, rtol=0)
    assert torch.equal(model.generate(prompt, 12, temperature=0, draft=draft), plain)  # the model's method forwards


# ---- refusals ------------------------------------------------------------------------------------------------------


def test_the_draft_options_are_checked():
    model, prompt = lm(), torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="draft must share the model's vocabulary \\(13 tokens\\), got a draft of 9"):
        generate(model, prompt, 4, draft=GTransformer(16, 4, 1, 24, 9))
    with pytest.raises(TypeError, match="generate's draft needs a decoder-only model"):
        generate(model, prompt, 4, draft=Seq2SeqTransformer(16, 4, 1, 24, 13, 13))
    with pytest.raises(ValueError, match="lookahead=3 is the draft's proposals per round: give a draft"):
        generate(model, prompt, 4, lookahead=3)
    with pytest.raises(ValueError, match="lookahead must be a positive int"):
        generate(model, prompt, 4, draft=model, lookahead=0)
    with pytest.raises(ValueError, match="use_cache=False contradicts draft"):
        generate(model, prompt, 4, draft=model, use_cache=False)
    with pytest.raises(ValueError, match="prompt_mask is not supported with a draft"):
        generate(model, prompt, 4, draft=model, prompt_mask=torch.ones(1, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="the model must hold every position it reads: .* read 25 positions, but "
                                         "its seq_length is 24"):
        generate(model, prompt, 22, draft=model)
    with pytest.raises(ValueError, match="the draft must hold every position it reads: .* read 23 positions, but "
                                         "its seq_length is 12"):
        generate(model, prompt, 21, draft=GTransformer(16, 4, 1, 12, 13))
    with pytest.raises(TypeError, match="MLMTransformer, which has no new_caches"):
        generate(model, prompt, 4, draft=MLMTransformer(16, 4, 1, 24, 13))
    with pytest.raises(ValueError, match="draft must be on the prompt's device \\(cpu\\), got a draft on meta"):
        generate(model, prompt, 4, draft=lm(depth=1).to("meta"))


def test_the_windows_hold_exactly_the_positions_each_model_reads():
    # The last new token is never read back, and the draft proposes one token fewer than a round adds: a prompt
    # filling the model's context still takes one new token, and a draft one position shorter suffices.
    model, draft = lm(positions="rotary"), lm(depth=1, seed=1)
    full = torch.randint(0, 13, (2, 24), generator=torch.Generator().manual_seed(6))
    assert torch.equal(generate(model, full, 1, temperature=0, draft=draft), generate(model, full, 1, temperature=0))
    short = GTransformer(16, 4, 1, 23, 13).double().eval()  # learned positions: one past its window would raise
    prompt = full[:, :20]
    assert torch.equal(generate(model, prompt, 5, temperature=0, draft=short),
                       generate(model, prompt, 5, temperature=0))


@pytest.mark.parametrize("diverged", ["model", "draft"])
def test_a_diverged_model_or_draft_is_reported_by_name(diverged):
    models = {"model": lm(), "draft": lm(depth=1, seed=1)}
    with torch.no_grad():
        for p in models[diverged].parameters():
            p.fill_(float("nan"))
    with pytest.raises(ValueError, match=f"the {diverged}'s log-probabilities hold NaN.*did training diverge"):
        generate(models["model"], torch.zeros(2, 3, dtype=torch.long), 5, draft=models["draft"], temperature=1.0)
