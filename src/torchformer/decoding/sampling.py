"""Picking the next token from the model's log-probabilities: greedy, temperature, top-k and nucleus sampling.

* ``temperature`` divides the logits before the softmax. ``1`` samples from the model's own distribution, values
  below 1 sharpen it, above 1 flatten it, and ``0`` is *greedy* decoding: always the most likely token
  (``argmax``, ties to the lowest token id).
* ``top_k`` keeps only the ``k`` most likely tokens, ``top_p`` (nucleus sampling) the smallest set of most likely
  tokens whose probabilities add up to at least ``p``. Both renormalise and sample within that support; they cut
  off the long tail of unlikely tokens that, sampled often enough, derails a text.

Shapes: n rows, v vocabulary size.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from torchformer._checks import check_positive_int, is_number

__all__ = ["check_finite_logp", "check_sampling", "filtered_logits", "is_greedy", "row_peaks", "sample_next"]


def check_sampling(temperature: object, top_k: object, top_p: object) -> None:
    """Check the sampling options and raise a :class:`ValueError` naming the bad one.

    Args:
        temperature: must be a finite float >= 0 (0 is greedy).
        top_k: must be ``None`` or a positive int.
        top_p: must be ``None`` or a float in (0, 1].

    Raises:
        ValueError: an option is out of its range or of the wrong type (a bool included).
    """
    if not is_number(temperature) or not temperature >= 0 or not math.isfinite(temperature):
        raise ValueError(f"temperature must be a finite float >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None:
        check_positive_int(top_k, "top_k")
    if top_p is not None and (not is_number(top_p) or not 0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be a float in (0, 1], got {top_p!r}")


def check_finite_logp(logp: Tensor, *, source: str = "the model") -> None:
    """Raise ``ValueError`` if the log-probabilities ``(..., v)`` hold NaN or +inf.

    Argmax would silently pick that entry, and sampling would fail deep inside ``torch.multinomial``. (``-inf`` is
    fine: an impossible token.) Reading the result waits for the device, so call it once, not per step. A row's
    maximum is NaN or +inf exactly when the row holds one, so the row maxima ``(..., 1)`` (:func:`row_peaks`) may
    be checked instead of the rows, with the same result.

    Args:
        logp: log-probabilities (or scores, or their row maxima) ``(..., v)``, on any device.
        source: what made them, for the message (``"the draft"`` in speculative decoding).

    Raises:
        ValueError: some entry is NaN or +inf; the message counts the rows and names the first.
    """
    if logp.numel() == 0:  # no entry, nothing wrong (and no maximum to take)
        return
    _check_peaks(row_peaks(logp), source)


def row_peaks(logp: Tensor) -> Tensor:
    """Each row's largest log-probability, ``(..., v) -> (..., 1)``, which the checks here read instead of the rows.

    NaN if the row holds NaN, ``+inf`` if it holds that, ``-inf`` if it has no possible token: one pass over the rows.

    Args:
        logp: log-probabilities or logits ``(..., v)``.

    Returns:
        The row maxima ``(..., 1)``.
    """
    return logp.amax(dim=-1, keepdim=True)


def _check_peaks(peak: Tensor, source: str = "the model") -> None:
    bad = peak.isnan() | peak.isposinf()  # (..., 1)
    if bool(bad.any()):
        rows = bad.flatten().nonzero().flatten().tolist()
        raise ValueError(f"{source}'s log-probabilities hold NaN or +inf (in {len(rows)} of {bad.numel()} rows, the "
                         f"first at row {rows[0]}): its weights are probably NaN or infinite (did training diverge?), "
                         f"or its input holds NaN")


def sample_next(logp: Tensor, *, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                generator: torch.Generator | None = None, peak: Tensor | None = None) -> Tensor:
    """Choose one token per row from log-probabilities (or logits) ``(n, v)``; returns token ids ``(n,)``.

    ``temperature=0`` (or ``top_k=1``, or a temperature below float32's smallest normal number, 1.2e-38) is greedy:
    ``argmax``, ties resolved to the lowest id. Otherwise the logits
    are divided by ``temperature``, restricted to the ``top_k`` most likely tokens and then to the nucleus of
    probability ``top_p`` (the smallest set of most likely tokens whose probability reaches ``top_p``; the most
    likely token always stays), renormalised, and sampled with ``generator`` (on the same device as ``logp``).

    NaN in ``logp`` (a model whose weights diverged) is a ``ValueError`` for a CPU tensor. On an accelerator the
    check would make the host wait for the device at every token, so there :func:`check_finite_logp` runs once
    over all the steps, as ``generate`` and ``beam_search`` do when they finish.

    Args:
        logp: log-probabilities or logits ``(n, v)``, float (half precision is computed in float32).
        temperature: divides the logits; ``0`` (or below 1.2e-38) is greedy, 1 the model's own distribution.
        top_k: keep only the ``top_k`` most likely tokens (exactly ``k``, ties broken by index); ``None``: all.
        top_p: keep only the nucleus of probability ``top_p``; ``None`` or 1: all.
        generator: the :class:`torch.Generator` to sample with, on ``logp``'s device; ``None``: torch's global
            one. Greedy decoding draws nothing.
        peak: ``logp``'s row maxima ``(n, 1)`` (:func:`row_peaks`), when the caller has them already (a decoding
            loop keeps them, to check them all at the end); trusted, so the NaN check reads them instead of
            ``logp``. ``None``: computed here.

    Returns:
        The chosen token ids ``(n,)``, long.

    Raises:
        ValueError: ``logp`` is not a float ``(n, v)`` tensor, ``peak`` not ``(n, 1)``, a sampling option is out of
            range, or (CPU only) ``logp`` holds NaN or +inf, or a row is ``-inf`` everywhere.
    """
    if not isinstance(logp, Tensor) or logp.dim() != 2 or not logp.is_floating_point() or logp.size(-1) == 0:
        shape = tuple(logp.shape) if isinstance(logp, Tensor) else type(logp).__name__
        raise ValueError(f"logp must be a float tensor of shape (n, v) with v >= 1, got {shape}")
    check_sampling(temperature, top_k, top_p)
    if peak is None:
        peak = row_peaks(logp)  # (n, 1)
    elif not isinstance(peak, Tensor) or tuple(peak.shape) != (logp.size(0), 1):
        shape = tuple(peak.shape) if isinstance(peak, Tensor) else type(peak).__name__
        raise ValueError(f"peak must be logp's row maxima, shape ({logp.size(0)}, 1), got {shape}")
    if logp.device.type == "cpu":
        _check_peaks(peak)
        impossible = peak.isneginf()
        if bool(impossible.any()):
            raise ValueError(f"row {int(impossible.flatten().nonzero()[0])} of logp gives every token log-probability "
                             f"-inf: there is no token to choose")
    if is_greedy(temperature, top_k):
        return logp.argmax(dim=-1)
    logits = filtered_logits(logp, peak, temperature=temperature, top_k=top_k, top_p=top_p)
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(-1)


def is_greedy(temperature: float, top_k: int | None) -> bool:
    """Whether these options pick the most likely token (:func:`sample_next`'s greedy cases).

    Args:
        temperature: as in :func:`sample_next`, checked.
        top_k: as in :func:`sample_next`, checked.

    Returns:
        True for ``temperature`` 0 (or below float32's smallest normal number) or ``top_k=1``.
    """
    # Below float32's smallest normal number a temperature would round to 0 in the division (0/0 = NaN); long
    # before that, every other token's probability is exactly 0: it is greedy decoding.
    return temperature < torch.finfo(torch.float32).tiny or top_k == 1


def filtered_logits(logp: Tensor, peak: Tensor, *, temperature: float, top_k: int | None,
                    top_p: float | None) -> Tensor:
    """The logits whose softmax :func:`sample_next` samples from: tempered, then cut to the top-k and the nucleus.

    Args:
        logp: log-probabilities or logits ``(..., v)``.
        peak: their row maxima ``(..., 1)`` (:func:`row_peaks`).
        temperature: as in :func:`sample_next`, not greedy (:func:`is_greedy`).
        top_k: as in :func:`sample_next`.
        top_p: as in :func:`sample_next`.

    Returns:
        ``(..., v)``, at least float32; ``-inf`` outside the support.
    """
    # Half precision loses too much in the softmax and cumulative sums below.
    logits = logp.float() if logp.element_size() < 4 else logp
    # Shifting each row by its maximum changes no probability, and keeps a tiny temperature from turning the
    # largest logit into +inf (and the softmax into NaN): shifted logits are <= 0, so they divide to -inf at worst.
    logits = (logits - peak.to(logits.dtype)) / temperature
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
    return logits
