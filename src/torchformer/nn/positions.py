"""Position encodings.

Self-attention is *permutation equivariant*: shuffle the input vectors and the output vectors are shuffled the
same way, nothing else changes. A model that should care about word order must therefore be told where each token
is. We do that by adding a position vector to each token embedding before the first block.

* :class:`SinusoidalPositions` (Vaswani et al. 2017) uses fixed waves of geometrically increasing wavelength:
  ``PE[p, 2i] = sin(p / 10000^(2i/e))`` and ``PE[p, 2i+1] = cos(p / 10000^(2i/e))``. No parameters, any length.
* :class:`LearnedPositions` learns one vector per position, as ``former`` and GPT-2 do. Simple and effective, but
  it knows only the ``max_len`` positions it was built with.

Both take ``x`` ``(b, t, e)`` and return ``x`` plus the position vectors of positions ``offset .. offset + t - 1``
(``offset`` > 0 when generating with a cache, where ``x`` holds only the newest positions). ``offset`` may also be
a 0-dim integer tensor: a compiled decoding step (:class:`~torchformer.decoding.compiled.StaticCacheGenerator`)
reads the position from device memory, so that one compiled graph serves every position.

Shapes: b batch size, t sequence length, e embedding size.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from torchformer._checks import check_embeddings, check_positive_int


def sinusoidal_table(
    length: int, emb: int, *, offset: int | Tensor = 0, device=None, dtype=None
) -> Tensor:
    """The sinusoidal position vectors of positions ``offset .. offset + length - 1``, shape ``(length, emb)``."""
    if isinstance(offset, Tensor):  # a position held on the device (compiled decoding): add it there
        positions = torch.arange(length, device=device, dtype=torch.float64) + offset
    else:
        positions = torch.arange(offset, offset + length, device=device, dtype=torch.float64)
    positions = positions[:, None]  # (t, 1)
    pair = torch.arange(emb, device=device) // 2  # dimensions 2i and 2i+1 share the frequency of pair i
    inv_freq = torch.exp(-math.log(10000.0) * (2 * pair).to(torch.float64) / emb)  # 1 / 10000^(2i/e), (e,)
    angles = positions * inv_freq  # (t, e)
    # float64 for the angles: p * inv_freq loses digits in float32 once p is in the thousands.
    table = torch.where(torch.arange(emb, device=device) % 2 == 0, torch.sin(angles), torch.cos(angles))
    return table.to(dtype or torch.get_default_dtype())


class SinusoidalPositions(nn.Module):
    """Adds the fixed sinusoidal position encoding of Vaswani et al.; no parameters, works for any length."""

    def __init__(self, emb: int) -> None:
        super().__init__()
        self.emb = check_positive_int(emb, "emb")

    def forward(self, x: Tensor, offset: int | Tensor = 0) -> Tensor:
        _, t, _ = check_embeddings(x, "x", self.emb)
        return x + sinusoidal_table(t, self.emb, offset=offset, device=x.device, dtype=x.dtype)  # (b,t,e)+(t,e)

    def extra_repr(self) -> str:
        return f"emb={self.emb}"


class LearnedPositions(nn.Module):
    """Adds a learned vector per position; raises ``ValueError`` for positions at or beyond ``max_len``."""

    def __init__(self, emb: int, max_len: int) -> None:
        super().__init__()
        self.emb = check_positive_int(emb, "emb")
        self.max_len = check_positive_int(max_len, "max_len")
        self.embedding = nn.Embedding(max_len, emb)

    def forward(self, x: Tensor, offset: int | Tensor = 0) -> Tensor:
        _, t, _ = check_embeddings(x, "x", self.emb)
        # A tensor offset is not checked: reading it would wait for the device (its caller checks on the host).
        if not isinstance(offset, Tensor) and offset + t > self.max_len:
            raise ValueError(
                f"x reaches position {offset + t - 1} (offset {offset}, length t={t}), but the learned position "
                f"table has max_len={self.max_len} positions; crop the input or use a larger max_len"
            )
        if isinstance(offset, Tensor):  # a position held on the device (compiled decoding): add it there
            positions = torch.arange(t, device=x.device) + offset  # (t,)
        else:
            positions = torch.arange(offset, offset + t, device=x.device)  # (t,)
        return x + self.embedding(positions).to(x.dtype)  # (b, t, e) + (t, e)

    def extra_repr(self) -> str:
        return f"emb={self.emb}, max_len={self.max_len}"


def make_positions(kind: str, emb: int, max_len: int) -> nn.Module:
    """``"learned"``, ``"sinusoidal"`` or ``"none"`` (no position information: a bag of tokens)."""
    if kind == "learned":
        return LearnedPositions(emb, max_len)
    if kind == "sinusoidal":
        return SinusoidalPositions(emb)
    if kind == "none":
        return NoPositions()
    raise ValueError(f"positions must be one of 'learned', 'sinusoidal', 'none'; got {kind!r}")


class NoPositions(nn.Module):
    """Adds nothing: the model sees its input as a set. Useful to demonstrate permutation equivariance."""

    def forward(self, x: Tensor, offset: int | Tensor = 0) -> Tensor:
        return x
