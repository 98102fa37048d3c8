"""Generating sequences from a trained model: sampling, greedy decoding and beam search, with the KV cache.

A generator predicts one token at a time. Given tokens ``x_0 .. x_{t-1}`` the model returns, at its last position,
log-probabilities ``(b, v)`` for ``x_t``; we pick a token (:func:`~torchformer.decoding.sampling.sample_next`),
append it, and ask again.

**The KV cache** (:mod:`torchformer.nn.cache` says why it is exact). The prompt runs once, writing every layer's
keys and values into a :class:`~torchformer.nn.cache.KVCache` (slot ``p`` for position ``p``), and each later step
feeds only the newest token ``(n, 1)`` with its position ``(1,)``: the cost per token drops from a forward pass over
the whole window to a forward pass over one position.

Each step is done by a *step* object (:class:`EagerStep` by default): ``step.new_caches(prompt, capacity)`` gives
the caches and ``step(token, position, caches)`` returns the next log-probabilities ``(n, v)``. Every step has the
same shapes and only the *values* of ``token`` and ``position`` change, so a step can be compiled once and replayed:
:class:`~torchformer.decoding.compiled.StaticCacheGenerator` passes a compiled step, and nothing else differs.

Any attention variant gets all of this without code of its own: the cache lives in the attention modules'
``forward(..., cache=...)``, and ``attend`` receives absolute positions (``mask.query_positions``,
``mask.key_positions``), which mean the same with and without a cache.

**The context window.** A model built with ``seq_length = L`` only ever sees the last ``L`` tokens (prompts are
cropped the same way, as ``former`` does). Once the sequence outgrows ``L`` the window *slides*: every position
shifts, and every cached key and value with it, so from then on each step is a full forward pass over the last
``L`` tokens, as without a cache, and cached and uncached runs stay identical (``docs/generation.md``).

**Beam search** (:func:`beam_search`) keeps the ``beam_size`` best partial sequences instead of one, which can find
a sequence whose *total* probability is higher although its first token was not the most likely one.

**The model protocol.** The functions here need from a decoder-only ``model`` (:class:`GTransformer` has it):
``model.config`` (a :class:`~torchformer.config.TransformerConfig`: ``seq_length``, ``num_tokens``),
``model.new_caches(capacity=None)`` and ``model(x, *, caches=None, positions=None, horizon=None, keep_last=None)``
-> log-probabilities ``(n, t, v)`` (``horizon``: the cache slots a step reads, one past its position;
``keep_last=1``: only the last position's, ``(n, 1, v)``, which is all a prompt needs). :func:`seq2seq_generate` uses
``encode(src, src_mask)``, ``decode(tgt, memory=None, src_mask=None, *, caches, positions, horizon)``,
``new_caches(capacity)``, ``fill_caches(caches, memory, src_mask)`` and ``config`` of a :class:`Seq2SeqTransformer`
(``src`` is token ids ``(b, u)``, or feature vectors ``(b, u, d)`` when ``config.input_dim`` is set).

Shapes: b batch size, t prompt length, n rows decoded together (``b`` or ``b * beam_size``), v vocabulary size.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from torchformer._checks import (
    check_bool, check_features, check_mask, check_positive_int, check_tokens, is_int, is_number, require_method,
    values_checkable, values_checked,
)
from torchformer.config import TransformerConfig
from torchformer.decoding.sampling import check_finite_logp, check_sampling, row_peaks, sample_next
from torchformer.decoding.speculative import speculative_loop
from torchformer.nn.cache import BlockCache

__all__ = ["EagerStep", "MemoryStep", "beam_search", "generate", "sample_next", "seq2seq_generate"]


def _check_token(value: object, name: str, num_tokens: int) -> None:
    if not is_int(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative int token id, got {value!r}")
    if value >= num_tokens:
        raise ValueError(f"{name} must be a token id in [0, {num_tokens}), got {value}")


def _check_generator(generator: object) -> None:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__} {generator!r}")


def _check_length_penalty(value: object) -> None:
    if not is_number(value) or not math.isfinite(value):
        raise ValueError(f"length_penalty must be a finite float, got {value!r}")


# ----------------------------------------------------------------------------------------------- the step


def _check_prompt_mask(mask: object, prompt: Tensor, new: int, window: int, step: object) -> None:
    """A left-padded batch's mask: ``(b, t)`` bool on the prompt's device, each row's real tokens last and at least
    one of them (one read of the device), the whole fitting the model's window, and no custom step."""
    check_mask(mask, "prompt_mask", tuple(prompt.shape), device=prompt.device)
    if step is not None:
        raise ValueError("prompt_mask decodes with the model itself at each step: leave step out (a compiled "
                         "StaticCacheGenerator takes one prompt length at a time)")
    if prompt.size(1) + new > window:
        raise ValueError(f"a padded batch must fit the model's context: the prompt's {prompt.size(1)} positions and "
                         f"max_new_tokens={new} make {prompt.size(1) + new}, but seq_length is {window}")
    if values_checkable(mask):
        left_padded, nonempty = torch.stack([(mask[:, 1:] >= mask[:, :-1]).all(), mask[:, -1].all()]).tolist()
        if not left_padded:
            raise ValueError("prompt_mask must pad on the left: in each row, once a real token (True) comes, "
                             "every later position must be real too")
        if not nonempty:
            raise ValueError("prompt_mask has a row with no real token: every prompt needs at least one")


class EagerStep:
    """One decoding step, run eagerly: ``(token (n, 1), position (1,), caches) -> log-probabilities (n, v)``.

    The default of :func:`generate`: fresh caches for every call, the model called as it is.
    :class:`~torchformer.decoding.compiled.StaticCacheGenerator` is the same with a compiled call and buffers
    kept between calls.

    Args:
        model: a decoder-only model with the generation protocol (see the module docstring).
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    @property
    def limit(self) -> Optional[int]:
        """The most positions this step's caches can hold: the model's ``seq_length``.

        :func:`generate` asks :meth:`new_caches` for at most this many slots (fewer when the prompt and the new
        tokens need fewer); past it, :func:`generate` slides its window and recomputes. ``None`` is for caches
        that take any position (:class:`MemoryStep`).
        """
        return self.model.config.seq_length

    def new_caches(self, prompt: Tensor, capacity: Optional[int] = None) -> list[BlockCache]:
        """Empty caches for decoding ``prompt`` ``(n, t)``.

        Args:
            prompt: the token ids about to be decoded, ``(n, t)``; unused here (the caches allocate on their first
                write), used by subclasses that keep caches per shape.
            capacity: the most positions the caches will hold (the prompt and the new tokens, at most
                :attr:`limit`): ``model.new_caches(capacity)`` allocates only those slots. ``None``: :attr:`limit`.

        Returns:
            A list of one :class:`~torchformer.nn.cache.BlockCache` per block of the model.
        """
        return self.model.new_caches(capacity)

    def inputs(self, prompt: Tensor) -> tuple[Tensor, Tensor]:
        """The ``(n, 1)`` token and ``(1,)`` position tensors each step writes its input into.

        Args:
            prompt: the token ids about to be decoded, ``(n, t)``: the tensors get its rows and device.

        Returns:
            ``(token, position)``: zeros ``(n, 1)`` and ``(1,)``, long, on the prompt's device.
        """
        token = torch.zeros(prompt.size(0), 1, dtype=torch.long, device=prompt.device)
        return token, torch.zeros(1, dtype=torch.long, device=prompt.device)

    def __call__(self, token: Tensor, position: Tensor, caches: list[BlockCache], *,
                 horizon: Optional[int] = None) -> Tensor:
        """The next log-probabilities ``(n, v)`` after ``token`` ``(n, 1)`` at ``position`` ``(1,)``.

        Args:
            token: the newest token of each row, ``(n, 1)``.
            position: its position ``(1,)``, hence its cache slot.
            caches: what :meth:`new_caches` gave, holding every earlier position.
            horizon: the cache slots to read, one past ``position`` or more (``model(..., horizon=)``); ``None``:
                the model reads ``position`` itself (eager) or every slot.
        """
        return self.model(token, caches=caches, positions=position, horizon=horizon)[:, -1]


class MemoryStep(EagerStep):
    """Decoding with Transformer-XL's segment memory: the model's ring caches (``model.new_memory(memory)``).

    :func:`generate` then feeds a long prompt in segments of ``seq_length`` tokens, and every new token sees the
    last ``memory + seq_length - 1`` positions before it through the ring, for as many tokens as asked: no window
    to recompute. For a model trained with memory (``docs/long-context.md``), this is how it was trained to read.

    Args:
        model: a decoder-only model with ``new_memory`` (a :class:`~torchformer.models.GTransformer` with positions
            inside attention).
        memory: the positions kept before each segment, ``>= 1``.
    """

    def __init__(self, model: nn.Module, memory: int) -> None:
        super().__init__(model)
        self.memory = check_positive_int(memory, "memory")
        new_memory = require_method(model, "new_memory", f"MemoryStep (Transformer-XL's segment memory, memory="
                                                         f"{memory}; a GTransformer with positions inside attention)")
        new_memory(self.memory)  # refuses a model with absolute positions now, not at the first token

    @property
    def limit(self) -> Optional[int]:
        """``None``: a ring holds any position."""
        return None

    def new_caches(self, prompt: Tensor, capacity: Optional[int] = None) -> list[BlockCache]:
        """Empty ring caches for decoding ``prompt``.

        Args:
            prompt: the token ids about to be decoded, ``(n, t)`` (unused: the caches allocate on their first write).
            capacity: unused: a ring holds ``memory + seq_length`` slots, whatever the length decoded.

        Returns:
            ``model.new_memory(memory)``: one :class:`~torchformer.nn.cache.BlockCache` per block.
        """
        return self.model.new_memory(self.memory)


# -------------------------------------------------------------------------------------------- the steppers
#
# A stepper hides how log-probabilities for the next token are obtained (with or without a cache, decoder-only or
# encoder-decoder), so that sampling and beam search are written once.


class _LMStepper:
    """Next-token log-probabilities from a decoder-only model, with a KV cache while the window fits.

    With a ``prompt_mask`` (left-padded prompts), the padding is masked everywhere and each row's positions are
    shifted by its padding (``model(..., shift=)``), so that every row decodes as its prompt alone; such a batch
    always fits the window (:func:`generate` checks), and each step calls the model itself.
    """

    def __init__(self, model: nn.Module, step: Optional[EagerStep], tokens: Tensor, steps: int,
                 prompt_mask: Optional[Tensor] = None) -> None:
        self.model, self.step = model, step
        self.window = model.config.seq_length
        self.limit = None if step is None else step.limit  # None: ring caches, which never need recomputing
        # The positions the caches will hold: the (cropped) prompt and the new tokens, unless the window slides
        # first. A cache zeroes every slot it allocates: seq_length slots for a short call can cost more than it.
        capacity = None if self.limit is None else min(self.limit, min(tokens.size(1), self.window) + steps)
        self.caches = None if step is None else step.new_caches(tokens, capacity)
        if step is not None:
            self.token, self.position = step.inputs(tokens)
        self.cached = 0  # positions held by the caches
        self.prompt_mask = prompt_mask
        self.shift = None if prompt_mask is None else (~prompt_mask).sum(dim=1)  # (n,): each row's left padding

    def start(self, tokens: Tensor) -> Tensor:
        """``(n, t) -> (n, v)``: run the (cropped) prompt, filling the caches."""
        if self.caches is not None and self.limit is None:  # a memory: the whole prompt, a segment at a time
            for begin in range(0, tokens.size(1), self.window):
                segment = tokens[:, begin:begin + self.window]
                logp = self.model(segment, caches=self.caches, keep_last=1,
                                  positions=torch.arange(begin, begin + segment.size(1), device=tokens.device))
            self.cached = tokens.size(1)
            return logp[:, -1]
        window = tokens[:, -self.window :]
        positions = torch.arange(window.size(1), device=tokens.device)
        padding = {} if self.prompt_mask is None else {"mask": self.prompt_mask, "shift": self.shift}
        logp = self.model(window, caches=self.caches, positions=positions if self.caches is not None else None,
                          keep_last=1, **padding)
        self.cached = window.size(1)
        return logp[:, -1]

    def advance(self, tokens: Tensor) -> Tensor:
        """``tokens`` ``(n, t)``, the sequences so far with the newest token last -> ``(n, v)``."""
        if self.caches is not None and (self.limit is None or self.cached < self.limit):
            self.token.copy_(tokens[:, -1:])  # (n, 1) into the step's input memory
            self.position.fill_(self.cached)  # its position = its cache slot; a fill, so no wait for the device
            # The slots the new token can see: those before it and its own (a ring reads all of its own).
            horizon = None if self.limit is None else self.cached + 1
            if self.shift is None:
                logp = self.step(self.token, self.position, self.caches, horizon=horizon)  # type: ignore[misc]
            else:  # the new token is real; its embedding's position is shifted like the rest of its row
                logp = self.model(self.token, caches=self.caches, positions=self.position, shift=self.shift,
                                  horizon=horizon)[:, -1]
            self.cached += 1
            return logp
        if self.prompt_mask is not None:  # no cache: the whole sequence again, the prompt's padding still masked
            mask = F.pad(self.prompt_mask, (0, tokens.size(1) - self.prompt_mask.size(1)), value=True)
            return self.model(tokens, mask, shift=self.shift, keep_last=1)[:, -1]
        # The window slides: every position shifts, so the cached keys and values are stale. Recompute.
        self.caches = None
        return self.model(tokens[:, -self.window :], keep_last=1)[:, -1]

    def reorder(self, index: Tensor) -> None:
        for cache in self.caches or ():
            cache.reorder(index)
        if self.caches is not None and index.numel() != self.token.size(0):
            self.token = self.token.new_zeros(index.numel(), 1)


class _Seq2SeqStepper:
    """Next-token log-probabilities from an encoder-decoder model; the encoder runs once.

    With caches, the cross-attention keys and values of the encoder's output are computed once too
    (``model.fill_caches``), and every step reads them there: the decoder is then given no memory.
    """

    def __init__(self, model: nn.Module, src: Tensor, src_mask: Optional[Tensor], *, use_cache: bool,
                 capacity: int) -> None:
        self.model = model
        memory = model.encode(src, src_mask)  # (b, u, e), the context of every cross-attention
        self.caches = model.new_caches(capacity) if use_cache else None
        if self.caches is None:  # every step reads the memory itself
            self.memory, self.src_mask = memory, src_mask
        else:  # the caches hold the memory's keys, values and padding, computed once here
            model.fill_caches(self.caches, memory, src_mask)
            self.memory = self.src_mask = None
        self.position = torch.zeros(1, dtype=torch.long, device=src.device)

    def start(self, tokens: Tensor) -> Tensor:
        positions = torch.arange(tokens.size(1), device=tokens.device) if self.caches is not None else None
        return self.model.decode(tokens, self.memory, self.src_mask, caches=self.caches, positions=positions)[:, -1]

    def advance(self, tokens: Tensor) -> Tensor:
        if self.caches is None:
            return self.model.decode(tokens, self.memory, self.src_mask)[:, -1]
        self.position.fill_(tokens.size(1) - 1)  # self-attention writes the new position's slot
        return self.model.decode(tokens[:, -1:], caches=self.caches, positions=self.position,
                                 horizon=tokens.size(1))[:, -1]

    def reorder(self, index: Tensor) -> None:
        if self.memory is not None:
            self.memory = self.memory.index_select(0, index)
        if self.src_mask is not None:
            self.src_mask = self.src_mask.index_select(0, index)
        for cache in self.caches or ():  # the cross-attention parts' rows too
            cache.reorder(index)


def decoder_config(model: object, caller: str, *, encoder_decoder: bool = False) -> TransformerConfig:
    """The config of ``model`` if it is the kind of torchformer model ``caller`` decodes with.

    Otherwise a ``TypeError`` that says what is needed and what was given, instead of a missing attribute deep in
    the decoding loop.

    Args:
        model: the model to decode with.
        caller: the name the error message gives the caller (``"generate"``, ``"beam_search"``, ...).
        encoder_decoder: whether ``caller`` needs an encoder-decoder model (a config with ``tgt_tokens``) rather
            than a decoder-only one.

    Returns:
        ``model.config``.

    Raises:
        TypeError: ``model`` has no :class:`~torchformer.config.TransformerConfig` or no ``new_caches`` (a
            masked-LM encoder), is a classifier, or is of the other kind (decoder-only or encoder-decoder).
    """
    config = getattr(model, "config", None)
    caches = hasattr(model, "new_caches")  # the protocol's caches: a masked-LM encoder has a config but none
    if isinstance(config, TransformerConfig) and config.num_classes is None and caches and \
            (config.tgt_tokens is not None) == encoder_decoder:
        return config
    wanted = ("an encoder-decoder model (Seq2SeqTransformer)" if encoder_decoder
              else "a decoder-only model (GTransformer or a subclass)")
    got = type(model).__name__
    if isinstance(config, TransformerConfig) and config.num_classes is not None:
        got += ", a classifier"
    elif isinstance(config, TransformerConfig) and not caches:
        got += ", which has no new_caches (not a generator)"
    raise TypeError(f"{caller} needs {wanted}, got {got}")


# --------------------------------------------------------------------------------------------- the loops


def _point_mass(logp: Tensor, token: int) -> Tensor:
    """Log-probabilities ``(..., v)`` that put all mass on ``token``: 0 there, -inf elsewhere."""
    out = torch.full_like(logp, -math.inf)
    out[..., token] = 0.0
    return out


def _sample_loop(stepper, tokens: Tensor, steps: int, *, eos: int | None, keep: bool,
                 **sampling) -> tuple[Tensor, Optional[Tensor]]:
    """Append ``steps`` sampled tokens to ``tokens`` ``(n, t)``; returns ``(n, t + steps)`` and, with ``keep``, the
    log-probabilities ``(n, steps, v)`` each token was drawn from (a point mass on ``eos`` once a row has finished)."""
    n = tokens.size(0)
    done = torch.zeros(n, dtype=torch.bool, device=tokens.device)
    logp = stepper.start(tokens)
    history, peaks = [], []  # the log-probabilities when kept; every step's row maxima, to check them once
    for step in range(steps):
        if eos is not None:
            logp = torch.where(done[:, None], _point_mass(logp, eos), logp)
        if keep:
            history.append(logp)
        peaks.append(row_peaks(logp))  # (n, 1): NaN or +inf where the row holds one
        nxt = sample_next(logp, peak=peaks[-1], **sampling)
        if eos is not None:
            nxt = nxt.masked_fill(done, eos)
            done = done | (nxt == eos)
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)
        # Reading `done` waits for the device, so only when a row can finish: without eos the host runs ahead.
        if step == steps - 1 or (eos is not None and bool(done.all())):
            break
        logp = stepper.advance(tokens)
    check_finite_logp(torch.stack(peaks, dim=1))  # once, not per step: on a GPU each check waits for the device
    missing = steps - len(peaks)
    if missing:  # every row finished early: the rest is eos, with certainty
        tokens = torch.cat([tokens, tokens.new_full((n, missing), eos)], dim=1)  # type: ignore[arg-type]
        if keep:
            history.extend([_point_mass(history[-1], eos)] * missing)  # type: ignore[arg-type]
    return tokens, torch.stack(history, dim=1) if keep else None  # (n, steps, v)


def _beam_loop(stepper, tokens: Tensor, steps: int, *, beam_size: int, length_penalty: float,
               eos: int | None) -> tuple[Tensor, Tensor]:
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
    check_finite_logp(final)  # NaN ranks above every number in topk: it would have won silently
    pick = final.argmax(dim=-1)  # (b,)
    tokens = tokens.view(b, k, -1)[torch.arange(b, device=device), pick]
    return tokens, final.gather(1, pick[:, None]).squeeze(1)


def _normalise(total: Tensor, length: Tensor, length_penalty: float) -> Tensor:
    """Beam score: total log-probability divided by ``length ** length_penalty`` (0: the plain total)."""
    return total / length.clamp(min=1).to(total.dtype) ** length_penalty


# ----------------------------------------------------------------------------------------------- public API


@torch.no_grad()
def generate(model: nn.Module, prompt: Tensor, max_new_tokens: int, *, temperature: float = 1.0,
             top_k: Optional[int] = None, top_p: Optional[float] = None, eos: Optional[int] = None,
             use_cache: bool = True, generator: Optional[torch.Generator] = None, return_logprobs: bool = False,
             step: Optional[EagerStep] = None, prompt_mask: Optional[Tensor] = None, draft: Optional[nn.Module] = None,
             lookahead: Optional[int] = None) -> Tensor | tuple[Tensor, Tensor]:
    """Extend ``prompt`` by ``max_new_tokens`` tokens, sampled (or greedy) from a generator model.

    The returned sequences start with the whole prompt, but the model only ever sees the last ``model.seq_length``
    tokens (see the module docstring for what happens past the context), unless ``step`` is a :class:`MemoryStep`
    (Transformer-XL's segment memory: the whole prompt is read, and every token sees the last
    ``memory + seq_length - 1`` positions). Once a row emits ``eos`` the rest of it is
    ``eos``, and decoding stops when every row has finished.

    Runs without gradients; call ``model.eval()`` first, or dropout stays active.

    Args:
        model: a generator (a :class:`~torchformer.models.GTransformer`, or a model with its interface).
        prompt: the token ids to continue.
        max_new_tokens: how many tokens to add.
        temperature: divides the log-probabilities before sampling, as in :func:`sample_next`; ``0`` is greedy.
        top_k: sample only among the ``top_k`` most likely tokens; ``None``: all.
        top_p: sample only among the most likely tokens whose probabilities sum to ``top_p`` (nucleus sampling).
        eos: the end-of-sequence id, or ``None`` for none.
        use_cache: ``False`` recomputes the whole window for every token (slow; the same tokens).
        generator: a :class:`torch.Generator` that makes sampling reproducible.
        return_logprobs: also return the model's log-probabilities (before temperature, top-k and top-p) from which
            each new token was chosen.
        step: how one cached step runs (default :class:`EagerStep`; a compiled one is
            :class:`~torchformer.decoding.compiled.StaticCacheGenerator`; through a segment memory,
            :class:`MemoryStep`).
        prompt_mask: ``(b, t)`` bool, True at real tokens, for a batch of prompts of different lengths padded on
            the left (as Hugging Face tokenizers pad for generation): each row then decodes as its prompt alone
            (the padding masked, positions counted from each row's first real token), with or without the cache.
            The prompt and the new tokens must fit ``seq_length``, and ``step`` must be left out.
        draft: a small decoder-only model of the same vocabulary for speculative decoding
            (:mod:`~torchformer.decoding.speculative`): it proposes ``lookahead`` tokens, the model checks them in
            one call. Greedy output is plain greedy decoding's (up to floating-point rounding: a near-tie in
            bfloat16 can flip, as between cached and uncached decoding), sampled output has the model's
            distribution; both models in eval mode (dropout, or experts' capacity per batch, would break this).
            Every position read must fit each model's ``seq_length`` (no sliding window); no ``step``,
            ``prompt_mask`` or ``use_cache=False``. ``None``: no draft.
        lookahead: the tokens the draft proposes per round, ``>= 1`` (4 if ``None``); only with ``draft``.

    Returns:
        The token ids ``(b, t + max_new_tokens)`` for a prompt ``(b, t)``; with ``return_logprobs``, also the
        log-probabilities ``(b, max_new_tokens, v)``.

    Raises:
        TypeError: ``model`` (or ``draft``) is not a decoder-only model, or ``generator`` not a generator.
        ValueError: an option is out of range or contradicts another (each message names it).
    """
    config = decoder_config(model, "generate")
    # The prompt's values too, once per call (whatever the model's check_values): the loop reads none.
    prompt = check_tokens(prompt, "prompt", config.num_tokens, values=True)
    check_positive_int(max_new_tokens, "max_new_tokens")
    check_sampling(temperature, top_k, top_p)
    if eos is not None:
        _check_token(eos, "eos", config.num_tokens)
    check_bool(use_cache, "use_cache")  # "no" would be truthy
    check_bool(return_logprobs, "return_logprobs")
    _check_generator(generator)
    if prompt_mask is not None:
        _check_prompt_mask(prompt_mask, prompt, max_new_tokens, config.seq_length, step)
    if step is not None and not use_cache:
        raise ValueError(f"step={type(step).__name__} runs cached steps, but use_cache is False: leave one out")
    if draft is not None:
        _check_draft(draft, config, prompt, max_new_tokens, use_cache=use_cache, step=step, prompt_mask=prompt_mask)
        with values_checked():
            return _speculative(model, draft, prompt, max_new_tokens, lookahead=4 if lookahead is None else
                                check_positive_int(lookahead, "lookahead"), eos=eos, keep=return_logprobs,
                                temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
    if lookahead is not None:
        raise ValueError(f"lookahead={lookahead!r} is the draft's proposals per round: give a draft model too")
    if step is None and use_cache:
        step = EagerStep(model)
    with values_checked():  # the prompt is checked; the model reads no values at each token (a GPU would wait)
        stepper = _LMStepper(model, step if use_cache else None, prompt, max_new_tokens, prompt_mask)
        tokens, logprobs = _sample_loop(stepper, prompt, max_new_tokens, eos=eos, keep=return_logprobs,
                                        temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
    return (tokens, logprobs) if return_logprobs else tokens


def _check_draft(draft: object, config: TransformerConfig, prompt: Tensor, new: int, *, use_cache: bool,
                 step: object, prompt_mask: object) -> None:
    """A draft for speculative decoding: decoder-only, of the model's vocabulary, with everything in both windows."""
    draft_config = decoder_config(draft, "generate's draft")
    if draft_config.num_tokens != config.num_tokens:
        raise ValueError(f"draft must share the model's vocabulary ({config.num_tokens} tokens), got a draft of "
                         f"{draft_config.num_tokens}")
    if not use_cache:
        raise ValueError("use_cache=False contradicts draft: speculative decoding runs both models with their caches")
    if step is not None:
        raise ValueError(f"step={type(step).__name__} is not supported with a draft: speculative decoding calls both "
                         f"models eagerly; leave step out")
    if prompt_mask is not None:
        raise ValueError("prompt_mask is not supported with a draft (prompts of one length only): decode the "
                         "padded batch without a draft, or each prompt alone")
    # The positions each model reads (the last new token is never read back; the draft proposes one token fewer
    # than a round adds): with a draft, the window cannot slide.
    t = prompt.size(1)
    for name, length, reads in [("model", config.seq_length, t + new - 1),
                                ("draft", draft_config.seq_length, t + new - 2 if new > 1 else 0)]:
        if reads > length:
            raise ValueError(f"with a draft, the {name} must hold every position it reads: the prompt's {t} tokens "
                             f"and max_new_tokens={new} make it read {reads} positions, but its seq_length is "
                             f"{length} (without a draft, generate slides the window instead)")
    weight = next(iter(draft.parameters()), None)  # type: ignore[attr-defined]
    if weight is not None and weight.device != prompt.device:
        raise ValueError(f"draft must be on the prompt's device ({prompt.device}), got a draft on {weight.device}")


def _speculative(model: nn.Module, draft: nn.Module, prompt: Tensor, new: int, *, keep: bool,
                 **options) -> Tensor | tuple[Tensor, Tensor]:
    tokens, logprobs = speculative_loop(model, draft, prompt, new, keep=keep, **options)
    return (tokens, logprobs) if keep else tokens  # type: ignore[return-value]


@torch.no_grad()
def beam_search(model: nn.Module, prompt: Tensor, max_new_tokens: int, *, beam_size: int, length_penalty: float = 1.0,
                eos: Optional[int] = None, use_cache: bool = True) -> tuple[Tensor, Tensor]:
    """Beam search from ``prompt``: the best sequence of each prompt, and its score.

    Each of the ``b`` prompts keeps ``beam_size`` hypotheses. At every step each hypothesis is extended by every
    token, and the ``beam_size`` best extensions survive. A hypothesis that emits ``eos`` is finished: it stays in
    the beam, padded with ``eos``, and competes with its final score.

    The score of a sequence is ``sum(log p(generated tokens)) / length ** length_penalty``, where ``length`` counts
    the generated tokens up to and including the first ``eos`` (all ``max_new_tokens`` if none).

    Args:
        model: a generator (a :class:`~torchformer.models.GTransformer`, or a model with its interface).
        prompt: the token ids to continue.
        max_new_tokens: how many tokens to add.
        beam_size: hypotheses kept per prompt; ``1`` is greedy decoding.
        length_penalty: ``0`` scores by the total log-probability, which favours short sequences when ``eos`` can
            end them; ``1`` (the default) by the mean log-probability per token.
        eos: the end-of-sequence id, or ``None`` for none.
        use_cache: ``False`` recomputes the whole window for every token (slow; the same result).

    Returns:
        ``(sequences, scores)``: the best sequences ``(b, t + max_new_tokens)`` for a prompt ``(b, t)``, and their
        scores ``(b,)``.
    """
    config = decoder_config(model, "beam_search")
    prompt = check_tokens(prompt, "prompt", config.num_tokens, values=True)
    check_positive_int(max_new_tokens, "max_new_tokens")
    check_positive_int(beam_size, "beam_size")
    _check_length_penalty(length_penalty)
    if eos is not None:
        _check_token(eos, "eos", config.num_tokens)
    check_bool(use_cache, "use_cache")
    with values_checked():  # the prompt is checked; the model reads no values at each token
        stepper = _LMStepper(model, EagerStep(model) if use_cache else None, prompt, max_new_tokens)
        return _beam_loop(stepper, prompt, max_new_tokens, beam_size=beam_size, length_penalty=length_penalty,
                          eos=eos)


@torch.no_grad()
def seq2seq_generate(model: nn.Module, src: Tensor, max_len: int, *, bos: int, eos: int,
                     src_mask: Optional[Tensor] = None, beam_size: int = 1, temperature: float = 0.0,
                     top_k: Optional[int] = None, top_p: Optional[float] = None, length_penalty: float = 1.0,
                     use_cache: bool = True, generator: Optional[torch.Generator] = None) -> Tensor:
    """Translate ``src`` with an encoder-decoder model: greedy, sampled or beam-searched target ids.

    The encoder runs once. The decoder starts from ``bos`` and produces up to ``max_len`` tokens (``bos`` is not
    part of the result); after ``eos`` a row is padded with ``eos``. With the cache, the decoder's self-attention
    writes one position per step and its cross-attention computes the encoder's keys and values once.
    ``beam_size=1`` samples (``temperature=0``, the default, is greedy); ``beam_size > 1`` runs
    :func:`beam_search`'s algorithm and returns the best hypothesis.

    With learned positions the decoder sees at most ``model.config.seq_length`` target positions, so ``max_len``
    may be at most that (the last generated token is never fed back); sinusoidal or no positions have no limit.

    Args:
        model: an encoder-decoder (a :class:`~torchformer.models.Seq2SeqTransformer`).
        src: the source: token ids, or feature vectors for a model built with ``input_dim=d``.
        max_len: the most target tokens to produce.
        bos: the id the decoder starts from.
        eos: the end-of-sequence id.
        src_mask: True for real source tokens; ``None``: all are real.
        beam_size: ``1`` samples; more runs a beam search with that many hypotheses.
        temperature: as in :func:`sample_next`; ``0`` (the default) is greedy.
        top_k: as in :func:`sample_next`.
        top_p: as in :func:`sample_next`.
        length_penalty: as in :func:`beam_search`.
        use_cache: ``False`` recomputes every position at every step (slow; the same result).
        generator: a :class:`torch.Generator` that makes sampling reproducible.

    Returns:
        Target ids ``(b, max_len)`` for a source ``(b, u)`` (ids) or ``(b, u, d)`` (vectors), ``src_mask`` ``(b, u)``.
    """
    config = decoder_config(model, "seq2seq_generate", encoder_decoder=True)
    if config.input_dim is None:
        src = check_tokens(src, "src", config.num_tokens, values=True)
    else:  # feature vectors: shape and dtype only, there are no ids to range-check
        src = check_features(src, "src", config.input_dim)
    check_positive_int(max_len, "max_len")
    check_positive_int(beam_size, "beam_size")
    check_sampling(temperature, top_k, top_p)
    check_bool(use_cache, "use_cache")
    _check_generator(generator)
    if beam_size > 1 and (temperature != 0 or top_k is not None or top_p is not None or generator is not None):
        raise ValueError(f"temperature, top_k, top_p and generator choose how beam_size=1 samples; beam search "
                         f"(beam_size={beam_size}) keeps the most likely hypotheses and takes none of them")
    _check_length_penalty(length_penalty)
    _check_token(bos, "bos", config.tgt_tokens)
    _check_token(eos, "eos", config.tgt_tokens)
    if config.position_limit is not None and max_len > config.position_limit:
        raise ValueError(f"max_len must be at most the model's seq_length ({config.position_limit}) with learned "
                         f"positions (the decoder has no position vectors beyond it), got {max_len}")
    # The decoder reads bos and the first max_len - 1 generated tokens: max_len positions in its caches.
    start = torch.full((src.size(0), 1), bos, dtype=torch.long, device=src.device)  # ids, whatever src holds
    with values_checked():  # src is checked; the model reads no values at each token
        stepper = _Seq2SeqStepper(model, src, src_mask, use_cache=use_cache, capacity=max_len)
        if beam_size > 1:
            tokens, _ = _beam_loop(stepper, start, max_len, beam_size=beam_size, length_penalty=length_penalty,
                                   eos=eos)
        else:
            tokens, _ = _sample_loop(stepper, start, max_len, eos=eos, keep=False, temperature=temperature,
                                     top_k=top_k, top_p=top_p, generator=generator)
    return tokens[:, 1:]
