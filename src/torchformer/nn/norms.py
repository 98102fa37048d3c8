"""Normalisation layers: LayerNorm and RMSNorm, chosen by ``config.norm`` (``docs/modern-blocks.md``, "RMSNorm").

Shapes: b batch size, t sequence length, e embedding size.
"""

from __future__ import annotations

import contextlib
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from torchformer._checks import autocast_enabled, check_choice, check_positive_float, check_positive_int
from torchformer.config import NORMS


# torch.nn.functional.rms_norm (PyTorch 2.4 and later): one call where the formula is several.
HAS_RMS_NORM_KERNEL = hasattr(F, "rms_norm")


def rms_norm(x: Tensor, weight: Tensor, eps: float, *, exact_gain_gradient: bool = False) -> Tensor:
    """RMSNorm written out, for autograd to differentiate: the readable twin of :class:`RMSNormFunction`.

    Args:
        x: ``(..., e)``.
        weight: the gain ``g`` ``(e,)``.
        eps: added to ``mean(x^2)`` inside the square root.
        exact_gain_gradient: the gain's gradient from x-hat in float32, as :class:`RMSNormFunction`'s; same output.

    Returns:
        ``(..., e)``: ``x / sqrt(mean(x^2) + eps)`` in ``x``'s dtype, times ``weight``.
    """
    # The statistic in at least float32: a float16 square overflows above 256, and a sum of e small squares
    # loses digits. The result returns to x's dtype before the gain, as LayerNorm's does.
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    normalised = wide * torch.rsqrt(wide.pow(2).mean(dim=-1, keepdim=True) + eps)  # (..., e) / (..., 1)
    if not exact_gain_gradient or normalised.dtype == x.dtype:
        return normalised.to(x.dtype) * weight  # (..., e) * (e,)
    # The same value (the second term is an exact zero), but the gain's gradient is sum(grad * x-hat in float32).
    frozen = weight.detach()
    y = normalised.to(x.dtype) * frozen + normalised.detach() * (weight - frozen)
    return y.to(torch.promote_types(x.dtype, weight.dtype))


def _full_precision(device: torch.device) -> contextlib.AbstractContextManager:
    """A context manager turning autocast off on ``device`` while it is on there (it would take products to bf16)."""
    on = device.type in ("cpu", "cuda") and autocast_enabled(device.type)
    return torch.autocast(device.type, enabled=False) if on else contextlib.nullcontext()


class RMSNormFunction(torch.autograd.Function):
    r"""RMSNorm with its gradient written by hand: the same numbers as :func:`rms_norm`, in fewer passes.

    ``apply(x, weight, eps)`` returns ``(y, r)``, ``r = (mean(x^2) + eps)^(-1/2)`` ``(..., 1)``; the backward pass runs
    LayerNorm's fused kernel (``docs/modern-blocks.md``, "What they cost"); forward mode and ``torch.func`` work too.
    """

    generate_vmap_rule = True  # torch.func.vmap (and per-example gradients) batch the forward pass's operations

    @staticmethod
    def forward(x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        wide = x.to(torch.promote_types(x.dtype, torch.float32))  # as rms_norm: the statistic in float32 at least
        # mean(x^2) through the norm: one pass over x, no (..., e) tensor of squares
        mean_square = torch.linalg.vector_norm(wide, dim=-1, keepdim=True).square() / x.size(-1)  # (..., 1)
        r = torch.rsqrt(mean_square + eps)  # (..., 1)
        return (wide * r).to(x.dtype) * weight, r  # (..., e), and r for the backward pass (not differentiable)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: tuple) -> None:  # type: ignore[override]
        """Keep what the derivatives need: ``x``, ``weight``, ``r`` and ``eps``."""
        (x, weight, eps), (_, r) = inputs, output
        ctx.save_for_backward(x, weight, r)
        ctx.save_for_forward(x, weight, r)
        ctx.eps = eps
        ctx.mark_non_differentiable(r)

    @staticmethod
    def jvp(  # type: ignore[override]
        ctx: Any, x_dot: Optional[Tensor], weight_dot: Optional[Tensor], eps_dot: None
    ) -> tuple[Tensor, None]:
        """Forward-mode derivative: the output's tangent from the tangents of ``x`` and ``weight``."""
        x, weight, r = ctx.saved_tensors
        normalised = x.to(r.dtype) * r
        y_dot = torch.zeros_like(normalised * weight)
        if x_dot is not None:  # d x-hat = r (dx - x-hat mean(dx x-hat)): the transpose of the backward formula
            x_dot = x_dot.to(r.dtype)
            moved = r * (x_dot - normalised * (x_dot * normalised).mean(dim=-1, keepdim=True))
            y_dot = y_dot + moved.to(x.dtype) * weight
        if weight_dot is not None:
            y_dot = y_dot + normalised.to(x.dtype) * weight_dot
        return y_dot, None

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: Any, grad: Tensor, grad_r: Optional[Tensor]
    ) -> tuple[Optional[Tensor], Optional[Tensor], None]:
        """The gradients of ``x`` and ``weight`` from the output's, by the formulas above."""
        x, weight, r = ctx.saved_tensors
        if torch.is_grad_enabled():  # a second derivative (create_graph=True, torch.func.jacrev): the formulas above
            # in differentiable operations, r recomputed from x so that its dependence on x is part of the graph
            wide = x.to(r.dtype)
            r = torch.rsqrt(wide.pow(2).mean(dim=-1, keepdim=True) + ctx.eps)  # (..., 1)
            normalised = wide * r  # x-hat
            grad_normalised = (grad * weight).to(r.dtype)
            grad_x = r * (grad_normalised - normalised * (grad_normalised * normalised).mean(dim=-1, keepdim=True))
            # in float32 at least, as the first derivative's: a bf16 input must not round the gain's gradient
            grad_weight = (grad.to(r.dtype) * normalised).sum_to_size(weight.shape)
            return (grad_x.to(x.dtype) if ctx.needs_input_grad[0] else None,
                    grad_weight.to(weight.dtype) if ctx.needs_input_grad[1] else None, None)
        e, dtype = x.size(-1), r.dtype  # float32 at least, as the forward pass
        grad_wide, x_wide, weight_wide = grad.to(dtype), x.to(dtype), weight.to(dtype)  # no copies in float32
        with _full_precision(x.device):  # a backward pass run under autocast would take the products down to bf16
            # LayerNorm's gradient given a mean of 0 and r as its 1/std (its grad_weight is this one's), then the
            # term of its mean cancelled: grad_x += r mean(grad * g), (..., 1) * ((..., e) @ (e,)) / e. The op is the
            # kernel autograd runs for F.layer_norm's gradient; it takes the statistics as arguments.
            grad_x, grad_weight, _ = torch.ops.aten.native_layer_norm_backward(
                grad_wide, x_wide, [e], torch.zeros_like(r), r, weight_wide, None,
                [ctx.needs_input_grad[0], ctx.needs_input_grad[1], False])
            if grad_x is not None:
                grad_x = grad_x.add_(r * (grad_wide @ weight_wide).unsqueeze(-1) / e).to(x.dtype)
            if grad_weight is not None:
                grad_weight = grad_weight.to(weight.dtype)
        return grad_x, grad_weight, None


class RMSNorm(nn.Module):
    r"""Root-mean-square normalisation: ``y = x / sqrt(mean(x^2) + eps) * g``, over the last dimension.

    ``weight``: the gain ``g`` ``(e,)``, from 1; no bias. Which computation runs when: ``docs/modern-blocks.md``.

    Args:
        emb: the size ``e`` of the last dimension.
        eps: added to ``mean(x^2)`` (a zero vector gives zeros); ``1e-5``, as :class:`torch.nn.LayerNorm`'s default.

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
        if torch.compiler.is_compiling():  # the formula: torch.compile traces and fuses it (not a custom Function)
            return rms_norm(x, self.weight, self.eps, exact_gain_gradient=True)
        if not torch.is_grad_enabled():  # no gradient to write by hand (decoding): without apply's cost
            if HAS_RMS_NORM_KERNEL and x.dtype == self.weight.dtype and x.element_size() >= 4:
                # PyTorch's kernel, one pass; in half precision it rounds once where the formula (and the gradient
                # path) rounds twice, so halves keep the formula's numbers.
                return F.rms_norm(x, (self.emb,), self.weight, self.eps)
            return rms_norm(x, self.weight, self.eps)
        return RMSNormFunction.apply(x, self.weight, self.eps)[0]  # (y, r): the output

    def extra_repr(self) -> str:
        return f"{self.emb}, eps={self.eps}"


def make_norm(kind: str, emb: int, *, eps: float = 1e-5) -> nn.Module:
    """The normalisation layer ``config.norm`` names, ``(..., e) -> (..., e)`` over vectors of size ``emb``.

    Args:
        kind: ``"layer"`` for :class:`torch.nn.LayerNorm` (gain and bias), ``"rms"`` for :class:`RMSNorm` (gain only).
        emb: the size ``e`` of the vectors normalised (the last dimension).
        eps: added before the square root (``config.norm_eps``).

    Raises:
        ValueError: ``kind`` is neither.
    """
    check_choice(kind, "norm", NORMS)
    return nn.LayerNorm(emb, eps=eps) if kind == "layer" else RMSNorm(emb, eps=eps)
