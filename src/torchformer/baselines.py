"""Baselines: the simpler models a transformer is measured against.

A figure alone says little: 87 % on IMDb is good or poor depending on what a simpler model reaches with the same
tokens, the same data and the same training budget. A *baseline* is that simpler model, trained by the same loop, so
that the difference between the two is what the architecture buys. :class:`LSTMClassifier` is the recurrent side
of the comparison of recurrent networks with attention on IMDb (``docs/imdb.md``).

It is a drop-in replacement for :class:`~torchformer.models.CTransformer`: the same ``forward(x, mask=None)`` and the
same output, ``(b, c)`` log-probabilities, so :func:`~torchformer.train.metrics.evaluate_classifier` and the IMDb
training loop use either unchanged. What differs is how positions meet. Attention lets every token read every other
in one step, in parallel, and needs position encodings to know the order. An LSTM reads the tokens one at a time,
left to right (and, bidirectional, right to left too), carrying a state of fixed size from each step to the next:
order is built in, there is no longest sequence, but the ``t`` steps of a layer run one after the other, and what a
token says must survive every step between it and the end to reach the classifier.

Shapes: b batch size, t sequence length, e embedding size, k hidden size (per direction), c classes, v vocabulary
size.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from torchformer._checks import (
    check_bool, check_choice, check_mask, check_positive_int, check_probability, check_tokens, fields_from_dict,
)

__all__ = ["LSTMConfig", "LSTMClassifier"]

POOLING = ("max", "mean", "last")


@dataclass(frozen=True)
class LSTMConfig:
    """The architecture of an :class:`LSTMClassifier`, as plain data (frozen).

    A checkpoint stores ``config.to_dict()`` next to the weights; ``LSTMClassifier.from_config(
    LSTMConfig.from_dict(data))`` rebuilds the model. Every field is checked when the config is made.

    Args:
        num_tokens: vocabulary size ``v``; id 0 is padding.
        num_classes: classes ``c``.
        emb: embedding size ``e``.
        hidden: hidden size ``k`` of the LSTM, per direction.
        layers: stacked LSTM layers.
        bidirectional: a second LSTM per layer reads the sequence right to left; the outputs of both are
            concatenated (``2k`` features per position).
        dropout: dropout on the embeddings, between LSTM layers and on the pooled vector.
        pool: ``"max"`` or ``"mean"`` over the outputs at the real positions, or ``"last"``: the final hidden
            state of each direction (the forward one after the last real token, the backward one after the first).
    """

    num_tokens: int
    num_classes: int
    emb: int = 128
    hidden: int = 128
    layers: int = 1
    bidirectional: bool = True
    dropout: float = 0.0
    pool: str = "max"

    def __post_init__(self) -> None:
        for name in ("num_tokens", "num_classes", "emb", "hidden", "layers"):
            check_positive_int(getattr(self, name), name)
        check_bool(self.bidirectional, "bidirectional")
        object.__setattr__(self, "dropout", check_probability(self.dropout, "dropout"))  # a plain float
        check_choice(self.pool, "pool", POOLING)

    @property
    def directions(self) -> int:
        """1, or 2 when bidirectional."""
        return 2 if self.bidirectional else 1

    @property
    def features(self) -> int:
        """The size of the pooled vector the output layer reads: ``k`` per direction."""
        return self.directions * self.hidden

    def to_dict(self) -> dict:
        """Plain data (str, int, float, bool): what a checkpoint stores.

        Returns:
            The fields as a new dict, ``{name: value}``, every field included; :meth:`from_dict` reads it back.
        """
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LSTMConfig:
        """The inverse of :meth:`to_dict`; unknown fields are an error naming them.

        Args:
            data: the fields, ``{name: value}``; a field left out keeps its default.

        Returns:
            The config, checked as any new one is.

        Raises:
            TypeError: ``data`` is not a mapping, a required field (``num_tokens``, ``num_classes``) is missing, or
                ``bidirectional`` is not a bool.
            ValueError: ``data`` names an unknown field, or another value is not valid; the message names the field.
        """
        return fields_from_dict(cls, data)


def _lengths_from_mask(mask: Tensor) -> Tensor:
    """The lengths ``(b,)`` of the rows of a right-padded ``mask`` ``(b, t)``: ``torch.long`` on the CPU, each >= 1.

    ``mask`` is True at real tokens, then only padding (as :func:`~torchformer.data.batching.pad_batch` makes it).
    ``pack_padded_sequence`` wants the lengths on the CPU, so on a GPU they cost one wait for the device; the check
    that every row is right-padded rides along in the same transfer, so it is made on every device.
    """
    lengths = mask.sum(1)  # (b, t) -> (b,)
    # Right-padded: row i is True exactly at its first lengths[i] positions.
    expected = torch.arange(mask.size(1), device=mask.device) < lengths[:, None]  # (b, t)
    right_padded = (mask == expected).all(1)  # (b,)
    lengths, right_padded = torch.stack([lengths, right_padded.long()]).cpu()  # one transfer for both
    if not bool(right_padded.all()):
        rows = (right_padded == 0).nonzero().flatten().tolist()
        raise ValueError(f"mask must mark the real tokens first and the padding after them (right padding, as "
                         f"pad_batch makes it), but rows {rows[:10]}{' ...' if len(rows) > 10 else ''} have padding "
                         f"before a real token")
    if not bool((lengths > 0).all()):
        rows = (lengths == 0).nonzero().flatten().tolist()
        raise ValueError(f"mask marks every position of rows {rows[:10]}{' ...' if len(rows) > 10 else ''} as padding: "
                         f"each sequence needs at least one real token (encode an empty text as one token, e.g. <unk>)")
    return lengths


class LSTMClassifier(nn.Module):
    """Sequence classifier: embedding -> (bidirectional) LSTM over packed sequences -> pooling -> linear.

    ``forward(x, mask=None)`` is :class:`~torchformer.models.CTransformer`'s (``mask``: True = real token, right
    padding; none: every position is real). The LSTM runs on *packed* sequences (``pack_padded_sequence``): each row
    for its real length only, so neither direction reads padding, and a review gives the same output alone or padded
    in a batch.

    ``model.config`` (an :class:`LSTMConfig`) holds every argument; :meth:`from_config` rebuilds the model from it.

    Args:
        num_tokens: vocabulary size ``v``; id 0 is padding (its embedding stays zero and is never trained).
        num_classes: classes ``c``.
        emb: embedding size ``e``.
        hidden: hidden size ``k`` per direction.
        layers: stacked LSTM layers.
        bidirectional: also read each sequence right to left (``2k`` features per position).
        dropout: dropout on the embeddings, between LSTM layers and on the pooled vector.
        pool: ``"max"``, ``"mean"`` or ``"last"`` (:class:`LSTMConfig` says what each pools).

    Shapes:
        ``x`` ``(b, t)`` ids, ``mask`` ``(b, t)`` -> ``(b, c)`` log-probabilities.
    """

    def __init__(self, num_tokens: int, num_classes: int, *, emb: int = 128, hidden: int = 128, layers: int = 1,
                 bidirectional: bool = True, dropout: float = 0.0, pool: str = "max") -> None:
        super().__init__()
        self.config = config = LSTMConfig(num_tokens, num_classes, emb=emb, hidden=hidden, layers=layers,
                                          bidirectional=bidirectional, dropout=dropout, pool=pool)
        self.embedding = nn.Embedding(config.num_tokens, config.emb, padding_idx=0)
        # nn.LSTM's own dropout acts between layers only (it warns when there is just one).
        self.lstm = nn.LSTM(config.emb, config.hidden, num_layers=config.layers, bidirectional=config.bidirectional,
                            batch_first=True, dropout=config.dropout if config.layers > 1 else 0.0)
        self.dropout = nn.Dropout(config.dropout)
        self.toprobs = nn.Linear(config.features, config.num_classes)

    @classmethod
    def from_config(cls, config: LSTMConfig) -> LSTMClassifier:
        """A freshly initialised model with the architecture ``config``.

        Args:
            config: the architecture, e.g. ``LSTMConfig.from_dict(saved)``.

        Returns:
            The model; ``model.config == config``.
        """
        if not isinstance(config, LSTMConfig):
            raise TypeError(f"config must be an LSTMConfig, got {type(config).__name__}")
        return cls(**config.to_dict())

    def forward(self, x: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        x = check_tokens(x, "x", self.config.num_tokens)
        b, t = x.shape
        if mask is None:
            mask = torch.ones(b, t, dtype=torch.bool, device=x.device)
        else:
            check_mask(mask, "mask", (b, t))
        lengths = _lengths_from_mask(mask)  # (b,) on the CPU

        h = self.dropout(self.embedding(x))  # (b, t) -> (b, t, e)
        # Packed: the rows' real tokens only, interleaved step by step, so no direction ever reads padding.
        # enforce_sorted=False sorts the rows by length inside and returns everything in the batch's order.
        packed = pack_padded_sequence(h, lengths, batch_first=True, enforce_sorted=False)
        outputs, (final, _) = self.lstm(packed)  # final: (layers * directions, b, k)

        if self.config.pool == "last":
            # The last layer's final states: forward after the last real token, backward after the first.
            pooled = final[-self.config.directions :].transpose(0, 1).reshape(b, -1)  # (b, directions * k)
        else:
            out, _ = pad_packed_sequence(outputs, batch_first=True, total_length=t)  # (b, t, directions * k)
            real = mask[:, :, None]  # (b, t, 1)
            if self.config.pool == "max":
                pooled = out.masked_fill(~real, float("-inf")).amax(dim=1)  # (b, t, 2k) -> (b, 2k)
            else:
                pooled = (out * real).sum(dim=1) / real.sum(dim=1)  # mean over the real positions only
        return F.log_softmax(self.toprobs(self.dropout(pooled)), dim=-1)  # (b, 2k) -> (b, c)
