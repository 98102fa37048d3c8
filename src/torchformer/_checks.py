"""Input checks shared by the modules.

Every public ``forward`` validates its inputs here, so that a wrong shape or dtype fails with a message that
names the argument, what was expected and what was received, instead of an opaque error deep inside a matmul.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _is_compiling() -> bool:
    # Data-dependent checks (token id ranges) would break a torch.compile graph; skip them while tracing.
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling())


def check_positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def check_probability(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be a float in [0, 1), got {value!r}")
    return float(value)


def check_choice(value: object, name: str, choices: tuple) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}; got {value!r}")
    return value  # type: ignore[return-value]


def _autocast_enabled(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4 has one function per device type
        return torch.is_autocast_cpu_enabled() if device_type == "cpu" else torch.is_autocast_enabled()


def check_embeddings(x: object, name: str, emb: int, *, like: Tensor | None = None) -> tuple[int, int, int]:
    """Check that ``x`` is a float tensor of shape ``(b, t, emb)`` and return ``(b, t, emb)``.

    With ``like`` (a parameter of the module), also check that ``x`` has the parameters' dtype, unless autocast is
    on (then the mismatch is intended and autocast resolves it).
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape (b, t, {emb}), got {type(x).__name__}")
    if x.dim() != 3:
        raise ValueError(f"{name} must have shape (b, t, {emb}) (3 dimensions), got shape {tuple(x.shape)}")
    if x.size(-1) != emb:
        raise ValueError(
            f"{name} must have embedding size {emb} in its last dimension, got shape {tuple(x.shape)}"
        )
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating point tensor, got dtype {x.dtype}")
    if like is not None and x.dtype != like.dtype and not _autocast_enabled(x.device.type):
        raise TypeError(
            f"{name} has dtype {x.dtype} but the module's parameters are {like.dtype}; convert one of them "
            f"(e.g. {name}.to({like.dtype}) or module.to({x.dtype})), or run under torch.autocast"
        )
    return x.size(0), x.size(1), x.size(2)


def check_mask(mask: object, name: str, shape: tuple[int, int], dims: str = "(b, t)") -> Tensor:
    """Check a padding mask: bool ``shape`` (named ``dims`` in messages) with ``True`` marking real tokens."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a bool torch.Tensor of shape {shape}, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"{name} must have dtype torch.bool (True = real token), got {mask.dtype}; use {name}.bool()"
        )
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {dims} = {tuple(shape)}, got {tuple(mask.shape)}")
    return mask


def check_tokens(x: object, name: str, num_tokens: int, max_len: int | None = None) -> tuple[int, int]:
    """Check a batch of token ids: integer ``(b, t)`` with every id in ``[0, num_tokens)``."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids, shape (b, t), got {type(x).__name__}")
    if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids (e.g. torch.long), got dtype {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"{name} must have shape (b, t) (2 dimensions), got shape {tuple(x.shape)}")
    if x.size(1) == 0:
        raise ValueError(f"{name} must contain at least one token per sequence, got shape {tuple(x.shape)}")
    if max_len is not None and x.size(1) > max_len:
        raise ValueError(
            f"{name} has length {x.size(1)}, longer than the learned position table (max_len={max_len}); "
            f"crop the input or build the model with a larger seq_length"
        )
    if x.numel() and not _is_compiling():
        # One transfer for both bounds: on a GPU each read from the device makes the host wait for it.
        lo, hi = torch.stack([x.min(), x.max()]).tolist()
        if lo < 0 or hi >= num_tokens:
            raise ValueError(
                f"{name} must hold token ids in [0, {num_tokens}), got values in [{lo}, {hi}]"
            )
    return x.size(0), x.size(1)
