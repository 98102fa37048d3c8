"""Tests for torchformer.decoding.generation: cached vs uncached decoding, sampling supports, beam search, seq2seq."""

from __future__ import annotations

import contextlib
import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from torchformer import TransformerBlock, TransformerConfig
from torchformer.nn.attention import SelfAttention
from torchformer.decoding.generation import EagerStep, beam_search, generate, sample_next, seq2seq_generate
from torchformer.models import GTransformer, Seq2SeqTransformer
from torchformer.nn.cache import KVCache, RingKVCache


class TableModel(nn.Module):
    """A model whose next-token distribution is a lookup table ``logp[position, last token]``, shape ``(L, v, v)``.

    It follows the generation protocol (``forward(x, *, caches, positions, horizon, keep_last)``,
    ``new_caches(capacity)``, ``config`` with ``seq_length`` and ``num_tokens``), so the probability of any continuation is known exactly: the sum of table
    entries along it.
    """

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = table.log_softmax(dim=-1)
        self.config = TransformerConfig(1, 1, seq_length=table.size(0), num_tokens=table.size(-1))

    def forward(self, x, *, caches=None, positions=None, horizon=None, keep_last=None):
        positions = torch.arange(x.size(1)) if positions is None else positions
        logp = self.table[positions[None, :], x]  # (n, t, v)
        return logp if keep_last is None else logp[:, -keep_last:]

    def new_caches(self, capacity=None):
        return []  # the table needs no state: every position only looks at its own token

    def sequence_score(self, prompt: list[int], new: list[int], *, eos=None, length_penalty=1.0) -> float:
        """Reference score of continuing ``prompt`` with ``new``: log-probabilities up to the first eos."""
        seq, total, length = list(prompt), 0.0, 0
        for token in new:
            total += float(self.table[len(seq) - 1, seq[-1], token])
            seq.append(token)
            length += 1
            if token == eos:
                break
        return total / length**length_penalty


def fixed_distribution_model(probs: list[float], length: int = 8) -> TableModel:
    """Every position predicts the same distribution, whatever the input."""
    v = len(probs)
    logp = torch.tensor(probs, dtype=torch.float64).log()
    return TableModel(logp.expand(length, v, v).clone())


def small_lm(positions: str = "learned", seq_length: int = 12, seed: int = 0) -> GTransformer:
    torch.manual_seed(seed)
    return GTransformer(16, 2, 2, seq_length, 13, positions=positions).double().eval()


def small_seq2seq(seed: int = 0) -> Seq2SeqTransformer:
    torch.manual_seed(seed)
    return Seq2SeqTransformer(16, 2, 2, 10, 9, 11).double().eval()


# ------------------------------------------------------------------------------------------ KV cache


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "none"])
@pytest.mark.parametrize("new", [4, 15])  # 15 runs past the context of 12: the window slides
def test_greedy_with_cache_equals_without(positions, new):
    model = small_lm(positions)
    prompt = torch.randint(0, 13, (3, 5), generator=torch.Generator().manual_seed(1))
    cached, lp_cached = generate(model, prompt, new, temperature=0, return_logprobs=True)
    plain, lp_plain = generate(model, prompt, new, temperature=0, use_cache=False, return_logprobs=True)
    assert cached.shape == (3, 5 + new)
    assert torch.equal(cached[:, :5], prompt)
    assert torch.equal(cached, plain)
    torch.testing.assert_close(lp_cached, lp_plain, rtol=0, atol=1e-10)


def test_cached_logprobs_match_full_forward_pass():
    model = small_lm()
    prompt = torch.randint(0, 13, (4, 3), generator=torch.Generator().manual_seed(2))
    # Sampled, not greedy: the property must hold for whatever tokens were chosen.
    tokens, logprobs = generate(
        model, prompt, 9, temperature=1.3, generator=torch.Generator().manual_seed(0), return_logprobs=True
    )
    assert tokens.shape == (4, 12) and logprobs.shape == (4, 9, 13)
    with torch.no_grad():
        full = model(tokens)  # one forward pass over the final sequence, no cache
    torch.testing.assert_close(logprobs, full[:, 2:-1], rtol=0, atol=1e-10)


@pytest.mark.parametrize("use_cache", [True, False])
def test_past_the_context_the_model_sees_the_last_seq_length_tokens(use_cache):
    model = small_lm("sinusoidal", seq_length=6)
    prompt = torch.randint(0, 13, (2, 4), generator=torch.Generator().manual_seed(3))
    tokens, logprobs = generate(model, prompt, 10, temperature=0, use_cache=use_cache, return_logprobs=True)
    with torch.no_grad():
        for i in range(10):  # the reference: a full forward pass over the cropped window before token 4 + i
            window = tokens[:, : 4 + i][:, -6:]
            torch.testing.assert_close(logprobs[:, i], model(window)[:, -1], rtol=0, atol=1e-10)


def test_long_prompt_is_cropped_to_the_context():
    model = small_lm(seq_length=8)
    prompt = torch.randint(0, 13, (2, 20), generator=torch.Generator().manual_seed(4))
    out = generate(model, prompt, 5, temperature=0)
    assert out.shape == (2, 25) and torch.equal(out[:, :20], prompt)
    assert torch.equal(out[:, 20:], generate(model, prompt[:, -8:], 5, temperature=0)[:, 8:])


class SharpAttention(SelfAttention):
    """A new attention variant: only ``attend`` is overridden (queries scaled by 3)."""

    def attend(self, q, k, v, mask, *, return_weights=False):
        return super().attend(3 * q, k, v, mask, return_weights=return_weights)


class SharpBlock(TransformerBlock):
    attention_class = SharpAttention


class SharpGPT(GTransformer):
    """A model variant is a subclass naming its block class: no flag, no special case in the library."""

    block_class = SharpBlock


def sharpened(model: GTransformer) -> GTransformer:
    """A :class:`SharpGPT` with ``model``'s architecture and weights."""
    sharp = SharpGPT.from_config(model.config).to(next(model.parameters()).dtype).eval()
    sharp.load_state_dict(model.state_dict())
    assert all(type(layer) is SharpAttention for layer in sharp.self_attention_layers())
    return sharp


def test_attention_subclass_reuses_the_cache():
    model = sharpened(small_lm())
    prompt = torch.randint(0, 13, (2, 3), generator=torch.Generator().manual_seed(5))
    cached, lp = generate(model, prompt, 8, temperature=0, return_logprobs=True)
    assert torch.equal(cached, generate(model, prompt, 8, temperature=0, use_cache=False))
    with torch.no_grad():
        torch.testing.assert_close(lp, model(cached)[:, 2:-1], rtol=0, atol=1e-10)


def test_eos_pads_finished_rows():
    # Token 2 is the most likely everywhere, so greedy decoding emits eos=2 at once.
    model = fixed_distribution_model([0.1, 0.2, 0.5, 0.2])
    out, logprobs = generate(model, torch.zeros(2, 1, dtype=torch.long), 5, temperature=0, eos=2,
                             return_logprobs=True)
    assert torch.equal(out[:, 1:], torch.full((2, 5), 2))
    assert torch.all(logprobs[:, 1:, 2] == 0)  # after eos, eos is certain


# ------------------------------------------------------------------------------------------ sampling


def test_top_k_1_equals_greedy():
    model = small_lm()
    prompt = torch.randint(0, 13, (3, 4), generator=torch.Generator().manual_seed(6))
    greedy = generate(model, prompt, 8, temperature=0)
    assert torch.equal(generate(model, prompt, 8, temperature=1.5, top_k=1), greedy)


# Distinct probabilities in scrambled order, so a bug that keeps the first ids instead of the likeliest shows.
PROBS = [0.05, 0.3, 0.1, 0.4, 0.15]  # ranked: 3 (0.4), 1 (0.3), 4 (0.15), 2 (0.1), 0 (0.05)


@pytest.mark.parametrize(
    "options, support",
    [
        (dict(top_k=2), {3, 1}),
        (dict(top_k=3), {3, 1, 4}),
        (dict(top_p=0.4), {3}),  # 0.4 alone reaches p
        (dict(top_p=0.6), {3, 1}),
        (dict(top_p=0.8), {3, 1, 4}),
        (dict(top_k=2, top_p=0.5), {3}),  # renormalised top-2: 0.4 / 0.7 = 0.57 >= 0.5
    ],
)
def test_top_k_top_p_sample_exactly_their_support(options, support):
    model = fixed_distribution_model(PROBS)
    prompt = torch.zeros(400, 1, dtype=torch.long)
    out = generate(model, prompt, 5, generator=torch.Generator().manual_seed(0), **options)
    seen = set(out[:, 1:].unique().tolist())
    assert seen == support  # never outside; and with 2000 draws every token of the support shows up


@settings(max_examples=60, deadline=None)
@given(
    logits=st.lists(st.floats(-5, 5, allow_nan=False), min_size=2, max_size=12),
    top_k=st.integers(1, 12),
    top_p=st.floats(0.01, 1.0),
    seed=st.integers(0, 2**31 - 1),
)
def test_sample_next_stays_in_support(logits, top_k, top_p, seed):
    logp = torch.tensor(logits, dtype=torch.float64).log_softmax(-1).expand(64, -1)
    gen = torch.Generator().manual_seed(seed)
    k_tokens = sample_next(logp, top_k=top_k, generator=gen)
    kth = logp[0].topk(min(top_k, logp.size(1))).values[-1]
    assert torch.all(logp[0, k_tokens] >= kth)
    p_tokens = sample_next(logp, top_p=top_p, generator=gen)
    probs = logp[0].exp()
    for token in p_tokens.tolist():  # the tokens strictly more likely than it must not already reach top_p
        assert probs[probs > probs[token]].sum() < top_p + 1e-12


def test_seeded_sampling_is_reproducible():
    model = fixed_distribution_model([1.0] * 50)  # uniform: two different seeds almost surely disagree
    prompt = torch.zeros(4, 1, dtype=torch.long)
    a = generate(model, prompt, 7, generator=torch.Generator().manual_seed(123))
    b = generate(model, prompt, 7, generator=torch.Generator().manual_seed(123))
    c = generate(model, prompt, 7, generator=torch.Generator().manual_seed(124))
    assert torch.equal(a, b) and not torch.equal(a, c)
    lm = small_lm()
    lm_prompt = torch.randint(0, 13, (2, 3), generator=torch.Generator().manual_seed(7))
    runs = [generate(lm, lm_prompt, 8, top_p=0.9, generator=torch.Generator().manual_seed(9), use_cache=cache)
            for cache in (True, True, False)]
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])


# ------------------------------------------------------------------------------------------ beam search


@pytest.mark.parametrize("eos", [None, 4])
def test_beam_size_1_equals_greedy(eos):
    model = small_lm()
    prompt = torch.randint(0, 13, (3, 4), generator=torch.Generator().manual_seed(8))
    greedy, logprobs = generate(model, prompt, 12, temperature=0, eos=eos, return_logprobs=True)
    beam, scores = beam_search(model, prompt, 12, beam_size=1, eos=eos, length_penalty=0.0)
    assert torch.equal(beam, greedy)
    chosen = logprobs.gather(2, greedy[:, 4:, None]).squeeze(2)  # log p of each greedy token (0 after eos)
    torch.testing.assert_close(scores, chosen.sum(1), rtol=0, atol=1e-10)


def test_beam_search_finds_the_sequence_greedy_misses():
    # Start token 3. First step: A=0 (0.6) or B=1 (0.4). After A every token is equally likely (1/3), after B
    # token C=2 is nearly certain (0.9). Greedy takes A and ends at 0.6 / 3 = 0.2; B C has 0.4 * 0.9 = 0.36.
    v, eps = 4, 1e-9
    table = torch.full((4, v, v), eps, dtype=torch.float64)
    table[0, 3] = torch.tensor([0.6, 0.4, eps, eps])
    table[1, 0] = torch.tensor([1 / 3, 1 / 3, 1 / 3, eps])
    table[1, 1] = torch.tensor([0.05, 0.05, 0.9, eps])
    model = TableModel(table.log())
    prompt = torch.tensor([[3]])
    greedy = generate(model, prompt, 2, temperature=0)
    beam, score = beam_search(model, prompt, 2, beam_size=2, length_penalty=0.0)
    assert beam.tolist() == [[3, 1, 2]] and greedy[0, 1].item() == 0
    assert math.isclose(score.item(), math.log(0.36), rel_tol=1e-6)
    assert model.sequence_score([3], greedy[0, 1:].tolist(), length_penalty=0.0) < score.item()


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    eos=st.one_of(st.none(), st.integers(0, 2)),
    length_penalty=st.sampled_from([0.0, 0.5, 1.0]),
)
def test_wide_beam_finds_the_exhaustive_best(seed, eos, length_penalty):
    # With beam_size >= v ** (steps - 1) no prefix is ever pruned, so beam search must return the best of all
    # v ** steps continuations under the documented score.
    v, steps = 3, 3
    table = torch.randn(6, v, v, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) * 2
    model = TableModel(table)
    prompt = [1, 0]
    best = -math.inf
    for new in itertools.product(range(v), repeat=steps):
        if eos in new and any(token != eos for token in new[new.index(eos):]):
            continue  # not a valid output: after eos comes only eos
        best = max(best, model.sequence_score(prompt, list(new), eos=eos, length_penalty=length_penalty))
    out, score = beam_search(model, torch.tensor([prompt]), steps, beam_size=v ** (steps - 1), eos=eos,
                             length_penalty=length_penalty)
    assert math.isclose(score.item(), best, rel_tol=1e-9, abs_tol=1e-9)
    own = model.sequence_score(prompt, out[0, 2:].tolist(), eos=eos, length_penalty=length_penalty)
    assert math.isclose(own, score.item(), rel_tol=1e-9, abs_tol=1e-9)


@pytest.mark.parametrize("seq_length, eos", [(16, None), (8, 5)])  # 3 + 12 > 8: past the context
def test_beam_search_with_and_without_cache(seq_length, eos):
    model = small_lm(seq_length=seq_length)
    prompt = torch.randint(0, 13, (2, 3), generator=torch.Generator().manual_seed(10))
    a, sa = beam_search(model, prompt, 12, beam_size=4, eos=eos)
    b, sb = beam_search(model, prompt, 12, beam_size=4, eos=eos, use_cache=False)
    assert torch.equal(a, b)
    torch.testing.assert_close(sa, sb, rtol=0, atol=1e-10)


# ------------------------------------------------------------------------------------------ seq2seq


def test_seq2seq_cached_equals_uncached_and_beam_1_is_greedy():
    model = small_seq2seq()
    src = torch.randint(3, 9, (3, 6), generator=torch.Generator().manual_seed(11))
    mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2, [True] * 2 + [False] * 4])
    options = dict(bos=0, eos=1, src_mask=mask)
    greedy = seq2seq_generate(model, src, 9, **options)
    assert greedy.shape == (3, 9)
    assert torch.equal(greedy, seq2seq_generate(model, src, 9, use_cache=False, **options))
    assert torch.equal(greedy, seq2seq_generate(model, src, 9, beam_size=1, top_k=1, temperature=1.0, **options))
    beam = seq2seq_generate(model, src, 9, beam_size=3, **options)
    assert torch.equal(beam, seq2seq_generate(model, src, 9, beam_size=3, use_cache=False, **options))
    # Padding is invisible: a row decoded alone, without its padding, gives the same tokens.
    alone = seq2seq_generate(model, src[1:2, :4], 9, bos=0, eos=1, beam_size=3)
    assert torch.equal(alone, beam[1:2])


def test_seq2seq_encodes_once_and_feeds_one_token_per_step():
    model = small_seq2seq()
    calls = {"encode": 0, "decode_lengths": []}
    encode, decode = model.encode, model.decode

    def counting_encode(*args, **kwargs):
        calls["encode"] += 1
        return encode(*args, **kwargs)

    def recording_decode(tgt, *args, **kwargs):
        calls["decode_lengths"].append(tgt.size(1))
        return decode(tgt, *args, **kwargs)

    model.encode, model.decode = counting_encode, recording_decode
    seq2seq_generate(model, torch.randint(3, 9, (2, 5)), 6, bos=0, eos=1, beam_size=2)
    assert calls["encode"] == 1 and set(calls["decode_lengths"]) == {1}


@pytest.mark.parametrize("beam_size", [1, 3])
def test_seq2seq_computes_the_cross_attention_keys_once_per_source(beam_size):
    """With the cache, each decoder block's cross-attention projects the encoder's output once, when the caches are
    filled, whatever the number of steps (beam search reorders the cached rows instead); without it, every step
    projects it again."""
    model = small_seq2seq()
    src = torch.randint(3, 9, (2, 5), generator=torch.Generator().manual_seed(12))
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    projected = []
    for block in model.decoder.blocks:
        block.cross_attention.tokeys.register_forward_hook(lambda module, args, out: projected.append(out.size(0)))
    options = dict(bos=0, eos=1, src_mask=mask, beam_size=beam_size)
    cached = seq2seq_generate(model, src, 7, **options)
    assert projected == [2] * len(model.decoder.blocks)  # once per block, for the 2 sources (before the beams)
    projected.clear()
    assert torch.equal(seq2seq_generate(model, src, 7, use_cache=False, **options), cached)
    assert len(projected) > len(model.decoder.blocks)


def test_seq2seq_step_by_step_with_filled_caches_equals_the_full_pass():
    """decode with caches filled once (fill_caches), one token at a time and given no memory, computes what the
    full decoder computes; the cached cross-attention keys are never rewritten."""
    model = small_seq2seq()
    src = torch.randint(3, 9, (2, 6), generator=torch.Generator().manual_seed(13))
    src_mask = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    tgt = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(14))
    memory = model.encode(src, src_mask)
    caches = model.new_caches()
    model.fill_caches(caches, memory, src_mask)
    keys = [cache.cross_attention.keys for cache in caches]
    before = [k.clone() for k in keys]
    steps = [model.decode(tgt[:, :2], caches=caches, positions=torch.arange(2))]
    steps += [model.decode(tgt[:, i : i + 1], caches=caches, positions=torch.tensor([i])) for i in range(2, 5)]
    torch.testing.assert_close(torch.cat(steps, dim=1), model.decode(tgt, memory, src_mask), atol=1e-12, rtol=0)
    assert all(c.cross_attention.keys is k and torch.equal(k, b) for c, k, b in zip(caches, keys, before))


# ------------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(temperature=-1.0), "temperature"),
        (dict(top_k=0), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(eos=13), "eos"),
    ],
)
def test_bad_sampling_options_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        generate(small_lm(), torch.zeros(1, 2, dtype=torch.long), 3, **kwargs)


def test_bad_inputs_name_the_argument():
    model = small_lm()
    with pytest.raises(TypeError, match="prompt"):
        generate(model, torch.zeros(1, 2), 3)
    with pytest.raises(ValueError, match="prompt"):
        generate(model, torch.zeros(3, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, torch.zeros(1, 2, dtype=torch.long), 0)
    with pytest.raises(ValueError, match=rf"prompt must hold token ids in \[0, {model.config.num_tokens}\)"):
        generate(model, torch.full((1, 2), model.config.num_tokens), 3)
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(model, torch.zeros(1, 2, dtype=torch.long), 3, beam_size=0)
    with pytest.raises(ValueError, match="max_len"):  # learned positions end at seq_length=10
        seq2seq_generate(small_seq2seq(), torch.zeros(1, 3, dtype=torch.long), 11, bos=0, eos=1)


# ---- a batch of prompts of different lengths, padded on the left ------------------------------------------------


def left_padded(prompts, pad=0):
    """The prompts as one batch padded on the left, and its mask (True at real tokens)."""
    t = max(len(p) for p in prompts)
    ids = torch.stack([torch.cat([torch.full((t - len(p),), pad, dtype=torch.long), p]) for p in prompts])
    mask = torch.stack([torch.arange(t) >= t - len(p) for p in prompts])
    return ids, mask


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rotary", "alibi", "relative"])
@pytest.mark.parametrize("use_cache", [True, False])
def test_a_left_padded_batch_decodes_as_each_prompt_alone(positions, use_cache):
    torch.manual_seed(0)
    model = GTransformer(16, 2, 2, 16, 20, positions=positions, prenorm=True).eval()
    prompts = [torch.randint(1, 20, (n,)) for n in (5, 2, 7, 1)]
    ids, mask = left_padded(prompts, pad=3)  # a pad id that is also a real token: only the mask says which is which
    out, logp = generate(model, ids, 6, temperature=0, prompt_mask=mask, use_cache=use_cache, return_logprobs=True)
    for row, prompt in enumerate(prompts):
        alone, alone_logp = generate(model, prompt[None], 6, temperature=0, return_logprobs=True)
        assert torch.equal(out[row], torch.cat([ids[row], alone[0, len(prompt):]]))
        torch.testing.assert_close(logp[row], alone_logp[0], atol=1e-5, rtol=0)


def test_a_prompt_mask_that_is_not_a_left_padded_batch_is_refused():
    model = GTransformer(16, 2, 1, 8, 20).eval()
    ids, mask = left_padded([torch.tensor([1, 2, 3]), torch.tensor([4])])
    with pytest.raises(ValueError, match="prompt_mask must pad on the left"):
        generate(model, ids, 2, prompt_mask=mask.flip(1))
    with pytest.raises(ValueError, match="prompt_mask has a row with no real token"):
        generate(model, ids, 2, prompt_mask=mask & torch.tensor([[True], [False]]))
    with pytest.raises(ValueError, match="must fit the model's context: .* make 9, but seq_length is 8"):
        generate(model, ids, 6, prompt_mask=mask)
    with pytest.raises(ValueError, match="prompt_mask must have shape"):
        generate(model, ids, 2, prompt_mask=mask[:, 1:])
    with pytest.raises(ValueError, match="leave step out"):
        generate(model, ids, 2, prompt_mask=mask, step=EagerStep(model))
    with pytest.raises(ValueError, match=r"shift must have shape \(b,\) = \(2,\)"):
        model(ids, mask, shift=torch.tensor([0]))


# ---- the horizon: a step reads only the cache slots it can see ---------------------------------------------------


@contextlib.contextmanager
def key_widths(model: GTransformer):
    """Record how many keys the first block's attention reads in each call (the width of its weights)."""
    seen: list[int] = []
    attention = model.blocks.blocks[0].attention
    original = attention.attend

    def spy(q, k, v, mask, **kw):
        seen.append(k.size(2))
        return original(q, k, v, mask, **kw)

    attention.attend = spy
    try:
        yield seen
    finally:
        del attention.attend


def weights_width(model: GTransformer, token: torch.Tensor, position: int, caches, **horizon) -> int:
    """The number of keys the first block's attention read in one cached step."""
    with key_widths(model) as seen:
        model(token, caches=caches, positions=torch.tensor([position]), **horizon)
    return seen[0]


@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_a_cached_step_reads_only_the_slots_up_to_its_horizon_and_equals_recomputing(positions):
    model = small_lm(positions, seq_length=32).double()
    x = torch.randint(0, 13, (2, 9), generator=torch.Generator().manual_seed(3))
    caches = model.new_caches()
    model(x[:, :5], caches=caches, positions=torch.arange(5))
    assert weights_width(model, x[:, 5:6], 5, caches) == 6  # eager: one past the position, read from it
    assert weights_width(model, x[:, 6:7], 6, caches, horizon=16) == 16  # as given (a compiled step's bucket)
    logp = model(x[:, 7:8], caches=caches, positions=torch.tensor([7]), horizon=8)
    torch.testing.assert_close(logp[:, -1], model(x[:, :8])[:, -1], atol=1e-10, rtol=0)
    assert caches[0].self_attention.keys.size(2) == 32  # preallocated: the horizon is a view of the first slots


def test_a_horizon_that_hides_the_new_position_or_comes_without_caches_is_refused():
    model = small_lm("rotary", seq_length=16)
    caches = model.new_caches()
    model(torch.zeros(1, 4, dtype=torch.long), caches=caches, positions=torch.arange(4))
    with pytest.raises(ValueError, match=r"reaches position 4, but horizon=4 reads slots 0 \.\. 3 only"):
        model(torch.zeros(1, 1, dtype=torch.long), caches=caches, positions=torch.tensor([4]), horizon=4)
    with pytest.raises(ValueError, match=r"horizon must be an int in \[1, 16\].*got 17"):
        model(torch.zeros(1, 1, dtype=torch.long), caches=caches, positions=torch.tensor([4]), horizon=17)
    with pytest.raises(ValueError, match="give it with caches"):
        model(torch.zeros(1, 1, dtype=torch.long), horizon=4)
    memory = model.new_memory(4)
    with pytest.raises(ValueError, match="horizon must be None with ring caches"):
        model(torch.zeros(1, 1, dtype=torch.long), caches=memory, positions=torch.tensor([0]), horizon=4)


def test_generation_steps_read_one_slot_more_each_step():
    model = small_lm("rotary", seq_length=24)
    prompt = torch.randint(0, 13, (1, 5), generator=torch.Generator().manual_seed(0))
    with key_widths(model) as widths:
        tokens = generate(model, prompt, 6, temperature=0)
    assert widths == [5, 6, 7, 8, 9, 10]  # the prompt's 5 keys, then one more slot per new token
    assert torch.equal(tokens, generate(model, prompt, 6, temperature=0, use_cache=False))


def test_the_models_generate_methods_are_the_functions():
    model = small_lm("rotary")
    prompt = torch.randint(0, 13, (2, 4), generator=torch.Generator().manual_seed(5))
    assert torch.equal(model.generate(prompt, 5, temperature=0), generate(model, prompt, 5, temperature=0))
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    assert torch.equal(model.generate(prompt, 5, top_k=3, generator=g1), generate(model, prompt, 5, top_k=3,
                                                                                   generator=g2))
    tokens, score = model.beam_search(prompt, 4, beam_size=3)
    expected, expected_score = beam_search(model, prompt, 4, beam_size=3)
    assert torch.equal(tokens, expected)
    torch.testing.assert_close(score, expected_score, atol=0, rtol=0)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(prompt, 5, temperature=-1.0)  # the function's door check, reached through the method
    seq2seq = small_seq2seq()
    src = torch.randint(0, 9, (2, 5), generator=torch.Generator().manual_seed(1))
    assert torch.equal(seq2seq.generate(src, 6, bos=1, eos=2, beam_size=2),
                       seq2seq_generate(seq2seq, src, 6, bos=1, eos=2, beam_size=2))


def test_a_horizon_lasts_one_call_so_the_blocks_called_directly_read_every_slot():
    model = small_lm("rotary", seq_length=16)
    x = torch.randint(0, 13, (1, 7), generator=torch.Generator().manual_seed(2))
    caches = model.new_caches()
    model(x[:, :5], caches=caches, positions=torch.arange(5))
    assert all(cache.self_attention.horizon is None for cache in caches)
    position = torch.tensor([5])
    h = model.blocks(model.embedding(x[:, 5:6], position), positions=position, caches=caches)
    torch.testing.assert_close(model.head(h)[:, -1], model(x[:, :6])[:, -1], atol=1e-10, rtol=0)
    caches[0].set_horizon(3)
    caches[0].reset()
    assert caches[0].self_attention.horizon is None


def test_a_cache_is_dense_only_while_every_slot_it_reads_was_written_without_a_gap_or_padding():
    k = torch.randn(1, 2, 3, 4)
    cache = KVCache(8)
    cache.set_horizon(3, span=(0, 3))
    cache.write((k, k), torch.arange(3))
    assert cache.dense and cache.filled == 3
    cache.set_horizon(None)  # the door clears it after the call: what the host knew was of that call
    assert not cache.dense
    cache.set_horizon(5, span=(3, 4))  # a horizon past the call's last position reads a slot not written yet
    cache.write((k[:, :, :1], k[:, :, :1]), torch.tensor([3]))
    assert not cache.dense and cache.filled == 4
    cache.set_horizon(7, span=(6, 7))  # slot 4 and 5 skipped: a gap
    cache.write((k[:, :, :1], k[:, :, :1]), torch.tensor([6]))
    assert not cache.dense and cache.filled == 4
    cache.set_horizon(5, span=(4, 5))  # the gap's first slot: the prefix grows, the read ends at the call
    cache.write((k[:, :, :1], k[:, :, :1]), torch.tensor([4]))
    assert cache.dense and cache.filled == 5
    state = cache.state_dict()
    loaded = KVCache(8)
    loaded.load_state_dict(state)
    assert loaded.filled == 5  # slots 0 .. 4 (slot 6 lies past the gap)
    cache.set_horizon(6, span=(5, 6))
    cache.write((k[:, :, :1], k[:, :, :1]), torch.tensor([5]), torch.tensor([[False]]))  # padding: masks for good
    assert not cache.dense
    cache.reset()
    assert cache.filled == 0 and not cache.dense
    for bad in [(3, 3), (-1, 2), (0, 9), (0.0, 2), [0, 2]]:
        with pytest.raises(ValueError, match="span must be"):
            cache.set_horizon(2, span=bad)
    ring = RingKVCache(4)
    ring.set_horizon(None, span=(0, 3))
    ring.write((k, k), torch.arange(3))
    assert not ring.dense  # a ring's slots are not its positions


@pytest.mark.parametrize("positions", ["rotary", "alibi", "learned"])
def test_generation_steps_read_dense_caches_and_a_gap_keeps_the_mask(positions, monkeypatch):
    import torchformer.nn.attention as attention

    seen = []

    class Spy(attention.AttentionMask):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen.append(self.ends_aligned)

    monkeypatch.setattr(attention, "AttentionMask", Spy)
    model = small_lm(positions, seq_length=16)
    prompt = torch.randint(0, 13, (1, 4), generator=torch.Generator().manual_seed(3))
    recomputed = generate(model, prompt, 5, temperature=0, use_cache=False)
    seen.clear()
    assert torch.equal(generate(model, prompt, 5, temperature=0), recomputed)
    assert seen == [False] * 2 + [True] * 2 * 4  # the prompt (2 layers), then 4 steps read dense caches
    seen.clear()
    x = torch.randint(0, 13, (1, 8), generator=torch.Generator().manual_seed(4))
    caches = model.new_caches()
    model(x[:, :3], caches=caches, positions=torch.arange(3))
    gap = model(x[:, 5:6], caches=caches, positions=torch.tensor([5]))  # slots 3 and 4 never written
    assert seen == [False] * 4
    # Slots 3 and 4 stay hidden: the last token sees the tokens at positions 0, 1, 2 and 5, as in one uncached
    # pass over them (whose door refuses positions with a gap unless it is told not to read them).
    model.check_values = False
    expected = model(torch.cat([x[:, :3], x[:, 5:6]], dim=1), positions=torch.tensor([0, 1, 2, 5]))[:, -1:]
    torch.testing.assert_close(gap, expected, atol=1e-12, rtol=0)


# ---- what a call allocates and computes: the slots it will use, the last position's head -------------------------


def test_generate_allocates_the_slots_of_the_prompt_and_new_tokens_only():
    model = small_lm("rotary", seq_length=40)
    prompt = torch.randint(0, 13, (2, 5), generator=torch.Generator().manual_seed(4))
    asked = []
    original = model.new_caches

    def spy(capacity=None):
        caches = original(capacity)
        asked.append(caches)
        return caches

    model.new_caches = spy
    tokens = generate(model, prompt, 6, temperature=0)
    tokens_beam, _ = beam_search(model, prompt, 6, beam_size=2)
    del model.new_caches
    assert [c[0].self_attention.keys.size(2) for c in asked] == [11, 11]  # 5 + 6 slots zeroed, not 40
    assert torch.equal(tokens, generate(model, prompt, 6, temperature=0, use_cache=False))
    assert torch.equal(tokens_beam, beam_search(model, prompt, 6, beam_size=2, use_cache=False)[0])
    # Past the window the caches hold seq_length positions, and the window then slides as before.
    long = generate(model, prompt, 45, temperature=0)
    assert torch.equal(long, generate(model, prompt, 45, temperature=0, use_cache=False))
    assert model.new_caches(7)[0].self_attention.capacity == 7 and model.new_caches()[0].self_attention.capacity == 40


@pytest.mark.parametrize("positions", ["learned", "rotary"])
def test_keep_last_gives_the_last_positions_of_the_full_output(positions):
    model = small_lm(positions, seq_length=16)
    x = torch.randint(0, 13, (2, 7), generator=torch.Generator().manual_seed(6))
    full = model(x)
    torch.testing.assert_close(model(x, keep_last=1), full[:, -1:], atol=1e-12, rtol=0)
    torch.testing.assert_close(model(x, keep_last=7), full, atol=1e-12, rtol=0)
    caches = model.new_caches()
    cached = model(x[:, :4], caches=caches, positions=torch.arange(4), keep_last=2)
    torch.testing.assert_close(cached, full[:, 2:4], atol=1e-12, rtol=0)
    for bad in (0, 8, 1.0, True):
        with pytest.raises(ValueError, match=rf"keep_last must be an int in \[1, 7\].*got {bad!r}"):
            model(x, keep_last=bad)
    with pytest.raises(ValueError, match="keep_last"):  # refused before the caches are touched
        model(x[:, 4:5], caches=caches, positions=torch.tensor([4]), keep_last=2)
    assert all(cache.self_attention.horizon is None for cache in caches)
    assert torch.equal(caches[0].self_attention.written[:5], torch.tensor([True] * 4 + [False]))


def test_generate_returns_the_same_tokens_with_and_without_its_log_probabilities():
    model = small_lm("rotary", seq_length=24)
    prompt = torch.randint(0, 13, (3, 4), generator=torch.Generator().manual_seed(8))
    tokens, logprobs = generate(model, prompt, 5, top_k=4, generator=torch.Generator().manual_seed(1),
                                return_logprobs=True)
    assert torch.equal(tokens, generate(model, prompt, 5, top_k=4, generator=torch.Generator().manual_seed(1)))
    positions = torch.arange(tokens.size(1) - 1)
    torch.testing.assert_close(logprobs, model(tokens[:, :-1], positions=positions)[:, 3:], atol=1e-10, rtol=0)
