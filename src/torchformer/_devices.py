"""Reading the devices that users name: ``"auto"``, ``"cpu"``, ``"cuda:1"``, a ``torch.device``, a map_location.

One family, in one place, for every module that takes a device: :func:`~torchformer.train.training.resolve_device`
and :func:`~torchformer.train.training.autocast`, :func:`~torchformer.train.checkpoint.load_checkpoint`'s and
:func:`~torchformer.train.loading.load_model`'s ``map_location``. A device this machine lacks is the caller's
mistake: say so, naming the argument, before a file is read or a model is built. A private module with public names,
importing nothing of torchformer, so that any module can use it without an import cycle.
"""

from __future__ import annotations

from typing import Any, Optional

import torch


def resolve_named_device(device: object, name: str) -> torch.device:
    """``device`` as :func:`~torchformer.train.training.resolve_device` reads it (``None``/``"auto"``: CUDA if
    available, else the CPU), its errors naming the argument ``name`` (``device``, ``map_location``, ...)."""
    parsed = parse_device(device, name)
    if parsed is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    check_device_available(parsed, name)
    return parsed


def parse_device(device: object, name: str = "device") -> Optional[torch.device]:
    """``device`` as a ``torch.device`` (``None`` for ``None``/``"auto"``), checked to be a device that can run a
    model, but not checked to exist on this machine (:func:`check_device_available` does that)."""
    if device is None:
        return None
    if isinstance(device, str):
        text = device.strip().lower()  # torch's device names are lower case, and " cpu" is no other device
        if text == "auto":
            return None
        try:
            device = torch.device(text)
        except RuntimeError as e:
            raise ValueError(f"{name} must be 'auto', 'cpu', 'cuda', 'cuda:N', ...; got {device!r} ({e})") from None
    elif not isinstance(device, torch.device):
        raise TypeError(f"{name} must be a str, torch.device or None, got {type(device).__name__} {device!r}")
    if device.type == "meta":
        raise ValueError(f"{name} must be a device that can run a model, got {str(device)!r}: the meta device holds "
                         f"shapes but no data; use 'cpu', 'cuda' or 'auto'")
    if device.type == "cpu" and device.index not in (None, 0):
        raise ValueError(f"{name} must be 'cpu' (or 'cpu:0': there is one CPU device, whatever the cores), got "
                         f"{str(device)!r}; did you mean 'cuda:{device.index}'?")
    return device


def check_device_available(device: torch.device, name: str = "device") -> None:
    """Raise ``ValueError`` naming ``device`` unless this machine can put tensors on it."""
    if device.type == "cpu":
        return
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name} {str(device)!r} was requested but CUDA is not available "
                             f"(torch {torch.__version__}, CUDA build: {torch.version.cuda}); use 'cpu' or 'auto'")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"{name} {str(device)!r} was requested but only {torch.cuda.device_count()} CUDA "
                             f"device(s) exist")
        return
    backend = getattr(torch.backends, device.type, None) or getattr(torch, device.type, None)
    is_available = getattr(backend, "is_available", None)
    if callable(is_available) and not is_available():
        raise ValueError(f"{name} {str(device)!r} was requested but is not available on this machine")
    # Many device types are merely names to torch ("opengl", "xla" without torch_xla, "mkldnn", which is a CPU
    # library): the one sure test is to place an empty tensor there.
    try:
        torch.empty(0, device=device)
    except Exception as e:  # noqa: BLE001 - NotImplementedError, AssertionError, RuntimeError, ... by backend
        reason = " ".join(str(e).split())[:160]
        raise ValueError(f"{name} {str(device)!r} was requested but this torch cannot place tensors there "
                         f"({type(e).__name__}: {reason}); use 'cpu', 'cuda' or 'auto'") from None


def check_map_location(map_location: Any) -> None:
    """A device that does not exist here is the caller's mistake: say so, not "the file is damaged" later."""
    if not isinstance(map_location, (str, torch.device)):
        return  # a dict or a function, as torch.load accepts: torch checks those
    try:
        device = torch.device(map_location)
    except RuntimeError as e:
        raise ValueError(f"map_location must name a device such as 'cpu' or 'cuda:0', got {map_location!r}") from e
    check_device_available(device, "map_location")


def map_location_device(map_location: Any) -> torch.device:
    """``map_location`` as one device that exists here (a model is built on it, so no dict or function)."""
    if not isinstance(map_location, (str, torch.device)):
        raise TypeError(f"map_location must be a device such as 'cpu' or 'cuda:0', got {map_location!r}")
    return resolve_named_device(map_location, "map_location")  # also says so when the device does not exist here
