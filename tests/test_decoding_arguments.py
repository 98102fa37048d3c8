"""Decoding refuses what it cannot do with an error that names it (torchformer.decoding), found by a hostile probe:
models of the wrong kind, sampling arguments beam search would ignore, temperatures that overflow, rows with no
possible token, and a cross-attention cache that was never filled or is given its source twice."""

from __future__ import annotations

import math

import pytest
import torch

from torchformer import CTransformer, GTransformer, Seq2SeqTransformer, StaticCacheGenerator, generate
from torchformer import beam_search, seq2seq_generate
from torchformer.decoding.sampling import sample_next

torch.manual_seed(0)
G = GTransformer(16, 2, 1, 8, 20)
C = CTransformer(16, 2, 1, 8, 20, 2)
S = Seq2SeqTransformer(16, 2, 1, 8, 20, tgt_tokens=12, decoder_depth=1)
PROMPT = torch.tensor([[1, 2, 3]])


@pytest.mark.parametrize("call, match", [
    (lambda: seq2seq_generate(G, PROMPT, 4, bos=1, eos=2), "seq2seq_generate needs an encoder-decoder model.*GTransformer"),
    (lambda: generate(C, PROMPT, 4), "generate needs a decoder-only model.*CTransformer, a classifier"),
    (lambda: generate(S, PROMPT, 4), "generate needs a decoder-only model.*Seq2SeqTransformer"),
    (lambda: beam_search(C, PROMPT, 4, beam_size=2), "beam_search needs a decoder-only model"),
    (lambda: StaticCacheGenerator(C), "StaticCacheGenerator needs a decoder-only model.*CTransformer"),
    (lambda: StaticCacheGenerator(None), "StaticCacheGenerator needs a decoder-only model.*NoneType"),
    (lambda: StaticCacheGenerator(G, compile="no"), "compile must be a bool, got 'no'"),
    # A flag given as a string is truthy: "no" used the cache, "yes" returned a tuple.
    (lambda: generate(G, PROMPT, 2, use_cache="no"), "use_cache must be a bool, got 'no'"),
    (lambda: generate(G, PROMPT, 2, return_logprobs="yes"), "return_logprobs must be a bool, got 'yes'"),
    (lambda: beam_search(G, PROMPT, 2, beam_size=2, use_cache="x"), "use_cache must be a bool, got 'x'"),
    (lambda: seq2seq_generate(S, PROMPT, 4, bos=1, eos=2, use_cache="x"), "use_cache must be a bool, got 'x'"),
    # Failed inside torch.multinomial, or was ignored with temperature=0.
    (lambda: generate(G, PROMPT, 2, temperature=1.0, generator=0), "generator must be a torch.Generator or None, "
                                                                      "got int 0"),
    (lambda: generate(G, PROMPT, 2, temperature=0, generator=0), "generator must be a torch.Generator or None"),
    (lambda: seq2seq_generate(S, PROMPT, 4, bos=1, eos=2, generator="g"), "generator must be a torch.Generator"),
])
def test_the_wrong_kind_of_model_or_flag_is_named(call, match):
    with pytest.raises(TypeError, match=match):
        call()


@pytest.mark.parametrize("extra", [{"temperature": 5.0}, {"top_k": 1}, {"top_p": 0.5},
                                   {"generator": torch.Generator()}])
def test_beam_search_refuses_sampling_arguments_it_would_ignore(extra):
    with pytest.raises(ValueError, match="beam search \\(beam_size=3\\) keeps the most likely hypotheses"):
        seq2seq_generate(S, PROMPT, 5, bos=1, eos=2, beam_size=3, **extra)
    seq2seq_generate(S, PROMPT, 5, bos=1, eos=2, beam_size=3)  # without them it runs


def test_a_tiny_temperature_is_greedy_not_an_overflow():
    # Dividing the raw log-probabilities by 1e-40 overflowed to inf and NaN inside torch.multinomial.
    logp = torch.log_softmax(torch.randn(4, 20, generator=torch.Generator().manual_seed(1)), dim=-1)
    for temperature in (1e-40, 1e-300, 5e-324):
        assert torch.equal(sample_next(logp, temperature=temperature), logp.argmax(-1))
    G.eval()
    assert torch.equal(generate(G, PROMPT, 3, temperature=1e-40), generate(G, PROMPT, 3, temperature=0.0))


@pytest.mark.parametrize("temperature", [math.inf, math.nan, -1.0])
def test_temperatures_that_are_no_temperature_are_refused(temperature):
    with pytest.raises(ValueError, match="temperature must be a finite float >= 0"):
        generate(G, PROMPT, 3, temperature=temperature)


def test_rows_without_a_possible_token_are_named():
    logp = torch.zeros(3, 4)
    logp[2] = -math.inf
    with pytest.raises(ValueError, match="row 2 of logp gives every token log-probability -inf"):
        sample_next(logp)
    with pytest.raises(ValueError, match="v >= 1, got \\(2, 0\\)"):
        sample_next(torch.zeros(2, 0))
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        sample_next(torch.tensor([[0.0, math.inf]]), temperature=0.0)


def test_a_cross_attention_cache_is_filled_once_explicitly():
    # Decoding step by step with caches: the source's keys come from fill_caches, once, and nowhere else (a second
    # source of the same length used to get the first one's keys, silently, until a weak reference guarded it).
    S.eval()
    src_a, src_b = torch.tensor([[3, 4, 5, 6]]), torch.tensor([[7, 8, 9, 10]])
    tgt = torch.tensor([[1, 5]])
    caches = S.new_caches()
    memory_a = S.encode(src_a)
    with pytest.raises(ValueError, match=r"never filled: .*model.fill_caches\(caches, memory, src_mask\)"):
        S.decode(tgt[:, :1], caches=caches, positions=torch.tensor([0]))
    assert all(cache.self_attention.empty for cache in caches)  # refused before anything was written
    S.fill_caches(caches, memory_a)
    S.decode(tgt[:, :1], caches=caches, positions=torch.tensor([0]))
    with pytest.raises(ValueError, match="memory and src_mask must be None with caches"):
        S.decode(tgt[:, 1:], S.encode(src_b), caches=caches, positions=torch.tensor([1]))
    with pytest.raises(ValueError, match="already filled"):
        S.fill_caches(caches, S.encode(src_b))
    with pytest.raises(ValueError, match=r"memory must be given without caches: the encoder's output \(b, u, e\)"):
        S.decode(tgt)  # no caches: the memory is needed
    for cache in caches:
        cache.reset()
    memory_b = S.encode(src_b)
    S.fill_caches(caches, memory_b)
    cached = [S.decode(tgt[:, :1], caches=caches, positions=torch.tensor([0])),
              S.decode(tgt[:, 1:], caches=caches, positions=torch.tensor([1]))]
    torch.testing.assert_close(torch.cat(cached, dim=1), S.decode(tgt, memory_b))


# ---------------------------------------------------------------------------------------------------------
# Module and model arguments the probe found accepted with a silently wrong meaning


def test_module_flags_must_be_bools_and_positions_a_known_scheme():
    from torchformer import AttentionMask, SelfAttention

    for kwargs, error, match in [({"wide": "False"}, TypeError, "wide must be a bool, got 'False'"),
                                 ({"causal": "no"}, TypeError, "causal must be a bool, got 'no'"),
                                 ({"kqnorm": 1}, TypeError, "kqnorm must be a bool, got 1"),
                                 ({"positions": "rotray"}, ValueError, "positions must be one of .*got 'rotray'"),
                                 ({"positions": None}, ValueError, "positions must be one of .*got None")]:
        with pytest.raises(error, match=match):
            SelfAttention(16, 2, **kwargs)
    q = torch.arange(4)
    for window in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="window must be a positive int or None"):
            AttentionMask(q, q, window=window)
    with pytest.raises(TypeError, match="key_mask must have dtype torch.bool"):
        AttentionMask(q, q, torch.ones(1, 4))


def test_config_stores_plain_floats_so_checkpoints_can_hold_it(tmp_path):
    np = pytest.importorskip("numpy")
    from torchformer.train.checkpoint import save_checkpoint

    model = GTransformer(16, 2, 1, 8, 20, dropout=np.float64(0.1))
    assert type(model.config.dropout) is float
    save_checkpoint(tmp_path / "c.pt", model=model, step=0)  # failed: "cannot save ... numpy.float64"


def test_seq2seq_capacity_zero_and_empty_memory_are_errors():
    with pytest.raises(ValueError, match="capacity must be a positive int .*got 0"):
        S.new_caches(0)
    with pytest.raises(ValueError, match="memory must hold at least one position"):
        S.decode(torch.tensor([[1]]), torch.zeros(1, 0, 16))


def test_first_pooling_refuses_padding_at_position_zero():
    model = CTransformer(16, 2, 1, 8, 20, 2, pool="first")
    ids = torch.tensor([[0, 5, 6], [5, 6, 7]])
    with pytest.raises(ValueError, match=r"pool='first' classifies from position 0.*rows \[0\]"):
        model(ids, torch.tensor([[False, True, True], [True, True, True]]))
    model(ids, torch.tensor([[True, True, False], [True, True, True]]))  # padding on the right is fine


def test_a_cross_attention_cache_remembers_the_source_padding():
    """The steps take no source mask: the caches keep the one fill_caches was given (without it, or with another
    one, steps attended to the padded source positions, 0.07 away from the full pass, silently)."""
    src = torch.randint(0, 20, (2, 5))
    src_mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]).bool()
    tgt = torch.randint(0, 12, (2, 4))
    with torch.no_grad():
        memory = S.encode(src, src_mask)
        full = S.decode(tgt, memory, src_mask)
        caches = S.new_caches()
        S.fill_caches(caches, memory, src_mask)
        first = S.decode(tgt[:, :2], caches=caches, positions=torch.arange(2))
        steps = [S.decode(tgt[:, i:i + 1], caches=caches, positions=torch.tensor([i])) for i in (2, 3)]
        torch.testing.assert_close(torch.cat([first, *steps], dim=1), full, rtol=1e-5, atol=1e-5)
        with pytest.raises(ValueError, match="memory and src_mask must be None with caches"):
            S.decode(tgt[:, :1], None, torch.ones(2, 5, dtype=torch.bool), caches=caches, positions=torch.tensor([4]))
