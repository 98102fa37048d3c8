"""Input checks, shared by the public entry points.

The models' ``forward``, ``generate``, the loaders and every public module's ``forward`` (attention, blocks,
stacks) validate their inputs here, so that a wrong shape or dtype fails with a message that names the argument,
what was expected and what was received, instead of an opaque error deep inside a matmul.

Shapes and dtypes are metadata, free to read: every public module checks them at its door, without waiting for an
accelerator. *Values* (token ids in range, positions in range and consecutive) are checked the same way on every
device: reading them makes the host wait for a GPU once per check, which a model may turn off
(``model.check_values = False``, :class:`~torchformer.models.TransformerModel`). While ``torch.compile`` traces, values
are not read (a compiled graph cannot raise a Python error); nor on the ``meta`` device (it holds none); nor inside
:func:`values_checked`, where the caller has checked them (the decoding loops: the prompt once, not each token).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import numbers
from typing import Any, Iterator, Mapping, Optional

import torch
from torch import Tensor


# Python's bool is an int (True == 1): a count, a size or a rate given as True is a mistake, never a number. These
# are the one place that says so; every check of a number starts from one of them.
def is_int(value: object) -> bool:
    """A Python ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_integral(value: object) -> bool:
    """An integer of any kind (``int``, a NumPy integer) that is not a ``bool``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    """An ``int`` or ``float`` (a NumPy float is one) that is not a ``bool``."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_real(value: object) -> bool:
    """A real number of any kind (``int``, ``float``, NumPy's, ``Fraction``) that is not a ``bool``."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_compiling() -> bool:
    # Data-dependent checks (token id ranges) would break a torch.compile graph; skip them while tracing.
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and hasattr(compiler, "is_compiling") and compiler.is_compiling())


def check_positive_int(value: object, name: str) -> int:
    if not is_int(value) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def check_int_at_least(value: object, name: str, minimum: int) -> int:
    if not is_int(value) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def check_heads(emb: int, heads: int, kv_heads: int | None, wide: bool) -> None:
    """The head layout's one check, for a config and for an attention layer built by hand: ``kv_heads`` divides
    ``heads``, and narrow heads split ``emb`` evenly."""
    if kv_heads is not None and heads % kv_heads != 0:
        raise ValueError(f"kv_heads ({kv_heads}) must divide heads ({heads}): each group of heads // kv_heads query "
                         f"heads shares one key/value head")
    if not wide and emb % heads != 0:
        raise ValueError(f"emb ({emb}) must be divisible by heads ({heads}) for narrow heads (each head gets "
                         f"emb // heads dimensions); choose another heads or use wide=True")


def check_bool(value: object, name: str) -> bool:
    # A flag given as a string ("False", "no") is truthy: only a real bool says what it means.
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value


def check_probability(value: object, name: str) -> float:
    if not is_number(value) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be a float in [0, 1), got {value!r}")
    return float(value)


def check_positive_float(value: object, name: str) -> float:
    """``value`` as a plain float if it is a finite number above zero (a bool is refused)."""
    if not is_number(value) or not 0.0 < value < float("inf"):
        raise ValueError(f"{name} must be a positive float, got {value!r}")
    return float(value)


def fields_from_dict(cls: Any, data: object) -> Any:
    """The frozen config dataclass ``cls`` built from ``data``, ``{name: value}``: a config's ``from_dict``."""
    if not isinstance(data, Mapping):
        raise TypeError(f"config must be a dict of fields, got {type(data).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown config field(s) {', '.join(unknown)}; known fields are {', '.join(sorted(known))}")
    return cls(**data)


def check_choice(value: object, name: str, choices: tuple) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}; got {value!r}")
    return value  # type: ignore[return-value]


def autocast_enabled(device_type: str) -> bool:
    """Whether autocast is on for ``device_type`` (``"cpu"``, ``"cuda"``), on every torch version we support."""
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4 has one function per device type
        return torch.is_autocast_cpu_enabled() if device_type == "cpu" else torch.is_autocast_enabled()


def autocast_dtype(device_type: str) -> Optional[torch.dtype]:
    """The dtype autocast runs matrix products in on ``device_type``, or ``None`` where it is off."""
    if not autocast_enabled(device_type):
        return None
    try:
        return torch.get_autocast_dtype(device_type)
    except AttributeError:  # torch < 2.4
        return torch.get_autocast_cpu_dtype() if device_type == "cpu" else torch.get_autocast_gpu_dtype()


def check_embeddings(x: object, name: str, emb: int, *, like: Tensor | None = None, batch: int | None = None,
                     dims: str = "(b, t)") -> tuple[int, int, int]:
    """Check that ``x`` is a float tensor of shape ``(b, t, emb)`` and return ``(b, t, emb)``.

    The door check of every module that takes vectors: shapes and dtypes only, as Python integers, so it costs no
    device sync (and a compiled graph runs it once, at trace time). With ``batch``, ``b`` must be it (a context has
    the batch of the queries; ``dims`` then names its letters, e.g. ``"(b, u)"``). With ``like`` (a parameter of
    the module), also check that ``x`` has the parameters' dtype, unless autocast is on (then the mismatch is
    intended and autocast resolves it).
    """
    # Runs on every call of every module (a decoding step calls it a dozen times): one look at the shape, and the
    # messages are only formatted when they are raised.
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape {_shape(dims, emb)}, got {type(x).__name__}")
    size = x.shape
    if len(size) != 3:
        raise ValueError(f"{name} must have shape {_shape(dims, emb)} (3 dimensions), got shape {tuple(size)}")
    if size[2] != emb:
        raise ValueError(f"{name} must have embedding size {emb} in its last dimension, got shape {tuple(size)}")
    if batch is not None and size[0] != batch:
        raise ValueError(f"{name} must have shape {_shape(dims, emb)} with b = {batch} (the batch of x), got shape "
                         f"{tuple(size)}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating point tensor, got dtype {x.dtype}")
    # Only against a floating point parameter: a quantised (int8) weight says nothing about the inputs' dtype.
    if like is not None and x.dtype != like.dtype and like.is_floating_point() and not autocast_enabled(x.device.type):
        raise TypeError(f"{name} has dtype {x.dtype} but the module's parameters are {like.dtype}; convert one of them "
                        f"(e.g. {name}.to({like.dtype}) or module.to({x.dtype})), or run under torch.autocast")
    return size[0], size[1], size[2]


def _shape(dims: str, emb: int) -> str:
    """ "(b, t)", 16 -> "(b, t, 16)": the shape a message asks for."""
    return f"{dims[:-1]}, {emb})"


def check_mask(mask: object, name: str, shape: tuple[int, int], dims: str = "(b, t)", true_means: str = "real token", *,
               device: torch.device | None = None) -> Tensor:
    """Check a bool mask of ``shape`` (named ``dims`` in messages) on ``device`` (the inputs', if given); ``True``
    marks ``true_means`` (a padding mask's real tokens, by default)."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a bool torch.Tensor of shape {shape}, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(f"{name} must have dtype torch.bool (True = {true_means}), got {mask.dtype}; use {name}.bool()")
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {dims} = {tuple(shape)}, got {tuple(mask.shape)}")
    if device is not None and mask.device != device:
        raise ValueError(f"{name} must be on the inputs' device, {device}, got {mask.device}")
    return mask


# True inside values_checked(): the caller has checked the values the models are about to get (see below).
_VALUES_CHECKED = contextvars.ContextVar("torchformer_values_checked", default=False)


@contextlib.contextmanager
def values_checked() -> Iterator[None]:
    """Inside, models read no input values to check them: the caller has.

    The decoding loops check a prompt once and then feed the model its own samples at positions they count: a
    check per token would make the host wait for a GPU at every token. Scoped like ``torch.no_grad()`` (to this
    thread or task, undone on leaving), so that any model the loop calls, a user's too, needs no argument for it.
    """
    token = _VALUES_CHECKED.set(True)
    try:
        yield
    finally:
        _VALUES_CHECKED.reset(token)


def values_checkable(x: Tensor) -> bool:
    """Whether to read ``x``'s values to check them: it has some, not on the ``meta`` device, ``torch.compile`` is
    not tracing, and no caller has checked them already (:func:`values_checked`)."""
    return x.numel() > 0 and x.device.type != "meta" and not _is_compiling() and not _VALUES_CHECKED.get()


def check_tokens(x: object, name: str, num_tokens: int, *, values: bool = True) -> Tensor:
    """Check a batch of token ids: integer ``(b, t)`` with ``b, t >= 1`` and, with ``values``, every id in
    ``[0, num_tokens)`` (one read of the device).

    Returns ``x`` as ``torch.long`` (ids of any integer dtype are accepted: ``uint8`` bytes, ``int16``, ...).
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of token ids, shape (b, t), got {type(x).__name__}")
    if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer token ids (e.g. torch.long), got dtype {x.dtype}")
    if x.dim() != 2:
        raise ValueError(f"{name} must have shape (b, t) (2 dimensions), got shape {tuple(x.shape)}")
    if x.size(0) == 0 or x.size(1) == 0:
        raise ValueError(f"{name} must contain at least one sequence of at least one token, got shape {tuple(x.shape)}")
    x = x if x.dtype == torch.long else x.long()  # embeddings index with long ids (uint16..64 lack min/max, too)
    if values and values_checkable(x):
        lo, hi = torch.stack([x.min(), x.max()]).tolist()  # one read, not two: on a GPU each read waits
        if lo < 0 or hi >= num_tokens:
            raise ValueError(f"{name} must hold token ids in [0, {num_tokens}), got values in [{lo}, {hi}]")
    return x


def check_features(x: object, name: str, dim: int, *, like: Tensor | None = None) -> Tensor:
    """Check a batch of feature vectors: floating point ``(b, t, dim)`` with ``b, t >= 1``; returns ``x``.

    The input of a model built with ``input_dim=dim``. With ``like`` (a parameter of the model), also check that
    ``x`` has the parameters' dtype, unless autocast is on (as :func:`check_embeddings` does).
    """
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of feature vectors, shape (b, t, {dim}), got "
                        f"{type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating point tensor of feature vectors, shape (b, t, {dim}), got dtype "
                        f"{x.dtype} (the model was built with input_dim={dim}: it takes vectors, not token ids)")
    if x.dim() != 3 or x.size(-1) != dim:
        raise ValueError(f"{name} must have shape (b, t, {dim}): {dim} features (input_dim) per position, got shape "
                         f"{tuple(x.shape)}")
    if x.size(0) == 0 or x.size(1) == 0:
        raise ValueError(f"{name} must contain at least one sequence of at least one vector, got shape "
                         f"{tuple(x.shape)}")
    if like is not None and x.dtype != like.dtype and not autocast_enabled(x.device.type):
        raise TypeError(f"{name} has dtype {x.dtype} but the model's parameters are {like.dtype}; convert one of them "
                        f"(e.g. {name}.to({like.dtype}) or model.to({x.dtype})), or run under torch.autocast")
    return x


def check_positions(positions: object, t: int, device: torch.device, *, limit: int | None, capacity: int | None = None,
                    cached: bool | None = None, values: bool = True) -> Tensor:
    """Check the absolute positions ``(t,)`` of ``t`` consecutive tokens and return them as ``torch.long``; ``None``
    gives ``0 .. t-1`` (not allowed with caches: there the caller must say where the new tokens go).

    ``limit``: the number of positions the model can encode (learned positions), or None. ``capacity``: the first
    position the KV caches in use cannot hold, or None (no caches, or ring caches). ``cached``: whether caches are
    in use (default: whether ``capacity`` is given). ``values``: read given positions to check them (one read of
    the device).
    """
    if positions is None:
        if capacity is not None or cached:
            raise ValueError("positions must be given with caches: the absolute positions of the new tokens, shape "
                             "(t,), e.g. torch.arange(cached, cached + t)")
        _check_bounds(0, t - 1, limit, capacity)  # known on the host: checked on every device
        return torch.arange(t, device=device)
    positions = check_position_shape(positions, t, device)
    if values and values_checkable(positions):
        _check_values_of_positions(positions, limit, capacity)
    return positions


def _check_values_of_positions(positions: Tensor, limit: int | None, capacity: int | None) -> int:
    """Positions ``(t,)`` consecutive, ``>= 0``, below ``limit`` and ``capacity``: one read of the device.

    Returns the last (largest) position."""
    gaps = (positions[1:] - positions[:-1] != 1).sum()  # 0 when consecutive
    lo, hi, gaps = torch.stack([positions.min(), positions.max(), gaps]).tolist()  # one read of the device
    _check_bounds(lo, hi, limit, capacity)
    if gaps:
        raise ValueError(f"positions must be consecutive, each one more than the one before (the tokens of x "
                         f"follow each other), got {positions.tolist()[:8]}{' ...' if positions.numel() > 8 else ''}")
    return hi


def check_cached_positions(positions: object, t: int, device: torch.device, *, limit: int | None,
                           capacity: int | None, horizon: object,
                           values: bool = True) -> tuple[Tensor, int | None, tuple[int, int] | None]:
    """:func:`check_positions` with caches, the horizon of the call (the slots its queries read) and its span.

    ``horizon`` given: an int in ``[1, capacity]`` that every position must be below (checked when the positions are
    read). ``None``: one past the last position when they are read (the host then knows it for free), else ``None``
    (every slot). Ring caches (``capacity`` ``None``) take no horizon.

    Under :func:`values_checked` (the caller vouches for the values) a CPU tensor's last position is still read:
    there is no device to wait for, and the caches then know which slots the call fills.

    Returns:
        ``(positions, horizon, span)``: the positions as ``torch.long``, the horizon to give the caches, and
        ``(first, end)``, the positions ``first .. end-1`` the call writes, when the host knows them (else ``None``).
    """
    if horizon is not None:
        if capacity is None:
            raise ValueError(f"horizon must be None with ring caches (a segment memory reads all its slots), got "
                             f"{horizon!r}")
        if not is_int(horizon) or not 1 <= horizon <= capacity:
            raise ValueError(f"horizon must be an int in [1, {capacity}] (the caches' capacity): the slots this call "
                             f"reads, one past its last position; got {horizon!r}")
    if positions is None:
        check_positions(None, t, device, limit=limit, capacity=capacity, cached=True)  # raises: caches need them
    positions = check_position_shape(positions, t, device)
    if values and values_checkable(positions):
        hi = _check_values_of_positions(positions, limit, capacity)
        if horizon is not None and hi >= horizon:
            raise ValueError(f"the input reaches position {hi}, but horizon={horizon} reads slots 0 .. {horizon - 1} "
                             f"only: a query would not see its own key; give horizon > {hi} (or None)")
    elif values and positions.device.type == "cpu" and not _is_compiling():  # vouched for: read the last, for free
        hi = int(positions[-1])
    else:  # no reads asked for, a device to wait for, or a graph being traced: the host knows nothing more
        return positions, horizon, None  # type: ignore[return-value]
    horizon = hi + 1 if horizon is None and capacity is not None else horizon
    return positions, horizon, (hi + 1 - t, hi + 1)  # type: ignore[return-value]


def require_method(obj: object, method: str, needed_for: str) -> Any:
    """``obj``'s method ``method``, or a ``TypeError`` saying what needs it and what ``obj`` is.

    The door check of a function that takes any model but needs one ability of it (``new_memory``, say): only the
    lookup is guarded, so an ``AttributeError`` raised inside the method still surfaces as itself.

    Args:
        obj: the object (a model).
        method: the method's name.
        needed_for: what needs it, for the message (``"memory=64 (Transformer-XL's segment memory)"``).

    Returns:
        The bound method.
    """
    try:
        return getattr(obj, method)
    except AttributeError:
        raise TypeError(f"{needed_for} needs a model with {method}(), and a {type(obj).__name__} has none") from None


def non_finite(tensors: list[tuple[str, Tensor]]) -> list[str]:
    """The names of the floating point tensors among ``tensors`` that hold NaN or infinity.

    Two reductions per tensor (its largest and smallest value: NaN and infinity survive them), one read of the
    device for all of them, no copy of a tensor of two bytes or more a number (a float8 one is widened first: torch
    has no reductions for it).

    Args:
        tensors: ``(name, tensor)`` pairs, on one device; tensors that are not floating point are skipped.

    Returns:
        The names, in the order given.
    """
    floating = [(name, t if t.element_size() > 1 else t.to(torch.float16)) for name, t in tensors
                if t.is_floating_point() and t.numel()]
    if not floating:
        return []
    extremes = torch.stack([torch.stack([t.amax(), t.amin()]).float() for _, t in floating])  # (n, 2)
    finite = torch.isfinite(extremes).all(dim=1).tolist()
    return [name for (name, _), ok in zip(floating, finite) if not ok]


def non_finite_message(where: object, bad: list[tuple[str, Tensor]], cause: str) -> str:
    """The loaders' message for tensors that hold NaN or infinity: each named, with how many of its values.

    Args:
        where: the file or folder, first in the message.
        bad: ``(name, tensor)`` of each tensor :func:`non_finite` found.
        cause: what it means and what to do, the message's end.

    Returns:
        The message.
    """
    listed = ", ".join(f"{name} ({int((~torch.isfinite(t.float())).sum()):,} of {t.numel():,})" for name, t in bad[:6])
    return (f"{where}: the weights hold NaN or infinite values, in {len(bad)} tensor(s): {listed}"
            f"{' ...' if len(bad) > 6 else ''}. {cause}")


def check_finite_weights(module: torch.nn.Module, where: object, *, converted_to: torch.dtype | None = None) -> None:
    """Raise a ``ValueError`` naming the weights of ``module`` that hold NaN or infinity.

    Its weights are its parameters and saved buffers. The check of the loaders (``check_finite=True``): a model
    whose training diverged, or a damaged conversion, would otherwise load and then print NaN. A weight tied to
    another is named once.

    Args:
        module: the model, its weights loaded.
        where: the file or folder they came from, for the message.
        converted_to: the dtype the loader converted the file's finite weights to, when it did (a value beyond
            its range became infinite there); ``None``: the weights are the file's.
    """
    seen: set[int] = set()
    tensors = []
    for name, t in module.state_dict(keep_vars=True).items():
        if id(t) not in seen:  # a tied weight appears under each name it has
            seen.add(id(t))
            tensors.append((name, t.detach()))
    bad = set(non_finite(tensors))
    if not bad:
        return
    if converted_to is not None:
        cause = (f"The file's values are finite, but some are beyond the range of dtype={converted_to} "
                 f"({torch.finfo(converted_to).max:.6g} at most): load with the file's dtype, or torch.bfloat16")
    else:
        cause = "The file is broken (did its training diverge?); pass check_finite=False to load it anyway"
    raise ValueError(non_finite_message(where, [(n, t) for n, t in tensors if n in bad], cause))


def check_shift(shift: object, b: int, device: torch.device) -> Tensor:
    """Check a generator's ``shift`` ``(b,)`` (each row's left padding): integers on ``device``; as ``torch.long``."""
    if not isinstance(shift, Tensor):
        raise TypeError(f"shift must be a torch.Tensor of shape (b,) = ({b},), got {type(shift).__name__}")
    if shift.dtype.is_floating_point or shift.dtype.is_complex or shift.dtype == torch.bool:
        raise TypeError(f"shift must hold integers (torch.long), got dtype {shift.dtype}")
    if tuple(shift.shape) != (b,):
        raise ValueError(f"shift must have shape (b,) = ({b},), one per row of x, got {tuple(shift.shape)}")
    if shift.device != device:
        raise ValueError(f"shift is on {shift.device}, but x is on {device}")
    return shift.long()


def check_position_shape(positions: object, t: int, device: torch.device) -> Tensor:
    """Check that ``positions`` holds ``t`` integer positions ``(t,)`` on ``device``; return them as ``torch.long``.

    Shapes and dtypes only (a module's door check); :func:`check_positions` adds the values' checks of a model.
    """
    if not isinstance(positions, Tensor):
        raise TypeError(f"positions must be a torch.Tensor of shape (t,) = ({t},), got {type(positions).__name__}")
    if positions.dtype.is_floating_point or positions.dtype.is_complex or positions.dtype == torch.bool:
        raise TypeError(f"positions must hold integer positions (torch.long), got dtype {positions.dtype}")
    if tuple(positions.shape) != (t,):
        raise ValueError(f"positions must have shape (t,) = ({t},), one per token, got {tuple(positions.shape)}")
    if positions.device != device:
        raise ValueError(f"positions must be on the tokens' device ({device}), got {positions.device}")
    return positions if positions.dtype == torch.long else positions.long()


def check_sequence_inputs(x: object, mask: object, positions: object, emb: int, *,
                          like: Tensor | None = None) -> tuple[int, int]:
    """The door check of a module that takes ``x`` ``(b, t, emb)``, an optional padding ``mask`` ``(b, t)`` and
    optional ``positions`` ``(t,)`` (attention, a block, a stack); returns ``(b, t)``. Shapes and dtypes only."""
    b, t, _ = check_embeddings(x, "x", emb, like=like)
    if b == 0 or t == 0:  # a view into heads cannot infer a size from 0 elements: say so here
        raise ValueError(f"x must hold at least one sequence of at least one position, got shape {tuple(x.shape)}")
    if mask is not None:
        check_mask(mask, "mask", (b, t), device=x.device)  # type: ignore[union-attr]
    if positions is not None:
        check_position_shape(positions, t, x.device)  # type: ignore[union-attr]
    return b, t


def check_documents(documents: object, b: int, t: int, device: torch.device, name: str = "documents",
                    dims: str = "(b, t)") -> Tensor:
    """The door check of a packed row's ``documents``: integer ``(b, t)`` on ``device`` (shapes and dtypes only);
    returns them as ``torch.long``. ``name`` and ``dims`` say what the messages call them (``src_documents``,
    ``(b, u)``)."""
    if not isinstance(documents, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape {dims} = ({b}, {t}), got "
                        f"{type(documents).__name__}")
    if documents.dtype.is_floating_point or documents.dtype.is_complex or documents.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer document indices (any integer dtype), got dtype "
                        f"{documents.dtype}")
    if tuple(documents.shape) != (b, t):
        raise ValueError(f"{name} must have shape {dims} = ({b}, {t}), the document of each token, got "
                         f"{tuple(documents.shape)}")
    if documents.device != device:
        raise ValueError(f"{name} must be on the tokens' device ({device}), got {documents.device}")
    return documents if documents.dtype == torch.long else documents.long()


def check_document_values(documents: Tensor, name: str = "documents") -> None:
    """A model's value check of packed rows' ``documents`` ``(b, t)``: numbers in ``[0, t)``, each document's tokens
    together, in order (non-decreasing along each row). One read of the device: call it where
    :func:`values_checkable` allows."""
    t = documents.size(1)
    in_range, ordered = torch.stack([((documents >= 0) & (documents < t)).all(),
                                     (documents[:, 1:] >= documents[:, :-1]).all()]).tolist()
    if not in_range:
        raise ValueError(f"{name} must number each row's documents in [0, t) = [0, {t}), got values in "
                         f"[{int(documents.min())}, {int(documents.max())}]")
    if not ordered:
        row, at = (documents[:, 1:] < documents[:, :-1]).nonzero()[0].tolist()
        raise ValueError(f"{name} must not decrease along a row (each document's tokens together, one document "
                         f"after another, as torchformer.data.packing.packed_batch numbers them), got "
                         f"{int(documents[row, at])} then {int(documents[row, at + 1])} at positions {at} and "
                         f"{at + 1} of row {row}")


def check_context(context: object, context_mask: object, emb: int, batch: int | None = None, *,
                  like: Tensor | None = None) -> int:
    """The door check of the context a cross-attention reads, ``(b, u, emb)`` with the queries' ``b`` if given
    (and, with ``like``, the parameters' dtype), and of its padding mask ``(b, u)``; returns ``u``."""
    b, u, _ = check_embeddings(context, "context", emb, like=like, batch=batch, dims="(b, u)")
    if context_mask is not None:
        check_mask(context_mask, "context_mask", (b, u), "(b, u)", device=context.device)  # type: ignore[union-attr]
    return u


def _check_bounds(lo: int, hi: int, limit: int | None, capacity: int | None) -> None:
    if lo < 0:
        raise ValueError(f"positions must be >= 0, got values in [{lo}, {hi}]")
    if limit is not None and hi >= limit:
        raise ValueError(f"the input reaches position {hi}, but the model has learned positions for seq_length={limit} "
                         f"only (0 .. {limit - 1}); crop the input to its last {limit} tokens or build the model with "
                         f"a larger seq_length")
    if capacity is not None and hi >= capacity:
        raise ValueError(f"the input reaches position {hi}, but the caches hold {capacity} positions (0 .. "
                         f"{capacity - 1}); decode within seq_length, or start again with fresh caches")
