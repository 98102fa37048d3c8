"""Masked-language-model pretraining (BERT): hide some tokens, train the encoder to fill them in.

An encoder that sees the whole sequence cannot be trained to predict the next token (it would see it). BERT
(Devlin et al. 2019) trains it instead to reconstruct tokens it cannot see: choose 15 % of the real tokens, replace
most of them by a ``[MASK]`` id, and predict the original tokens at exactly those positions. To fill a gap the
model must use the context on both sides, and that is what a classifier fine-tuned on top of the encoder needs.

Of the chosen positions, 80 % show ``[MASK]``, 10 % a random token and 10 % the original token. ``[MASK]`` never
occurs when the encoder is fine-tuned, so if every chosen token were masked, the model would only learn to
represent the masked positions well; the random and unchanged tokens make it keep a useful vector at every
position, since any token might be one it is asked about.

* :func:`mask_tokens` chooses the positions and corrupts the input; padding is never chosen.
* :func:`masked_lm_loss` is the cross-entropy at the chosen positions only.
* :class:`~torchformer.models.MLMTransformer` is the model, and
  :meth:`~torchformer.models.CTransformer.load_encoder` starts a classifier from its encoder.

Shapes: b batch size, t sequence length, v vocabulary size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from torchformer._checks import check_mask, check_positive_int, check_probability, check_tokens, is_int

__all__ = ["IGNORE", "MaskedTokens", "mask_tokens", "masked_lm_loss"]

# The target of a position that is not predicted: PyTorch's default ignore_index of cross_entropy and nll_loss.
IGNORE = -100


@dataclass(frozen=True)
class MaskedTokens:
    """The corrupted input of a masked-language-model step and what to predict.

    Args:
        inputs: the token ids the encoder sees: the originals, except at the chosen positions (``[MASK]``, a random
            token or the original).
        targets: the original id at each chosen position, :data:`IGNORE` everywhere else.
        chosen: True at the positions the loss counts.

    Shapes:
        all three ``(b, t)``.
    """

    inputs: Tensor
    targets: Tensor
    chosen: Tensor


def mask_tokens(tokens: Tensor, mask: Optional[Tensor] = None, *, mask_id: int, num_tokens: int, rate: float = 0.15,
                special_ids: Sequence[int] = (0,), generator: Optional[torch.Generator] = None) -> MaskedTokens:
    """Choose ``rate`` of the real tokens to predict, and corrupt them BERT's way (80 % mask, 10 % random, 10 % kept).

    Each real position is chosen independently with probability ``rate``, so a sequence may have none chosen (its
    positions then add nothing to the loss). Random replacements are drawn uniformly from the ids in
    ``[0, num_tokens)`` other than ``mask_id`` and ``special_ids``.

    Args:
        tokens: token ids.
        mask: True for real tokens, False for padding (never chosen). ``None``: every position is real.
        mask_id: the ``[MASK]`` id (a vocabulary usually has one reserved; torchformer's tokenizers do not, so the
            IMDb example appends it as id ``len(tokenizer)``).
        num_tokens: the vocabulary size ``v``, ``[MASK]`` included.
        rate: the probability that a real position is chosen (BERT: 0.15).
        special_ids: ids that a random replacement never is (default: padding only; pass ``(0, 1)`` to keep
            ``<unk>`` out too). BERT draws from the whole vocabulary; drawing ``[MASK]`` or padding as a "random"
            token would only blur the 80/10/10 split, so they are left out here.
        generator: the random number generator (on ``tokens``' device); ``None`` uses PyTorch's global one.

    Returns:
        The encoder's input, the targets and the chosen positions, as a :class:`MaskedTokens`.

    Shapes:
        ``tokens`` and ``mask`` ``(b, t)`` -> three ``(b, t)`` tensors.
    """
    check_positive_int(num_tokens, "num_tokens")
    tokens = check_tokens(tokens, "tokens", num_tokens)  # values too, on every device (one read)
    if mask is not None:
        check_mask(mask, "mask", tuple(tokens.shape))
    if not is_int(mask_id) or not 0 <= mask_id < num_tokens:
        raise ValueError(f"mask_id must be an int in [0, num_tokens = {num_tokens}), got {mask_id!r}")
    rate = check_probability(rate, "rate")
    if isinstance(special_ids, (str, bytes)) or not isinstance(special_ids, Iterable) or not all(
            is_int(i) and 0 <= i < num_tokens for i in special_ids):
        raise TypeError(f"special_ids must be a sequence of ids in [0, num_tokens = {num_tokens}), got "
                        f"{special_ids!r:.80}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    keep = torch.ones(num_tokens, dtype=torch.bool, device=tokens.device)
    keep[[*special_ids, mask_id]] = False
    allowed = keep.nonzero().squeeze(1)  # (v',): the ids a random replacement may be, ascending
    if len(allowed) == 0:
        raise ValueError(f"no id is left for random replacements: num_tokens = {num_tokens} are all special or "
                         f"[MASK] ({sorted({*special_ids, mask_id})})")

    real = torch.ones_like(tokens, dtype=torch.bool) if mask is None else mask
    draw = dict(device=tokens.device, generator=generator)
    chosen = (torch.rand(tokens.shape, **draw) < rate) & real  # (b, t)
    kind = torch.rand(tokens.shape, **draw)  # which corruption a chosen position gets
    random_ids = allowed[torch.randint(len(allowed), tokens.shape, **draw)]
    inputs = torch.where(chosen & (kind < 0.8), mask_id, tokens)
    inputs = torch.where(chosen & (kind >= 0.8) & (kind < 0.9), random_ids, inputs)  # the last 10 %: kept
    targets = tokens.masked_fill(~chosen, IGNORE)
    return MaskedTokens(inputs, targets, chosen)


def masked_lm_loss(log_probs: Tensor, targets: Tensor) -> Tensor:
    """The mean cross-entropy (nats) of the original tokens at the chosen positions; the others do not count.

    Args:
        log_probs: the model's log-probabilities at every position (:class:`~torchformer.models.MLMTransformer`),
            or at the chosen ones only (its ``select=chosen``).
        targets: :attr:`MaskedTokens.targets`: an id where a token was chosen, :data:`IGNORE` elsewhere; or, with
            log-probabilities of the chosen positions only, ``targets[chosen]``.

    Returns:
        a scalar: the mean over chosen positions, or a zero that still has a gradient if none was chosen (so a
        training step never divides by zero).

    Shapes:
        ``log_probs`` ``(b, t, v)`` and ``targets`` ``(b, t)``, or ``(n, v)`` and ``(n,)`` -> ``()``.

    Raises:
        TypeError: ``log_probs`` is not a floating tensor, or ``targets`` not an int64 one.
        ValueError: ``log_probs`` has no vocabulary dimension, or the two shapes do not agree but for it.
    """
    if not isinstance(log_probs, Tensor) or not log_probs.is_floating_point():
        raise TypeError(f"log_probs must be a float tensor (b, t, v) or (n, v), got "
                        f"{type(log_probs).__name__ if not isinstance(log_probs, Tensor) else log_probs.dtype}")
    if log_probs.dim() < 2:
        raise ValueError(f"log_probs must be (b, t, v) or (n, v): a vocabulary dimension last, got shape "
                         f"{tuple(log_probs.shape)}")
    if not isinstance(targets, Tensor) or targets.dtype != torch.long:
        raise TypeError(f"targets must be an int64 tensor of ids, got "
                        f"{type(targets).__name__ if not isinstance(targets, Tensor) else targets.dtype}")
    if tuple(log_probs.shape[:-1]) != tuple(targets.shape):
        raise ValueError(f"log_probs {tuple(log_probs.shape)} and targets {tuple(targets.shape)} must agree but for "
                         f"the vocabulary: (b, t, v) with (b, t), or, with the model's select=chosen, (n, v) with "
                         f"targets[chosen] (n,)")
    total = F.nll_loss(log_probs.flatten(0, -2), targets.flatten(), ignore_index=IGNORE, reduction="sum")
    return total / (targets != IGNORE).sum().clamp(min=1)
