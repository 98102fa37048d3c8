"""Counting the arithmetic of training, to know how well the hardware is used (MFU).

Training a transformer on one token costs about ``6 N`` floating-point operations, where ``N`` is the number of
parameters that take part in matrix multiplications: each such weight is used in one multiply-add (2 FLOPs) in the
forward pass and two in the backward pass (the gradient for the input and for the weight itself). Attention adds
work that has no parameters: per layer and per token, the query is multiplied with ``T`` keys and the weights with
``T`` values, ``2 * 2 * H * Q * T`` FLOPs forward and twice that backward, so ``12 * L * H * Q * T`` in all
(``L`` layers, ``H`` heads of size ``Q``, context ``T``). This is the estimate of the PaLM paper (appendix B) and
nanoGPT; it counts the full ``T`` keys although a causal query only needs half of them on average, as they do.

A mixture of experts (:class:`~torchformer.nn.moe.MoEFeedForward`) sends each token to ``k`` of its ``E``
experts, so ``N`` counts the *active* parameters, those one token is multiplied with: the weights of the ``E - k``
experts it skips do not count (:func:`active_matmul_parameters`).

A layer whose keys and values have widths of their own (latent attention: ``h (n + r)`` and ``h v``) counts
``6 T (w_qk + w_v)`` per token instead, as its ``score_value_widths()`` say.

Embedding *lookups* are not multiplications, so the token and position tables do not count in ``N``, unless the
token table is tied to the output layer, where it is a real ``(e, v)`` matrix product.

*Model FLOPs utilisation* (MFU, Chowdhery et al. 2022) divides the FLOPs the model needs per second,
``flops_per_token * tokens_per_second``, by the accelerator's peak. It deliberately ignores work the
implementation adds (recomputation, padding), so it compares implementations fairly. For reference, the dense
bfloat16 peak is about 989 TFLOP/s for an H100 SXM (and an H200) and 312 for an A100; :func:`peak_bf16_tflops`
reads it from a device's name.
"""

from __future__ import annotations

import math

from torch import nn

from torchformer._checks import check_int_at_least, is_real
from torchformer.nn.attention import MultiHeadAttention
from torchformer.nn.moe import MoEFeedForward

__all__ = ["active_matmul_parameters", "flops_per_token", "matmul_parameters", "mfu", "model_flops_per_token",
           "peak_bf16_tflops"]


def flops_per_token(*, params: int, layers: int, attention_width: int, context: int) -> int:
    """Training FLOPs per token: ``6 * params + 12 * layers * attention_width * context``.

    Forward and backward together, as the module docstring explains.

    Args:
        params: the parameters used in matrix products (see :func:`matmul_parameters`), ``>= 0``.
        layers: the number of attention layers, ``>= 0``.
        attention_width: ``heads * head_size`` of each layer: ``emb`` for narrow heads, ``heads * emb`` for wide
            ones.
        context: the sequence length trained on, in tokens.

    Returns:
        FLOPs per token trained on.

    Raises:
        ValueError: an argument is not an int, or below its minimum (0 for ``params`` and ``layers``, else 1).
    """
    check_int_at_least(params, "params", 0)
    check_int_at_least(layers, "layers", 0)
    check_int_at_least(attention_width, "attention_width", 1)
    check_int_at_least(context, "context", 1)
    return 6 * params + 12 * layers * attention_width * context


def matmul_parameters(model: nn.Module) -> int:
    """Parameters of ``model`` except embedding tables that are only looked up; shared parameters count once.

    An embedding table tied to a linear layer (the output head) is multiplied there, so it counts.

    Args:
        model: any module.

    Returns:
        The number of parameter elements that take part in matrix products: ``N`` of the ``6 N`` estimate.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    multiplied = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    lookups = {
        id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding) and id(m.weight) not in multiplied
    }
    return sum(p.numel() for p in model.parameters() if id(p) not in lookups)  # parameters() yields a shared one once


def active_matmul_parameters(model: nn.Module) -> int:
    """:func:`matmul_parameters` less the weights a token skips: the experts of each mixture it is not sent to.

    Args:
        model: any module.

    Returns:
        The parameter elements one token is multiplied with; :func:`matmul_parameters` for a dense model.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
    """
    total = matmul_parameters(model)
    return total - sum(m.idle_parameters() for m in model.modules() if isinstance(m, MoEFeedForward))


def model_flops_per_token(model: nn.Module, *, context: int) -> int:
    """:func:`flops_per_token` for a torchformer model (e.g. a ``GTransformer``) trained on ``context`` tokens.

    Every :class:`~torchformer.nn.attention.MultiHeadAttention` inside counts as one attention layer of width
    ``heads * head_size``. Works on the module behind ``torch.compile`` too (the parameters are the same).

    Args:
        model: a module holding torchformer attention layers.
        context: the sequence length trained on, in tokens.

    Returns:
        ``6 * active_matmul_parameters(model)`` plus ``6 * (w_qk + w_v) * context`` per attention layer, its
        widths from ``score_value_widths()`` (``12 * heads * head_size * context`` for plain heads).

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        ValueError: ``context`` is not a positive int.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (e.g. a GTransformer), got {type(model).__name__} "
                        f"{model!r:.60}")
    check_int_at_least(context, "context", 1)
    attention = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    return 6 * active_matmul_parameters(model) + sum(6 * sum(m.score_value_widths()) * context for m in attention)


def mfu(tokens_per_second: float, flops_per_token: int, *, peak_tflops: float) -> float:
    """Model FLOPs utilisation: the fraction of ``peak_tflops`` (TFLOP/s) that the training throughput needs.

    Args:
        tokens_per_second: the training throughput, tokens per second (over all devices, if ``peak_tflops`` is
            their sum).
        flops_per_token: the model's training FLOPs per token (:func:`model_flops_per_token`).
        peak_tflops: the accelerator's peak in TFLOP/s (:func:`peak_bf16_tflops`).

    Returns:
        The utilisation as a fraction (0.4 = 40 %; above 1 means the FLOP count or the peak is wrong).

    Raises:
        ValueError: an argument is not a finite real number (Python or NumPy), ``peak_tflops`` not positive, or
            another one negative.
    """
    for name, value in (("tokens_per_second", tokens_per_second), ("flops_per_token", flops_per_token)):
        if not is_real(value) or not 0 <= value < math.inf:
            raise ValueError(f"{name} must be a number >= 0 (and finite), got {value!r}")
    if not is_real(peak_tflops) or not 0 < peak_tflops < math.inf:
        raise ValueError(f"peak_tflops must be a positive number (TFLOP/s, finite), got {peak_tflops!r}")
    return float(tokens_per_second) * float(flops_per_token) / (float(peak_tflops) * 1e12)


# Dense (no sparsity) bfloat16 tensor-core peaks from NVIDIA's data sheets, in TFLOP/s, keyed by a part of the name
# that torch.cuda.get_device_name() reports. The first match wins, so the PCIe and NVL variants of a part, which
# run at lower clocks, come before its SXM form (e.g. "NVIDIA H100 80GB HBM3"). An H200 has an H100's tensor cores.
PEAK_BF16_TFLOPS = (
    ("H200 NVL", 835.0),
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.0),
    ("GH200", 989.0),
    ("H200", 989.0),
    ("H100", 989.0),
    ("A100", 312.0),
)


def peak_bf16_tflops(device_name: str) -> float | None:
    """The dense bfloat16 peak (TFLOP/s) of the accelerator called ``device_name``, or ``None`` if unknown.

    ``device_name`` is what ``torch.cuda.get_device_name()`` reports, e.g. ``"NVIDIA H100 80GB HBM3"`` (989) or
    ``"NVIDIA H200"`` (989); case and spacing are ignored. Pass an unknown device's peak to :func:`mfu` yourself.

    Args:
        device_name: the accelerator's name.

    Returns:
        The peak in TFLOP/s from :data:`PEAK_BF16_TFLOPS`, or ``None`` for a device not listed there.

    Raises:
        TypeError: ``device_name`` is not a str.
    """
    if not isinstance(device_name, str):
        raise TypeError(f"device_name must be a str (e.g. torch.cuda.get_device_name()), got "
                        f"{type(device_name).__name__} {device_name!r:.60}")
    squeezed = "".join(device_name.lower().split())
    for part, peak in PEAK_BF16_TFLOPS:
        if "".join(part.lower().split()) in squeezed:
            return peak
    return None
