"""Generating sequences from a trained model: sampling, greedy decoding, beam search, and the KV cache.

A generator predicts one token at a time. Given tokens ``x_0 .. x_{t-1}`` the model returns, at its last position,
log-probabilities ``(b, v)`` for ``x_t``; we pick a token, append it, and ask again.

**Picking the token.** :func:`sample_next` turns the log-probabilities into a choice:

* ``temperature`` divides the logits before the softmax. ``1`` samples from the model's own distribution, values
  below 1 sharpen it, above 1 flatten it, and ``0`` is *greedy* decoding: always the most likely token
  (``argmax``, ties to the lowest token id).
* ``top_k`` keeps only the ``k`` most likely tokens, ``top_p`` (nucleus sampling) the smallest set of most likely
  tokens whose probabilities add up to at least ``p``. Both renormalise and sample within that support; they cut
  off the long tail of unlikely tokens that, sampled often enough, derails a text.

**The KV cache.** Recomputing the whole sequence for every new token costs a full forward pass per token. But
attention is causal: the keys and values of earlier positions never change when a token is appended. So every
attention layer keeps a :class:`~torchformer.nn.attention.KVCache` with the keys and values computed so far,
``(b, h, u, s)`` (batch, heads, positions, head size). Each step then feeds only the newest token, ``(b, 1)``, at
absolute position ``offset = u``: it is projected to a query, key and value ``(b, h, 1, s)``, the key and value are
appended to the cache (``u -> u + 1``), and the query attends over all ``u + 1`` cached positions. The cost per
token drops from a forward pass over the whole window to a forward pass over one position (plus reading the cache).

The cache lives in the attention modules' ``forward(..., cache=...)`` argument, not in this file, so any subclass
of :class:`~torchformer.nn.attention.MultiHeadAttention` gets it for free if it keeps the order
*project -> cache.update -> attend -> unify*: override :meth:`~torchformer.nn.attention.MultiHeadAttention.attend`
(or the projections), not ``forward``. ``attend`` then receives the new queries ``(b, h, t, s)`` and *all* keys and
values ``(b, h, u, s)``; with ``causal=True`` query ``i`` sits at absolute position ``u - t + i``, and it must
ignore the keys that ``key_mask`` rules out (with a :class:`~torchformer.nn.attention.StaticKVCache`, the slots not
filled yet). A variant that needs extra per-layer state (say, running sums for linear attention) subclasses
``KVCache`` and keeps the ``update``/``key_mask``/``reorder``/``len`` interface. See ``docs/generation.md`` for a
worked example.

**The context window.** A model built with ``seq_length = L`` only ever sees the last ``L`` tokens (prompts are
cropped the same way, as ``former`` does). While the sequence fits, the cache grows. Once it would exceed ``L`` the
window *slides*: the oldest token drops out, every remaining position shifts, and with it every cached key and
value (their positions change, and deeper layers' keys depend on the dropped token). So from then on each step is
a full forward pass over the last ``L`` tokens, as without a cache: generation past the context keeps working, at
the uncached cost of one ``L``-token forward pass per token, and cached and uncached runs stay identical.

**Beam search** (:func:`beam_search`) keeps the ``beam_size`` best partial sequences instead of one, which can find
a sequence whose *total* probability is higher although its first token was not the most likely one.

**The model protocol.** The functions here need only this from a decoder-only ``model`` (:class:`GTransformer`
provides it; a hand-written test model can too):

* ``model(x, *, caches=None, offset=None)`` -> log-probabilities ``(n, t, v)``. Without caches ``x`` ``(n, t)`` is a
  whole window starting at position 0; with caches it holds only the new tokens, starting at position ``offset``
  (the number of cached positions).
* ``model.new_caches()`` -> a list of objects with ``reorder(index)`` (batch rows to keep, for beam search).
* ``model.seq_length``: the longest window the model can see.

:func:`seq2seq_generate` uses ``encode(src, src_mask)``, ``decode(tgt, memory, src_mask, *, caches, offset)``,
``new_caches()`` and ``seq_length``/``positions_kind`` of a :class:`Seq2SeqTransformer`.

Shapes: b batch size, t prompt length, n rows decoded together (``b`` or ``b * beam_size``), v vocabulary size.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["beam_search", "generate", "sample_next", "seq2seq_generate"]


# --------------------------------------------------------------------------------------------------- checks


def _check_count(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def _check_prompt(prompt: object, name: str, num_tokens: int | None = None) -> Tensor:
    if not isinstance(prompt, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids, shape (b, t), got {type(prompt).__name__}")
    if prompt.dtype.is_floating_point or prompt.dtype.is_complex or prompt.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids (e.g. torch.long), got dtype {prompt.dtype}")
    if prompt.dim() != 2 or prompt.size(1) == 0 or prompt.size(0) == 0:
        raise ValueError(f"{name} must have shape (b, t) with b, t >= 1, got shape {tuple(prompt.shape)}")
    if num_tokens is not None:
        lo, hi = int(prompt.min()), int(prompt.max())
        if lo < 0 or hi >= num_tokens:
            raise ValueError(f"{name} must hold token ids in [0, {num_tokens}), got values in [{lo}, {hi}]")
    return prompt.long()


def _check_token(value: object, name: str, num_tokens: int | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int token id, got {value!r}")
    if num_tokens is not None and value >= num_tokens:
        raise ValueError(f"{name} must be a token id in [0, {num_tokens}), got {value}")
    return value


def _check_sampling(temperature: object, top_k: object, top_p: object) -> None:
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0:
        raise ValueError(f"temperature must be a float >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None:
        _check_count(top_k, "top_k")
    if top_p is not None and (
        isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0.0 < top_p <= 1.0
    ):
        raise ValueError(f"top_p must be a float in (0, 1], got {top_p!r}")


# ------------------------------------------------------------------------------------------------- sampling


def sample_next(
    logp: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Choose one token per row from log-probabilities (or logits) ``(n, v)``; returns token ids ``(n,)``.

    ``temperature=0`` (or ``top_k=1``) is greedy: ``argmax``, ties resolved to the lowest id. Otherwise the logits
    are divided by ``temperature``, restricted to the ``top_k`` most likely tokens and then to the nucleus of
    probability ``top_p`` (the smallest set of most likely tokens whose probability reaches ``top_p``; the most
    likely token always stays), renormalised, and sampled with ``generator`` (on the same device as ``logp``).
    """
    if not isinstance(logp, Tensor) or logp.dim() != 2 or not logp.is_floating_point():
        shape = tuple(logp.shape) if isinstance(logp, Tensor) else type(logp).__name__
        raise ValueError(f"logp must be a float tensor of shape (n, v), got {shape}")
    _check_sampling(temperature, top_k, top_p)
    if temperature == 0 or top_k == 1:
        return logp.argmax(dim=-1)
    # Half precision loses too much in the softmax and cumulative sums below.
    logits = logp.float() if logp.element_size() < 4 else logp
    logits = logits / temperature
    if top_k is not None and top_k < logits.size(-1):
        # Keep exactly k tokens (by index, so ties at the k-th value cannot widen the support).
        keep = torch.zeros_like(logits, dtype=torch.bool)
        keep.scatter_(-1, logits.topk(top_k, dim=-1).indices, True)
        logits = logits.masked_fill(~keep, -math.inf)
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs  # probability of the strictly more likely tokens
        drop_sorted = before >= top_p  # the nucleus is complete before this token; column 0 always stays
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, -math.inf)
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(-1)


# -------------------------------------------------------------------------------------------- the steppers
#
# A stepper hides how log-probabilities for the next token are obtained (with or without a cache, decoder-only or
# encoder-decoder), so that sampling and beam search are written once.


class _LMStepper:
    """Next-token log-probabilities from a decoder-only model, with a KV cache while the window fits."""

    def __init__(self, model: nn.Module, *, use_cache: bool) -> None:
        self.model = model
        self.window = _check_count(getattr(model, "seq_length", None), "model.seq_length")
        self.caches = model.new_caches() if use_cache else None
        self.cached = 0  # positions held by the caches

    def start(self, tokens: Tensor) -> Tensor:
        """``(n, t) -> (n, v)``: run the (cropped) prompt, filling the caches."""
        window = tokens[:, -self.window :]
        logp = self.model(window, caches=self.caches, offset=0)[:, -1]
        self.cached = window.size(1)
        return logp

    def advance(self, tokens: Tensor) -> Tensor:
        """``tokens`` ``(n, t)``, the sequences so far with the newest token last -> ``(n, v)``."""
        if self.caches is not None and self.cached < self.window:
            logp = self.model(tokens[:, -1:], caches=self.caches, offset=self.cached)[:, -1]
            self.cached += 1
            return logp
        # The window slides: every position shifts, so the cached keys and values are stale. Recompute.
        self.caches = None
        return self.model(tokens[:, -self.window :])[:, -1]

    def reorder(self, index: Tensor) -> None:
        for cache in self.caches or ():
            cache.reorder(index)


class _Seq2SeqStepper:
    """Next-token log-probabilities from an encoder-decoder model; the encoder runs once."""

    def __init__(self, model: nn.Module, src: Tensor, src_mask: Tensor | None, *, use_cache: bool) -> None:
        self.model, self.src_mask = model, src_mask
        self.memory = model.encode(src, src_mask)  # (b, u, e), the context of every cross-attention
        self.caches = model.new_caches() if use_cache else None

    def start(self, tokens: Tensor) -> Tensor:
        return self.model.decode(tokens, self.memory, self.src_mask, caches=self.caches, offset=0)[:, -1]

    def advance(self, tokens: Tensor) -> Tensor:
        if self.caches is None:
            return self.model.decode(tokens, self.memory, self.src_mask)[:, -1]
        # Self-attention appends the new position; cross-attention reuses the keys/values of the first step.
        offset = tokens.size(1) - 1
        return self.model.decode(tokens[:, -1:], self.memory, self.src_mask, caches=self.caches, offset=offset)[:, -1]

    def reorder(self, index: Tensor) -> None:
        self.memory = self.memory.index_select(0, index)
        if self.src_mask is not None:
            self.src_mask = self.src_mask.index_select(0, index)
        for cache in self.caches or ():
            cache.reorder(index)


# --------------------------------------------------------------------------------------------- the loops


def _point_mass(logp: Tensor, token: int) -> Tensor:
    """Log-probabilities ``(..., v)`` that put all mass on ``token``: 0 there, -inf elsewhere."""
    out = torch.full_like(logp, -math.inf)
    out[..., token] = 0.0
    return out


def _sample_loop(stepper, tokens: Tensor, steps: int, *, eos: int | None, **sampling) -> tuple[Tensor, Tensor]:
    """Append ``steps`` sampled tokens to ``tokens`` ``(n, t)``; returns ``(n, t + steps)`` and the log-probabilities
    ``(n, steps, v)`` each token was drawn from (a point mass on ``eos`` once a row has finished)."""
    n = tokens.size(0)
    done = torch.zeros(n, dtype=torch.bool, device=tokens.device)
    logp = stepper.start(tokens)
    history = []
    for step in range(steps):
        if eos is not None:
            logp = torch.where(done[:, None], _point_mass(logp, eos), logp)
        history.append(logp)
        nxt = sample_next(logp, **sampling)
        if eos is not None:
            nxt = nxt.masked_fill(done, eos)
            done = done | (nxt == eos)
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)
        # Reading `done` waits for the device, so only when a row can finish: without eos the host runs ahead.
        if step == steps - 1 or (eos is not None and bool(done.all())):
            break
        logp = stepper.advance(tokens)
    missing = steps - len(history)
    if missing:  # every row finished early: the rest is eos, with certainty
        tokens = torch.cat([tokens, tokens.new_full((n, missing), eos)], dim=1)  # type: ignore[arg-type]
        history.extend([_point_mass(history[-1], eos)] * missing)  # type: ignore[arg-type]
    return tokens, torch.stack(history, dim=1)


def _beam_loop(
    stepper, tokens: Tensor, steps: int, *, beam_size: int, length_penalty: float, eos: int | None
) -> tuple[Tensor, Tensor]:
    """Beam search from ``tokens`` ``(b, t)``; returns the best ``(b, t + steps)`` and their scores ``(b,)``."""
    b, t = tokens.shape
    k, device = beam_size, tokens.device
    logp = stepper.start(tokens)  # (b, v): run the prompt once, then copy its state to the k beams
    v = logp.size(-1)
    rows = torch.arange(b, device=device).repeat_interleave(k)  # (b * k,)
    stepper.reorder(rows)
    logp, tokens = logp.index_select(0, rows), tokens.index_select(0, rows)
    # All beams start identical; only the first may expand, or we would get k copies of the same sequence.
    # Sums of many log-probabilities: at least float32 even for a half-precision model.
    total = torch.full((b, k), -math.inf, dtype=torch.promote_types(logp.dtype, torch.float32), device=device)
    total[:, 0] = 0.0
    length = torch.zeros(b, k, dtype=torch.long, device=device)  # generated tokens up to and including eos
    done = torch.zeros(b, k, dtype=torch.bool, device=device)
    for step in range(steps):
        logp = logp.view(b, k, v)
        if eos is not None:  # a finished beam can only continue with eos, at no cost
            logp = torch.where(done[..., None], _point_mass(logp, eos), logp)
        candidate = total[..., None] + logp  # (b, k, v): total log-probability of every one-token extension
        new_length = (length + (~done).long())[..., None].expand(b, k, v)
        # Rank by the final score. Unfinished beams all have the same length, so among them this is the plain
        # total; it matters when comparing a finished (shorter) beam with unfinished ones.
        score = _normalise(candidate, new_length, length_penalty)
        best = score.view(b, k * v).topk(k, dim=-1).indices  # (b, k)
        origin, token = best // v, best % v  # which beam each survivor extends, and with which token
        total = candidate.view(b, k * v).gather(1, best)
        length = new_length.reshape(b, k * v).gather(1, best)
        done = done.gather(1, origin) | (token == eos if eos is not None else torch.zeros_like(done))
        index = (origin + torch.arange(b, device=device)[:, None] * k).view(-1)  # rows of the (b * k) batch
        tokens = torch.cat([tokens.index_select(0, index), token.view(-1, 1)], dim=1)
        if step == steps - 1 or (eos is not None and bool(done.all())):
            break
        stepper.reorder(index)
        logp = stepper.advance(tokens)
    missing = t + steps - tokens.size(1)
    if missing:
        tokens = torch.cat([tokens, tokens.new_full((b * k, missing), eos)], dim=1)  # type: ignore[arg-type]
    final = _normalise(total, length, length_penalty)  # (b, k)
    pick = final.argmax(dim=-1)  # (b,)
    tokens = tokens.view(b, k, -1)[torch.arange(b, device=device), pick]
    return tokens, final.gather(1, pick[:, None]).squeeze(1)


def _normalise(total: Tensor, length: Tensor, length_penalty: float) -> Tensor:
    """Beam score: total log-probability divided by ``length ** length_penalty`` (0: the plain total)."""
    return total / length.clamp(min=1).to(total.dtype) ** length_penalty


# ----------------------------------------------------------------------------------------------- public API


@torch.no_grad()
def generate(
    model: nn.Module,
    prompt: Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos: int | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    return_logprobs: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Extend ``prompt`` ``(b, t)`` by ``max_new_tokens`` tokens; returns ``(b, t + max_new_tokens)`` token ids.

    The returned sequences start with the whole prompt, but the model only ever sees the last ``model.seq_length``
    tokens (see the module docstring for what happens past the context). Sampling is controlled by
    ``temperature``, ``top_k`` and ``top_p`` as in :func:`sample_next`; ``temperature=0`` is greedy. Once a row
    emits ``eos`` the rest of it is ``eos``, and decoding stops when every row has finished. ``use_cache=False``
    recomputes the whole window for every token (slow; the same tokens). ``generator`` makes sampling
    reproducible. With ``return_logprobs=True`` also returns ``(b, max_new_tokens, v)``: the model's
    log-probabilities (before temperature, top-k and top-p) from which each new token was chosen.

    Runs without gradients; call ``model.eval()`` first, or dropout stays active.
    """
    return _generate(
        lambda: _LMStepper(model, use_cache=use_cache), model, prompt, max_new_tokens, temperature=temperature,
        top_k=top_k, top_p=top_p, eos=eos, generator=generator, return_logprobs=return_logprobs,
    )


def _generate(
    make_stepper, model: nn.Module, prompt: object, max_new_tokens: object, *, eos: int | None,
    return_logprobs: bool, **sampling
) -> Tensor | tuple[Tensor, Tensor]:
    """:func:`generate` with the stepper ``make_stepper()``: check the arguments, then sample."""
    num_tokens = getattr(model, "num_tokens", None)
    prompt = _check_prompt(prompt, "prompt", num_tokens)
    _check_count(max_new_tokens, "max_new_tokens")
    _check_sampling(sampling["temperature"], sampling["top_k"], sampling["top_p"])
    if eos is not None:
        _check_token(eos, "eos", num_tokens)
    stepper = make_stepper()
    tokens, logprobs = _sample_loop(stepper, prompt, max_new_tokens, eos=eos, **sampling)  # type: ignore[arg-type]
    return (tokens, logprobs) if return_logprobs else tokens


@torch.no_grad()
def beam_search(
    model: nn.Module,
    prompt: Tensor,
    max_new_tokens: int,
    *,
    beam_size: int,
    length_penalty: float = 1.0,
    eos: int | None = None,
    use_cache: bool = True,
) -> tuple[Tensor, Tensor]:
    """Beam search from ``prompt`` ``(b, t)``: the best sequences ``(b, t + max_new_tokens)`` and their scores ``(b,)``.

    Each of the ``b`` prompts keeps ``beam_size`` hypotheses. At every step each hypothesis is extended by every
    token, and the ``beam_size`` best extensions survive. A hypothesis that emits ``eos`` is finished: it stays in
    the beam, padded with ``eos``, and competes with its final score.

    The score of a sequence is ``sum(log p(generated tokens)) / length ** length_penalty``, where ``length`` counts
    the generated tokens up to and including the first ``eos`` (all ``max_new_tokens`` if none). With
    ``length_penalty=0`` it is the total log-probability, which favours short sequences when ``eos`` can end them;
    1 (the default) is the mean log-probability per token. ``beam_size=1`` is greedy decoding.
    """
    prompt = _check_prompt(prompt, "prompt", getattr(model, "num_tokens", None))
    _check_count(max_new_tokens, "max_new_tokens")
    _check_count(beam_size, "beam_size")
    _check_length_penalty(length_penalty)
    if eos is not None:
        _check_token(eos, "eos", getattr(model, "num_tokens", None))
    stepper = _LMStepper(model, use_cache=use_cache)
    return _beam_loop(stepper, prompt, max_new_tokens, beam_size=beam_size, length_penalty=length_penalty, eos=eos)


def _check_length_penalty(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"length_penalty must be a finite float, got {value!r}")
    return float(value)


@torch.no_grad()
def seq2seq_generate(
    model: nn.Module,
    src: Tensor,
    max_len: int,
    *,
    bos: int,
    eos: int,
    src_mask: Tensor | None = None,
    beam_size: int = 1,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    length_penalty: float = 1.0,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Translate ``src`` ``(b, u)`` with an encoder-decoder model; returns target ids ``(b, max_len)``.

    The encoder runs once. The decoder starts from ``bos`` and produces up to ``max_len`` tokens (``bos`` is not
    part of the result); after ``eos`` a row is padded with ``eos``. With the cache, the decoder's self-attention
    appends one position per step and its cross-attention computes the encoder's keys and values once.
    ``beam_size=1`` samples (``temperature=0``, the default, is greedy; ``top_k``/``top_p``/``generator`` as in
    :func:`sample_next`); ``beam_size > 1`` runs :func:`beam_search`'s algorithm and returns the best hypothesis.

    With learned positions the decoder sees at most ``model.seq_length`` target positions, so ``max_len`` may be
    at most that (the last generated token is never fed back); sinusoidal or no positions have no limit.
    """
    src = _check_prompt(src, "src", getattr(getattr(model, "src_embedding", None), "num_tokens", None))
    _check_count(max_len, "max_len")
    _check_count(beam_size, "beam_size")
    _check_sampling(temperature, top_k, top_p)
    _check_length_penalty(length_penalty)
    num_tokens = getattr(model, "tgt_tokens", None)
    _check_token(bos, "bos", num_tokens)
    _check_token(eos, "eos", num_tokens)
    if getattr(model, "positions_kind", "learned") == "learned" and max_len > model.seq_length:
        raise ValueError(
            f"max_len must be at most the model's seq_length ({model.seq_length}) with learned positions "
            f"(the decoder has no position vectors beyond it), got {max_len}"
        )
    stepper = _Seq2SeqStepper(model, src, src_mask, use_cache=use_cache)
    start = src.new_full((src.size(0), 1), bos)
    if beam_size > 1:
        tokens, _ = _beam_loop(stepper, start, max_len, beam_size=beam_size, length_penalty=length_penalty, eos=eos)
    else:
        tokens, _ = _sample_loop(
            stepper, start, max_len, eos=eos, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator
        )
    return tokens[:, 1:]
