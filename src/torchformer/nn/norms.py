"""Normalisation layers: LayerNorm and RMSNorm, chosen by ``config.norm``.

A block normalises the vector of each position on its own, across its ``e`` components, so that the activations
keep a stable scale from block to block (see ``docs/blocks.md`` and ``docs/modern-blocks.md``).

* **LayerNorm** (Ba et al. 2016; :class:`torch.nn.LayerNorm`): subtract the mean, divide by the standard
  deviation, then apply a learned gain and bias: ``y = (x - mean(x)) / sqrt(var(x) + eps) * g + b``.
* **RMSNorm** (Zhang & Sennrich 2019; :class:`RMSNorm`): only divide by the root mean square, then apply a learned
  gain: ``y = x / sqrt(mean(x^2) + eps) * g``. No centering and no bias. Zhang & Sennrich found that the
  re-scaling, not the re-centering, is what makes LayerNorm work; dropping the mean saves one reduction over ``e``
  per normalisation and trains as well. LLaMA, T5 and most recent models use it.

Shapes: b batch size, t sequence length, e embedding size.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from torchformer._checks import check_choice, check_positive_float, check_positive_int
from torchformer.config import NORMS


class RMSNorm(nn.Module):
    r"""Root-mean-square normalisation: ``y = x / sqrt(mean(x^2) + eps) * g``, over the last dimension.

    For each vector $x$ of ``e`` components (the last dimension):

    $$
    \operatorname{RMSNorm}(x) = \frac{x}{\sqrt{\frac{1}{e} \sum_{k=1}^{e} x_k^2 + \epsilon}} \odot g
    $$

    with $\epsilon$ = ``eps``, inside the square root, and $g$ = ``weight``.

    ``(..., e) -> (..., e)``; typically ``(b, t, e)``. ``g`` (``weight``, shape ``(e,)``) is a learned gain that
    starts at 1, so a fresh layer returns vectors of root mean square 1. There is no bias and no centering: the
    mean of ``x`` passes through, scaled.

    Args:
        emb: the size ``e`` of the last dimension.
        eps: added to ``mean(x^2)`` so a zero vector gives zeros instead of 0/0. ``1e-5``, as
            :class:`torch.nn.LayerNorm`'s default, so that switching ``norm`` changes one thing only.

    Shapes:
        ``forward(x)``: ``(..., e)`` -> ``(..., e)``, typically ``(b, t, e)``.
    """

    def __init__(self, emb: int, *, eps: float = 1e-5) -> None:
        super().__init__()
        self.emb = check_positive_int(emb, "emb")
        self.eps = check_positive_float(eps, "eps")
        # Named `weight`, as LayerNorm's gain is, so code that treats norm gains specially (weight decay) finds it.
        self.weight = nn.Parameter(torch.ones(emb))

    def forward(self, x: Tensor) -> Tensor:
        # The statistic in at least float32: a float16 square overflows above 256, and a sum of e small squares
        # loses digits. The result returns to x's dtype before the gain, as LayerNorm's does.
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        normalised = wide * torch.rsqrt(wide.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # (..., e) / (..., 1)
        return normalised.to(x.dtype) * self.weight  # (..., e) * (e,)

    def extra_repr(self) -> str:
        return f"{self.emb}, eps={self.eps}"


def make_norm(kind: str, emb: int, *, eps: float = 1e-5) -> nn.Module:
    """The normalisation ``config.norm`` names, over vectors of size ``emb``.

    Args:
        kind: ``"layer"`` for :class:`torch.nn.LayerNorm` (gain and bias), ``"rms"`` for :class:`RMSNorm` (gain
            only).
        emb: the size ``e`` of the vectors normalised (the last dimension).
        eps: added before the square root (``config.norm_eps``).

    Returns:
        The normalisation layer, ``(..., e) -> (..., e)``.

    Raises:
        ValueError: ``kind`` is neither.
    """
    check_choice(kind, "norm", NORMS)
    return nn.LayerNorm(emb, eps=eps) if kind == "layer" else RMSNorm(emb, eps=eps)
