"""Position encodings added to the token embeddings before the first block (``docs/positions.md``).

Shapes: b batch size, t sequence length, e embedding size.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from torchformer._checks import check_embeddings, check_positive_int


def sinusoidal_table(positions: Tensor, emb: int, *, dtype: torch.dtype | None = None) -> Tensor:
    """The sinusoidal position vectors of ``positions``, computed in float64, then converted.

    Args:
        positions: ``(t,)`` (or ``(b, t)``) integer, the absolute positions.
        emb: the embedding size ``e``.
        dtype: the dtype of the result; ``None``: torch's default dtype.

    Returns:
        ``(t, e)`` (or ``(b, t, e)``) on ``positions``' device: ``sin(p / 10000^(2i/e))`` in column ``2i``, ``cos``
        in ``2i + 1``.
    """
    p = positions.to(torch.float64)[..., None]  # (t, 1), or (b, t, 1) for each row's own positions
    pair = torch.arange(emb, device=positions.device) // 2  # dimensions 2i and 2i+1 share the frequency of pair i
    inv_freq = torch.exp(-math.log(10000.0) * (2 * pair).to(torch.float64) / emb)  # 1 / 10000^(2i/e), (e,)
    angles = p * inv_freq  # (t, e)
    table = torch.where(torch.arange(emb, device=positions.device) % 2 == 0, torch.sin(angles), torch.cos(angles))
    return table.to(dtype or torch.get_default_dtype())


def default_positions(x: Tensor) -> Tensor:
    """``0 .. t-1`` for ``x`` ``(b, t, ...)``, on ``x``'s device.

    Args:
        x: a batch of sequences ``(b, t, ...)``.

    Returns:
        ``(t,)`` long.
    """
    return torch.arange(x.size(1), device=x.device)


class SinusoidalPositions(nn.Module):
    """Adds the fixed sinusoidal encoding of Vaswani et al. (:func:`sinusoidal_table`); no parameters, any length.

    Args:
        emb: the embedding size ``e``.

    Shapes:
        ``forward(x, positions=None)``: ``(b, t, e)``, ``positions`` ``(t,)`` (default ``0 .. t-1``) -> ``(b, t, e)``.
    """

    def __init__(self, emb: int) -> None:
        super().__init__()
        self.emb = check_positive_int(emb, "emb")

    @classmethod
    def from_sizes(cls, emb: int, max_len: int) -> SinusoidalPositions:
        """The scheme of an embedding of size ``emb``: the constructor every embedding-side scheme has.

        Args:
            emb: the embedding size ``e``.
            max_len: the positions the model takes (unused: every position has a vector).
        """
        return cls(emb)

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        check_embeddings(x, "x", self.emb)
        positions = default_positions(x) if positions is None else positions
        return x + sinusoidal_table(positions, self.emb, dtype=x.dtype)  # (b, t, e) + (t, e)

    def extra_repr(self) -> str:
        return f"emb={self.emb}"


class LearnedPositions(nn.Module):
    """Adds a learned vector per position (``embedding.weight``, ``(max_len, e)``), for ``0 .. max_len - 1`` only.

    Args:
        emb: the embedding size ``e``.
        max_len: how many positions have a vector (a model's ``seq_length``).

    Raises:
        ValueError: ``x`` longer than ``max_len`` without ``positions`` (given positions the models check).

    Shapes:
        ``forward(x, positions=None)``: ``(b, t, e)``, ``positions`` ``(t,)`` (default ``0 .. t-1``) -> ``(b, t, e)``.
    """

    def __init__(self, emb: int, max_len: int) -> None:
        super().__init__()
        self.emb = check_positive_int(emb, "emb")
        self.max_len = check_positive_int(max_len, "max_len")
        self.embedding = nn.Embedding(max_len, emb)

    @classmethod
    def from_sizes(cls, emb: int, max_len: int) -> LearnedPositions:
        """As :meth:`SinusoidalPositions.from_sizes`: a table of ``max_len`` vectors of size ``emb``."""
        return cls(emb, max_len)

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        _, t, _ = check_embeddings(x, "x", self.emb)
        if positions is None:
            if t > self.max_len:
                raise ValueError(f"x has {t} positions, but LearnedPositions has vectors for max_len={self.max_len} "
                                 f"positions only (0 .. {self.max_len - 1}); crop x to {self.max_len} positions, or "
                                 f"build it with a larger max_len")
            positions = default_positions(x)
        return x + self.embedding(positions).to(x.dtype)  # (b, t, e) + (t, e)

    def extra_repr(self) -> str:
        return f"emb={self.emb}, max_len={self.max_len}"


class NoPositions(nn.Module):
    """Adds nothing, for ``"none"`` and the schemes that act inside attention (:mod:`torchformer.nn.relative`).

    Shapes:
        ``forward(x, positions=None)``: ``x`` ``(b, t, e)`` -> ``x`` itself; ``positions`` is ignored.
    """

    @classmethod
    def from_sizes(cls, emb: int, max_len: int) -> NoPositions:
        """As :meth:`SinusoidalPositions.from_sizes`; nothing to size (both arguments unused)."""
        return cls()

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        return x
