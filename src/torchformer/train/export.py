"""A trained model outside its training script: rebuild it from a file, or export it in a portable format.

* :func:`load_model` rebuilds a model from a checkpoint file written by
  :func:`~torchformer.train.checkpoint.save_checkpoint` (which stores the model's class name and its
  :class:`~torchformer.config.TransformerConfig` next to the weights) or from a folder written by
  :func:`export_model`, and loads its weights.
* :func:`export_model` writes ``model.safetensors`` (the weights, in a format that cannot run code when read and
  that other tools read too) and ``config.json`` (the class name and the config). ``safetensors`` is an optional
  dependency: ``pip install "torchformer[safetensors]"``.

    model = load_model("runs/enwik8/step_00002000.pt")       # or GTransformer.from_checkpoint(...)
    export_model(model, "exported/enwik8")                     # model.safetensors + config.json
    same = load_model("exported/enwik8")
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import torch
from torch import nn

from torchformer.config import TransformerConfig
from torchformer.models import MODEL_CLASSES, TransformerModel
from torchformer.train.checkpoint import (
    is_or_extends, load_checkpoint, read_checkpoint, unwrap_model, write_atomically,
)
from torchformer.train.training import resolve_device

PathLike = Union[str, os.PathLike]

# The two files of an exported model (export_model, load_model) and the version of that layout.
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
EXPORT_FORMAT_VERSION = 1


def load_model(
    path: PathLike,
    *,
    model_class: Optional[type[TransformerModel]] = None,
    classes: Optional[Mapping[str, type[TransformerModel]]] = None,
    map_location: Union[str, torch.device] = "cpu",
) -> TransformerModel:
    """The model saved at ``path``, rebuilt from its stored config, weights loaded, in ``eval()`` mode.

    Args:
        path: a checkpoint file written by :func:`save_checkpoint`, or a folder written by :func:`export_model`.
        model_class: the class to build (``model_class.from_config(config)``): the saved class or a subclass of it.
            By default the saved class name is looked up in :data:`torchformer.models.MODEL_CLASSES` and ``classes``.
        classes: more classes to look the saved name up in, ``{"MyGPT": MyGPT}``: your own subclasses.
        map_location: the device of the returned model (``"cpu"``, ``"cuda"``, ``torch.device("cuda:1")``).

    The global random generators are left as they were (building a model draws its initial weights from them), so
    loading a model in the middle of a seeded script does not change its later random numbers. A folder needs the
    optional ``safetensors`` package (``pip install "torchformer[safetensors]"``); checkpoint files do not.

    Raises ``ValueError`` when the file holds no config (then build the model yourself and use
    :func:`load_checkpoint`), names a class that is neither built in nor in ``classes``, or holds weights that do
    not fit the config; ``TypeError`` for a ``model_class`` or ``classes`` that are not torchformer model classes.
    """
    path = Path(path)
    device = _check_device(map_location)
    if path.is_dir():
        safetensors_torch = _import_safetensors()  # before any work: a missing package is the first thing to fix
        saved_class, config = _read_export_config(path)
    else:
        info = read_checkpoint(path)
        saved_class, config = info["model_class"], info["config"]
        if config is None:
            raise ValueError(
                f"checkpoint {path} holds no model config (it was saved from a plain nn.Module or by an older "
                f"torchformer), so load_model cannot rebuild the model; build it yourself and call "
                f"load_checkpoint({str(path)!r}, model=model)"
            )
    cls = _resolve_model_class(saved_class, model_class, classes, path)
    with torch.random.fork_rng(devices=[]):  # the random initial weights are overwritten: don't consume the RNG
        model = cls.from_config(config)
    if path.is_dir():
        _load_safetensors(safetensors_torch, model, path / WEIGHTS_FILE)
    else:
        load_checkpoint(path, model=model, restore_rng=False)  # its config and weight checks apply
    return model.to(device).eval()


def export_model(model: nn.Module, directory: PathLike) -> Path:
    """Write a trained model to ``directory`` as ``model.safetensors`` + ``config.json``; return the folder.

    ``model.safetensors`` holds only the weights (of the module behind any ``torch.compile``/DataParallel
    wrapper; a tied embedding is stored once and tied again on loading); ``config.json`` holds
    ``{"model_class": ..., "config": {...}, "format_version": 1, "torchformer_version": ...}``. Neither can run
    code when read, and :func:`load_model` (or ``torchformer.load_model(directory)``) rebuilds the model from
    them without the training script. Each file is replaced atomically (temporary file, then rename).

    Requires a :class:`~torchformer.models.TransformerModel` (``TypeError`` otherwise) and the optional
    ``safetensors`` package (``ImportError`` saying how to install it otherwise).
    """
    target = unwrap_model(model)
    if not isinstance(target, TransformerModel):
        raise TypeError(
            f"model must be a torchformer TransformerModel (a model with a config to export), got "
            f"{type(target).__name__}; for other modules save the state_dict with save_checkpoint"
        )
    safetensors_torch = _import_safetensors()
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"directory must be a folder to export the model to, got the file {directory}")
    from torchformer import __version__  # imported here: torchformer/__init__.py imports this module

    description = {
        "model_class": type(target).__name__,
        "config": target.config.to_dict(),
        "format_version": EXPORT_FORMAT_VERSION,
        "torchformer_version": __version__,
    }
    # save_model stores a tensor shared by two parameters (tie_weights=True) once, which safetensors requires.
    write_atomically(directory / WEIGHTS_FILE, lambda tmp: safetensors_torch.save_model(target, str(tmp)))
    write_atomically(directory / CONFIG_FILE,
                      lambda tmp: tmp.write_text(json.dumps(description, indent=2) + "\n", encoding="utf-8"))
    return directory


def _resolve_model_class(
    saved: Optional[str],
    model_class: Optional[type[TransformerModel]],
    classes: Optional[Mapping[str, type[TransformerModel]]],
    path: Path,
) -> type[TransformerModel]:
    """The class :func:`load_model` builds: ``model_class``, or the class named ``saved`` in the file."""
    known: dict[str, type[TransformerModel]] = dict(MODEL_CLASSES)
    if classes is not None:
        if not isinstance(classes, Mapping):
            raise TypeError(f"classes must be a dict of class name -> model class, got {type(classes).__name__}")
        for name, cls in classes.items():
            _check_model_class(cls, f"classes[{name!r}]")
        known.update(classes)
    # TransformerModel itself cannot be built (it has no layers): TransformerModel.from_checkpoint means "any model".
    if model_class is not None and model_class is not TransformerModel:
        _check_model_class(model_class, "model_class")
        if saved is not None and not is_or_extends(model_class, saved):
            raise ValueError(f"{path} holds a {saved}; model_class {model_class.__name__} is not {saved} or a "
                             f"subclass of it")
        return model_class
    if saved is None:
        raise ValueError(f"{path} does not say which model class it holds; pass model_class=... (e.g. GTransformer)")
    if saved not in known:
        raise ValueError(
            f"{path} holds a {saved}, which is not one of torchformer's model classes ({', '.join(MODEL_CLASSES)}); "
            f"pass the class: load_model(path, classes={{{saved!r}: {saved}}}) or model_class={saved}"
        )
    return known[saved]


def _check_model_class(cls: Any, name: str) -> None:
    if not (isinstance(cls, type) and issubclass(cls, TransformerModel)):
        got = cls.__name__ if isinstance(cls, type) else repr(cls)
        raise TypeError(f"{name} must be a TransformerModel subclass (e.g. GTransformer), got {got}")


def _check_device(map_location: Any) -> torch.device:
    if not isinstance(map_location, (str, torch.device)):
        raise TypeError(f"map_location must be a device such as 'cpu' or 'cuda:0', got {map_location!r}")
    try:
        return resolve_device(map_location)  # also says so when the device does not exist on this machine
    except ValueError as e:
        raise ValueError(f"map_location: {e}") from None


def _import_safetensors() -> Any:
    """``safetensors.torch``, an optional dependency: needed only for exported folders."""
    try:
        import safetensors.torch
    except ImportError as e:
        raise ImportError('exporting and loading model folders (model.safetensors + config.json) needs the '
                          'safetensors package: pip install "torchformer[safetensors]"') from e
    return safetensors.torch


def _read_export_config(directory: Path) -> tuple[Optional[str], TransformerConfig]:
    """The class name and config in ``directory/config.json``, written by :func:`export_model`."""
    file = directory / CONFIG_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{directory} holds no {CONFIG_FILE}; expected a folder written by export_model "
                                f"({CONFIG_FILE} + {WEIGHTS_FILE}) or a checkpoint file")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{file} is not valid JSON: {e}") from e
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
        raise ValueError(f"{file} must hold an object with a \"config\" object, as export_model writes it")
    version = data.get("format_version")
    if version != EXPORT_FORMAT_VERSION:
        raise ValueError(f"{file} has format_version {version!r}; this torchformer reads version "
                         f"{EXPORT_FORMAT_VERSION} (a newer torchformer wrote it?)")
    try:
        return data.get("model_class"), TransformerConfig.from_dict(data["config"])
    except (TypeError, ValueError) as e:
        raise ValueError(f"{file} holds a config this version of torchformer cannot read: {e}") from e


def _load_safetensors(safetensors_torch: Any, model: TransformerModel, file: Path) -> None:
    """Load ``file`` into ``model`` strictly: every weight present, none left over, every shape equal."""
    if not file.is_file():
        raise FileNotFoundError(f"no weights file {file}; expected one next to its {CONFIG_FILE} (see export_model)")
    from safetensors import SafetensorError

    try:
        # load_model (not load_file + load_state_dict) knows that a tied weight was stored under one name only.
        safetensors_torch.load_model(model, str(file), strict=True)
    except (RuntimeError, SafetensorError) as e:
        raise ValueError(f"the weights in {file} do not fit the {type(model).__name__} built from its "
                         f"{CONFIG_FILE}: {e}") from e
