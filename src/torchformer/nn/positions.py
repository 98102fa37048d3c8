"""Position encodings.

Self-attention is *permutation equivariant*: shuffle the input vectors and the output vectors are shuffled the
same way, nothing else changes. A model that should care about word order must therefore be told where each token
is. We do that by adding a position vector to each token embedding before the first block.

* :class:`SinusoidalPositions` (Vaswani et al. 2017) uses fixed waves of geometrically increasing wavelength:
  ``PE[p, 2i] = sin(p / 10000^(2i/e))`` and ``PE[p, 2i+1] = cos(p / 10000^(2i/e))``. No parameters, any length.
* :class:`LearnedPositions` learns one vector per position, as ``former`` and GPT-2 do. Simple and effective, but
  it knows only the ``max_len`` positions it was built with.

Both take ``x`` ``(b, t, e)`` and the absolute positions of its tokens, ``positions`` ``(t,)`` (default
``0 .. t-1``; the new positions when decoding with a KV cache), and return ``x`` plus their position vectors.
Positions are a tensor, so a compiled decoding step reads them from device memory and one compiled graph serves
every position.

Shapes: b batch size, t sequence length, e embedding size.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from torchformer._checks import check_embeddings, check_positive_int


def sinusoidal_table(positions: Tensor, emb: int, *, dtype: torch.dtype | None = None) -> Tensor:
    """The sinusoidal position vectors of ``positions`` ``(t,)`` (or ``(b, t)``), shape ``(t, emb)`` (``(b, t, emb)``).

    The angles are computed in float64, so positions in the thousands keep their digits, then converted.

    Args:
        positions: ``(t,)`` integer, the absolute positions.
        emb: the embedding size ``e``.
        dtype: the dtype of the result; ``None``: torch's default dtype (float32 unless changed).

    Returns:
        ``(t, e)``: row ``p`` holds ``sin(p / 10000^(2i/e))`` in column ``2i`` and ``cos(p / 10000^(2i/e))`` in
        column ``2i + 1``, on the device of ``positions``.
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
        ``(t,)`` long: the positions of a whole sequence, starting at 0.
    """
    return torch.arange(x.size(1), device=x.device)


class SinusoidalPositions(nn.Module):
    r"""Adds the fixed sinusoidal position encoding of Vaswani et al.; no parameters, works for any length.

    Dimensions ``2i`` and ``2i + 1`` of position ``p`` get ``sin(p / 10000^(2i/e))`` and ``cos(p / 10000^(2i/e))``
    (:func:`sinusoidal_table`):

    $$
    \mathrm{PE}_{p,\,2i} = \sin\left(\frac{p}{10000^{2i/e}}\right),
    \qquad
    \mathrm{PE}_{p,\,2i+1} = \cos\left(\frac{p}{10000^{2i/e}}\right)
    $$

    and the vector $x_p$ of position $p$ becomes $x_p + \mathrm{PE}_p$.

    Args:
        emb: the embedding size ``e``.

    Shapes:
        ``forward(x, positions=None)``: ``x`` ``(b, t, e)``, ``positions`` ``(t,)`` (default ``0 .. t-1``) ->
        ``(b, t, e)``, ``x`` plus the encoding of each position.
    """

    def __init__(self, emb: int) -> None:
        super().__init__()
        self.emb = check_positive_int(emb, "emb")

    @classmethod
    def from_sizes(cls, emb: int, max_len: int) -> SinusoidalPositions:
        """The scheme of an embedding of size ``emb`` (``max_len`` is not needed: every position has a vector).

        Every scheme of the embedding side has this constructor, so an embedding builds whichever its
        ``position_classes`` names for the config's ``positions``.

        Args:
            emb: the embedding size ``e``.
            max_len: the positions the model takes (its ``seq_length``).

        Returns:
            A module of the class this is called on.
        """
        return cls(emb)

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        check_embeddings(x, "x", self.emb)
        positions = default_positions(x) if positions is None else positions
        return x + sinusoidal_table(positions, self.emb, dtype=x.dtype)  # (b, t, e) + (t, e)

    def extra_repr(self) -> str:
        return f"emb={self.emb}"


class LearnedPositions(nn.Module):
    """Adds a learned vector per position; knows the positions ``0 .. max_len - 1`` only.

    The vector $x_p$ of position $p$ becomes $x_p + P_p$, where $P$ ``(max_len, e)`` is ``embedding.weight``, one
    learned row per position.

    Given ``positions`` are not read here (on a GPU that would wait for the device): the models check them at their
    boundary and raise a ``ValueError`` for positions at or beyond ``max_len``. Without them, ``x`` longer than
    ``max_len`` is a ``ValueError`` here (its length is a Python int: no wait).

    Args:
        emb: the embedding size ``e``.
        max_len: how many positions have a vector (a model's ``seq_length``).

    Shapes:
        ``forward(x, positions=None)``: ``x`` ``(b, t, e)``, ``positions`` ``(t,)`` (default ``0 .. t-1``) ->
        ``(b, t, e)``, ``x`` plus the vector of each position.
    """

    def __init__(self, emb: int, max_len: int) -> None:
        super().__init__()
        self.emb = check_positive_int(emb, "emb")
        self.max_len = check_positive_int(max_len, "max_len")
        self.embedding = nn.Embedding(max_len, emb)

    @classmethod
    def from_sizes(cls, emb: int, max_len: int) -> LearnedPositions:
        """A table of ``max_len`` learned vectors of size ``emb`` (see :meth:`SinusoidalPositions.from_sizes`).

        Args:
            emb: the embedding size ``e``.
            max_len: how many positions have a vector (the model's ``seq_length``).

        Returns:
            A module of the class this is called on.
        """
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
    """Adds nothing: the model sees its input as a set. Useful to demonstrate permutation equivariance.

    The embeddings use it for ``"none"`` and for the schemes that act inside attention
    (:mod:`torchformer.nn.relative`), which add nothing to the embeddings.

    Shapes:
        ``forward(x, positions=None)``: ``x`` ``(b, t, e)`` -> ``x`` itself; ``positions`` is ignored.
    """

    @classmethod
    def from_sizes(cls, emb: int, max_len: int) -> NoPositions:
        """Nothing to size (see :meth:`SinusoidalPositions.from_sizes`).

        Args:
            emb: the embedding size ``e`` (unused).
            max_len: the positions the model takes (unused).

        Returns:
            A module of the class this is called on.
        """
        return cls()

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        return x
