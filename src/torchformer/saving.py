"""A model's own files: what records its architecture, how its class is found again, and the exported folder.

A torchformer model is rebuilt from three pieces of plain data, its **record** (:func:`model_record`): the class name,
where the class lives (``"module:qualname"``, :meth:`~torchformer.models.TransformerModel.import_path`) and its
:class:`~torchformer.config.TransformerConfig`. Checkpoints of a training run (:mod:`torchformer.train.checkpoint`)
store the record next to their weights; an exported folder stores it in ``config.json``:

* :func:`export_model` writes ``model.safetensors`` (the weights, in a format that cannot run code when read and
  that other tools read too) and ``config.json`` (the record, plus the SHA-256 of the record and of the weights
  file, both checked on loading). ``safetensors`` is an optional dependency: ``pip install "torchformer[safetensors]"``.
* :func:`load_exported` rebuilds the model from such a folder, weights checked and loaded, in the dtype it was
  saved in. (``torchformer.load_model`` takes a folder or a checkpoint file.)

    export_model(model, "exported/enwik8")        # model.safetensors + config.json
    same = load_exported("exported/enwik8")        # a GTransformer again, in eval() mode

This module is part of the core: it needs only the config and the models, no training code.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import torch
from torch import nn

from torchformer._checks import check_bool, check_finite_weights, is_int
from torchformer._devices import map_location_device
from torchformer._files import check_parents, check_path, file_sha256, read_json, write_atomically
from torchformer._version import __version__
from torchformer.config import TransformerConfig
from torchformer.models import MODEL_CLASSES, TransformerModel
from torchformer.nn.feedforward import GATES, gated_hidden_size

PathLike = Union[str, os.PathLike]

# The two files of an exported model and the version of that layout.
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
EXPORT_FORMAT_VERSION = 2  # 2: the record has a config_version (torchformer 0.5); 1 is read too
# What a saved config means. 2 (torchformer 0.5): positions="rotary" pairs each half of a head with the other, as
# Llama and every Hugging Face checkpoint do. A record without a config_version is older: its "rotary" paired
# adjacent coordinates, and it is read as "rotary_interleaved", so the model comes back exactly as it was trained.
# 3: a gated feed-forward network's default hidden size is 2/3 of ff_mult * emb to the nearest multiple of 16; an
# older config without ff_hidden meant round(2/3 * ff_mult * emb), and is read with that number as its ff_hidden
# where the two differ.
CONFIG_VERSION = 3
# Config fields that change how a model trains or computes, not what its weights mean: saved weights load into a
# model that differs only in these (a model is routinely evaluated with dropout 0, or on the reference attention path,
# and activation checkpointing is a memory choice of the training run).
TRAINING_ONLY_FIELDS = ("dropout", "impl", "checkpoint_blocks")


class CheckpointError(ValueError):
    """A model or checkpoint file that is empty, truncated, damaged or not what it claims to be.

    A ``ValueError``, so existing ``except ValueError`` handlers still catch it; the message names the file.
    """


# ---------------------------------------------------------------------------------------------------------
# The record: which class, where it lives, which architecture


def unwrap_model(model: nn.Module) -> nn.Module:
    """The module behind ``torch.compile`` (``._orig_mod``) and DataParallel/DDP (``.module``) wrappers.

    Wrappers can nest (``torch.compile(DDP(model))``): all are removed. A model sharded by FSDP2's ``fully_shard``
    is not wrapped (it is the model itself, its class swapped; see :func:`model_class`) and is returned as it is.

    Args:
        model: a module, wrapped or not.

    Returns:
        The innermost module; ``model`` itself when it is not wrapped.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    while True:  # wrappers can nest, e.g. torch.compile(DDP(model))
        inner = getattr(model, "_orig_mod", None)
        if isinstance(inner, nn.Module):
            model = inner
        elif isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
        else:
            return model


def model_class(model: nn.Module) -> type:
    """The class ``model`` was built as, also when FSDP2 has sharded it.

    FSDP2's ``fully_shard`` swaps a module's class for a generated subclass (``FSDPGTransformer``), which no other
    process could rebuild: the class returned is the one it derives from.

    Args:
        model: a module, sharded with FSDP2 or not (unwrap other wrappers first, :func:`unwrap_model`).

    Returns:
        ``type(model)``, or for a sharded model the first class of its MRO that is not an FSDP class.
    """
    try:
        from torch.distributed.fsdp import (
            FSDPModule,  # torch >= 2.6, and only where torch.distributed is built
        )
    except ImportError:
        return type(model)
    return next(cls for cls in type(model).__mro__ if not issubclass(cls, FSDPModule))


def model_record(model: TransformerModel) -> dict[str, Any]:
    """What rebuilds ``model``, as plain data: its class, where the class lives, and its config.

    Args:
        model: an unwrapped :class:`~torchformer.models.TransformerModel` (FSDP2-sharded is fine).

    Returns:
        ``{"model_class": name, "model_class_path": "module:qualname", "config": model.config.to_dict(),
        "config_version": CONFIG_VERSION}``.
    """
    cls = model_class(model)
    return {"model_class": cls.__name__, "model_class_path": cls.import_path(), "config": model.config.to_dict(),
            "config_version": CONFIG_VERSION}


def saved_config(record: Mapping[str, Any], where: object) -> Optional[TransformerConfig]:
    """The config in a record (a checkpoint's entries or an exported ``config.json``), or ``None`` without one.

    A ``"config"`` counts only next to a ``"model_class"``: other programs' checkpoints may hold a config of their
    own (nanoGPT's do), which is not ours to read. A config of an older ``"config_version"`` is read as what it meant
    then (see :data:`CONFIG_VERSION`).

    Args:
        record: the saved entries (``"model_class"``, ``"config"``, ...).
        where: what the record is, for the message (``"checkpoint runs/step_00000100.pt"``).

    Returns:
        The saved config (a :class:`~torchformer.config.TransformerConfig`), or ``None`` when the record holds none.

    Raises:
        ValueError: the config cannot be read by this version of torchformer (naming ``where``).
    """
    data = record.get("config")
    if data is None or "model_class" not in record:
        return None
    version = record.get("config_version", 1)  # records written before torchformer 0.5 have none
    if not is_int(version) or not 1 <= version <= CONFIG_VERSION:
        raise ValueError(f"{where} holds a config of config_version {version!r}; this torchformer reads versions 1 "
                         f"to {CONFIG_VERSION} (a newer torchformer wrote it?)")
    if version < 2 and isinstance(data, Mapping) and data.get("positions") == "rotary":
        data = {**data, "positions": "rotary_interleaved"}  # the layout it was trained with
    try:
        config = TransformerConfig.from_dict(data)
    except (TypeError, ValueError) as e:  # e.g. a field added by a newer torchformer
        raise ValueError(f"{where} holds a config this version of torchformer cannot read: {e}") from e
    if version < 3 and config.activation in GATES and config.ff_hidden is None:  # the width it was trained with
        trained = max(1, round(2 * config.ff_mult * config.emb / 3))
        if trained != gated_hidden_size(config.emb, config.ff_mult):  # equal where 2/3 ff_mult emb is a multiple of 16
            config = config.replace(ff_hidden=trained)
    return config


def is_or_extends(cls: type, name: str) -> bool:
    """Whether ``cls`` is the class called ``name`` or a subclass of one.

    Compared by name: the saved class may be a user's class that this process has not imported.

    Args:
        cls: the class of the model to load into.
        name: the class name a file recorded.

    Returns:
        True when a class of ``cls``'s MRO is called ``name``.
    """
    return any(base.__name__ == name for base in cls.__mro__)


def check_architecture(saved: Optional[TransformerConfig], saved_class: Optional[str], target: nn.Module,
                       where: object) -> None:
    """Refuse saved weights of another model class or another architecture than ``target``'s.

    A variant's weights can fit a plain model exactly, so the class must match (or ``target`` be a subclass of it);
    config fields outside :data:`TRAINING_ONLY_FIELDS` must be equal. Nothing is compared for a ``target`` that is
    not a :class:`~torchformer.models.TransformerModel` or a record without a config.

    Args:
        saved: the saved config, or ``None``.
        saved_class: the saved class name, or ``None``.
        target: the (unwrapped) model the weights are for.
        where: what holds the weights, for the message (``"checkpoint runs/step_00000100.pt"``).

    Raises:
        ValueError: naming the classes, or every differing field with both values.
    """
    if saved is None or not isinstance(target, TransformerModel):
        return  # nothing to compare: the state_dict's keys and shapes are checked instead
    if saved_class is not None and not is_or_extends(type(target), saved_class):
        raise ValueError(f"{where} holds a {saved_class}, but the model is a {type(target).__name__}, which is neither "
                         f"that class nor a subclass of it; build a {saved_class} (load_model(path, "
                         f"model_class={saved_class}))")
    differing = [
        f"{field.name}: {getattr(saved, field.name)!r} (checkpoint) vs {getattr(target.config, field.name)!r} (model)"
        for field in dataclasses.fields(saved)
        if field.name not in TRAINING_ONLY_FIELDS and getattr(saved, field.name) != getattr(target.config, field.name)
    ]
    if differing:
        raise ValueError(f"{where} was saved from a model with another architecture: {'; '.join(differing)}; build the "
                         f"model with load_model(path) (it reads the checkpoint's config), or change these fields")


# ---------------------------------------------------------------------------------------------------------
# Finding the class again


def resolve_model_class(saved: Optional[str], model_class: Optional[type[TransformerModel]],
                        classes: Optional[Mapping[str, type[TransformerModel]]], where: object,
                        saved_path: Optional[str] = None) -> type[TransformerModel]:
    """The class to rebuild a saved model as.

    ``model_class`` when given (it must be the saved class or a subclass), else the class named ``saved``: found in
    ``classes``, else where ``saved_path`` says it lives (in a module already imported), else (files written before
    the path was recorded) among the built-in classes by name.

    Args:
        saved: the class name the file recorded, or ``None``.
        model_class: the class asked for, or ``None`` (``TransformerModel`` itself also means "whatever was saved").
        classes: more classes to look ``saved`` up in, ``{"MyGPT": MyGPT}``, or ``None``.
        where: the file or folder, for the messages.
        saved_path: the class's recorded ``"module:qualname"``, or ``None``.

    Returns:
        The class, a subclass of :class:`~torchformer.models.TransformerModel`.

    Raises:
        ValueError: the class cannot be found, or ``model_class`` is another kind of model (saying how to pass it).
        TypeError: ``model_class`` or a value of ``classes`` is not a TransformerModel subclass.
    """
    if classes is not None:
        if not isinstance(classes, Mapping):
            raise TypeError(f"classes must be a dict of class name -> model class, got {type(classes).__name__}")
        for name, cls in classes.items():
            _check_model_class(cls, f"classes[{name!r}]")
    # TransformerModel itself cannot be built (it has no layers): asking for it means "any model".
    if model_class is not None and model_class is not TransformerModel:
        _check_model_class(model_class, "model_class")
        if saved is not None and not is_or_extends(model_class, saved):
            raise ValueError(f"{where} holds a {saved}, and a {model_class.__name__} was asked for: a "
                             f"{model_class.__name__} cannot be built from it (it is another kind of model; the class "
                             f"asked for must be {saved} or a subclass of it)")
        return model_class
    if saved is None:
        raise ValueError(f"{where} does not say which model class it holds; pass model_class=... (e.g. GTransformer)")
    if classes is not None and saved in classes:
        return classes[saved]
    # The recorded path decides, not the name: a variant may have taken a built-in's name (my_variants:CTransformer).
    if saved_path is not None:
        return _find_model_class(saved, saved_path, where)
    if saved in MODEL_CLASSES:
        return MODEL_CLASSES[saved]
    raise ValueError(f"{where} holds a {saved}, which is not one of torchformer's model classes "
                     f"({', '.join(MODEL_CLASSES)}); pass the class: load_model(path, classes={{{saved!r}: {saved}}}) "
                     f"or model_class={saved}")


def _find_model_class(saved: str, saved_path: object, where: object) -> type[TransformerModel]:
    """The class at ``saved_path`` (``"module:qualname"``) in a module **already imported**, which must be a
    TransformerModel called ``saved``.

    Never imports a module itself: a file names the module, and importing a module named by a file (say a
    ``evil.py`` beside a downloaded folder) would run its code. Import the module that defines your variant first,
    as you import the class to train it; a script's classes are in ``__main__``, which is always imported.
    """
    how = (f"import the module that defines it first, or pass the class: "
           f"load_model(path, classes={{{saved!r}: {saved}}})")
    module_name, _, qualname = saved_path.partition(":") if isinstance(saved_path, str) else ("", "", "")
    if not module_name or not qualname:
        raise ValueError(f"{where} records its class's import path as {saved_path!r}, not 'module:qualname'; {how}")
    found: Any = sys.modules.get(module_name)
    main = sys.modules.get("__main__")
    if found is None and main is not None and main.__spec__ is not None and main.__spec__.name == module_name:
        found = main  # this program runs that module as its script (python -m pkg.mod): imported, as __main__
    if found is None:
        raise ValueError(f"{where} holds a {saved}, defined in the module {module_name}, which is not imported "
                         f"(load_model never imports a module a file names: that could run its code); {how}")
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if not (isinstance(found, type) and issubclass(found, TransformerModel) and found.__name__ == saved):
        raise ValueError(f"{where} holds a {saved}, defined at {saved_path}, which is not a torchformer model class "
                         f"of that name there (renamed, moved, or defined inside a function?); {how}")
    return found


def _check_model_class(cls: Any, name: str) -> None:
    if not (isinstance(cls, type) and issubclass(cls, TransformerModel)):
        got = cls.__name__ if isinstance(cls, type) else repr(cls)
        raise TypeError(f"{name} must be a TransformerModel subclass (e.g. GTransformer), got {got}")


def rebuild_model(cls: type[TransformerModel], config: TransformerConfig,
                  dtypes: Mapping[str, torch.dtype]) -> TransformerModel:
    """A fresh model to load saved weights into: ``cls`` built from ``config``, in the saved dtypes.

    The global random generators are left as they were: the random initial weights are overwritten anyway, and
    loading a model in the middle of a seeded script should not change its later random numbers. The dtypes are
    adopted before loading, as float32 would round float64 weights. Saved in one dtype (``model.half()``): the whole
    model is converted, buffers outside the state dict included, as ``.half()`` did. Saved in several: each named
    tensor (wrapper prefixes such as ``_orig_mod.`` ignored).

    Args:
        cls: the model class (:func:`resolve_model_class`).
        config: the saved config.
        dtypes: the dtype of each saved floating point tensor, by name; empty: the model stays as built.

    Returns:
        The model, with random initial weights, in the saved dtypes.
    """
    with torch.random.fork_rng(devices=[]):
        model = cls.from_config(config)
    kinds = set(dtypes.values())
    if len(kinds) == 1:
        return model.to(kinds.pop())  # floating point tensors only: integer buffers keep their dtype
    plain = {re.sub(r"^((_orig_mod|module)\.)+", "", name): dtype for name, dtype in dtypes.items()}
    for name, tensor in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        dtype = plain.get(name)
        if dtype is not None and tensor.is_floating_point() and tensor.dtype != dtype:
            tensor.data = tensor.data.to(dtype)
    return model


# ---------------------------------------------------------------------------------------------------------
# The exported folder: model.safetensors + config.json


def export_model(model: nn.Module, directory: PathLike) -> Path:
    """Write a trained model to ``directory`` as ``model.safetensors`` + ``config.json``; return the folder.

    ``model.safetensors`` holds only the weights (of the module behind any ``torch.compile``/DataParallel
    wrapper; a tied embedding is stored once and tied again on loading), in their dtype; ``config.json`` holds the
    record (:func:`model_record`), ``"format_version"``, ``"torchformer_version"``, and the SHA-256 of the record
    (``"config_sha256"``: an edit that would read the weights into another architecture is refused) and of the
    weights (``"weights_sha256"``), both checked by :func:`load_exported`. Each file is replaced atomically.

    Args:
        model: a trained :class:`~torchformer.models.TransformerModel` (or a compiled or wrapped one).
        directory: the folder to write; created if needed.

    Returns:
        The folder, as a :class:`pathlib.Path`.

    Raises:
        TypeError: ``model`` is not a TransformerModel, or ``directory`` not a path.
        ValueError: ``directory`` is empty (``""`` would mean the current folder).
        NotADirectoryError: ``directory`` (or a folder on the way to it) is an existing file.
        ImportError: the optional ``safetensors`` package is missing (the message says how to install it).
    """
    target = unwrap_model(model)
    if not isinstance(target, TransformerModel):
        raise TypeError(f"model must be a torchformer TransformerModel (a model with a config to export), got "
                        f"{type(target).__name__}; for other modules save the state_dict with save_checkpoint")
    directory = check_path(directory, "directory")
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"directory must be a folder to export the model to, got the file {directory}")
    check_parents(directory, "directory")
    safetensors_torch = _import_safetensors()
    description = {**model_record(target), "format_version": EXPORT_FORMAT_VERSION, "torchformer_version": __version__}
    description["config_sha256"] = _architecture_digest(description["model_class"], description["config"],
                                                        description["model_class_path"], description["config_version"])

    def write_weights(tmp: Path) -> None:
        # save_model stores a tensor shared by two parameters (tie_weights=True) once, which safetensors requires.
        safetensors_torch.save_model(target, str(tmp))
        description["weights_sha256"] = file_sha256(tmp)  # of the bytes written, before they are renamed into place

    write_atomically(directory / WEIGHTS_FILE, write_weights)
    write_atomically(directory / CONFIG_FILE,
                     lambda tmp: tmp.write_text(json.dumps(description, indent=2) + "\n", encoding="utf-8"))
    return directory


def load_exported(directory: PathLike, *, model_class: Optional[type[TransformerModel]] = None,
                  classes: Optional[Mapping[str, type[TransformerModel]]] = None,
                  map_location: Union[str, torch.device] = "cpu", check_finite: bool = True) -> TransformerModel:
    """The model exported to ``directory`` by :func:`export_model`, weights checked and loaded.

    The model is rebuilt from ``config.json``, in the dtype it was saved in. Needs the optional ``safetensors`` package.

    Args:
        directory: the folder :func:`export_model` wrote.
        model_class: the class to build, the saved class or a subclass; ``None``: the recorded class, found where
            its import path says (in a module already imported), see :func:`resolve_model_class`.
        classes: more classes to look the saved name up in, ``{"MyGPT": MyGPT}``.
        map_location: the device of the returned model (``"cpu"``, ``"cuda"``, ``torch.device("cuda:1")``).
        check_finite: refuse weights that hold NaN or infinity; ``False``: load them as they are.

    Returns:
        The model (a :class:`~torchformer.models.TransformerModel`), in ``eval()`` mode.

    Raises:
        FileNotFoundError: the folder holds no ``config.json`` or no ``model.safetensors``.
        ValueError: ``config.json`` is not what :func:`export_model` wrote (edited, another format version, an
            unreadable config), the weights do not fit the config, or (``check_finite``) hold NaN or infinity.
        CheckpointError: ``model.safetensors`` is not the file :func:`export_model` wrote (its SHA-256 differs;
            folders exported before the digest was recorded load unchecked) or not a safetensors file.
    """
    directory = check_path(directory, "path")
    check_bool(check_finite, "check_finite")
    device = map_location_device(map_location)
    safetensors_torch = _import_safetensors()  # before any work: a missing package is the first thing to fix
    record, config, digest = _read_export_config(directory)
    weights = directory / WEIGHTS_FILE
    if not weights.is_file():
        raise FileNotFoundError(f"no weights file {weights}; expected one next to its {CONFIG_FILE} (see export_model)")
    if digest is not None and (received := file_sha256(weights)) != digest:
        raise CheckpointError(f"{weights} is damaged: it is not the file export_model wrote (SHA-256 "
                              f"{received[:16]}..., {CONFIG_FILE} records {digest[:16]}...); export the model again or "
                              f"restore the folder from a copy")
    cls = resolve_model_class(record.get("model_class"), model_class, classes, directory,
                              record.get("model_class_path"))
    model = rebuild_model(cls, config, _safetensors_dtypes(weights))
    _load_safetensors(safetensors_torch, model, weights)
    if check_finite:
        check_finite_weights(model, weights)
    return model.to(device).eval()


def _import_safetensors() -> Any:
    """``safetensors.torch``, an optional dependency: needed only for exported folders."""
    try:
        import safetensors.torch
    except ImportError as e:
        raise ImportError('exporting and loading model folders (model.safetensors + config.json) needs the '
                          'safetensors package: pip install "torchformer[safetensors]"') from e
    return safetensors.torch


def _read_export_config(directory: Path) -> tuple[dict[str, Any], TransformerConfig, Optional[str]]:
    """The record in ``directory/config.json`` (checked against its ``config_sha256``), its config, and the
    weights' SHA-256 (``None`` if not recorded)."""
    file = directory / CONFIG_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{directory} holds no {CONFIG_FILE}; expected a folder written by export_model "
                                f"({CONFIG_FILE} + {WEIGHTS_FILE}) or a checkpoint file")
    data = read_json(file)
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
        raise ValueError(f"{file} must hold an object with a \"config\" object, as export_model writes it")
    version = data.get("format_version")
    if version not in range(1, EXPORT_FORMAT_VERSION + 1):
        raise ValueError(f"{file} has format_version {version!r}; this torchformer reads versions 1 to "
                         f"{EXPORT_FORMAT_VERSION} (a newer torchformer wrote it?)")
    recorded = data.get("config_sha256")  # absent in folders exported before it was recorded
    described = _architecture_digest(data.get("model_class"), data["config"], data.get("model_class_path"),
                                     data.get("config_version"))
    if recorded is not None and recorded != described:
        raise ValueError(f"{file} was changed after export_model wrote it: its model_class or config no longer "
                         f"matches its config_sha256, so the weights could be read into another architecture (same "
                         f"shapes, other heads, say). Export the model again; to change it on purpose, also "
                         f"delete config_sha256")
    digest = data.get("weights_sha256")  # absent in folders exported by torchformer before it was recorded
    if digest is not None and not (isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)):
        raise ValueError(f"{file} has a weights_sha256 that is not a SHA-256 digest (64 hex digits): {digest!r:.80}")
    record = {"model_class": data.get("model_class"), "model_class_path": data.get("model_class_path"),
              "config": data["config"]}
    if "config_version" in data:
        record["config_version"] = data["config_version"]
    return record, saved_config(record, file), digest


def _architecture_digest(model_class: object, config: object, model_class_path: object = None,
                         config_version: object = None) -> str:
    """SHA-256 of the class name, config and (when recorded) the class's import path and the config's version, as
    canonical JSON (sorted keys): what ``config.json`` describes. Folders exported before the path or the version
    was recorded keep their digest."""
    described = {"model_class": model_class, "config": config}
    if model_class_path is not None:  # an edited path would lead load_model to another class
        described["model_class_path"] = model_class_path
    if config_version is not None:  # an edited version would read "rotary" in the other layout
        described["config_version"] = config_version
    text = json.dumps(described, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# safetensors' names of the floating point dtypes (the header of a .safetensors file names each tensor's dtype).
_SAFETENSORS_FLOATS = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                       "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


def _safetensors_dtypes(file: Path) -> dict[str, torch.dtype]:
    """The dtype of every floating point tensor in ``file``, read from its header (the weights stay on disk)."""
    try:
        with open(file, "rb") as f:
            size = int.from_bytes(f.read(8), "little")  # the format: an 8-byte length, then a JSON header
            header = json.loads(f.read(size)) if 0 < size < 1 << 30 else None
    except (OSError, ValueError):
        header = None
    if not isinstance(header, dict):
        return {}  # not a safetensors file: loading it says so
    dtypes = {name: getattr(torch, _SAFETENSORS_FLOATS.get(info.get("dtype"), ""), None)
              for name, info in header.items() if isinstance(info, dict)}
    return {name: dtype for name, dtype in dtypes.items() if isinstance(dtype, torch.dtype)}


def _load_safetensors(safetensors_torch: Any, model: TransformerModel, file: Path) -> None:
    """Load ``file`` into ``model`` strictly: every weight present, none left over, every shape equal."""
    from safetensors import SafetensorError

    try:
        # load_model (not load_file + load_state_dict) knows that a tied weight was stored under one name only.
        safetensors_torch.load_model(model, str(file), strict=True)
    except SafetensorError as e:  # the file itself: empty, truncated, not a safetensors file
        raise CheckpointError(f"{file} is not a readable safetensors file (damaged or truncated?): {e}") from e
    except RuntimeError as e:  # missing, unexpected or mis-shaped weights
        raise ValueError(f"the weights in {file} do not fit the {type(model).__name__} built from its "
                         f"{CONFIG_FILE}: {e}") from e
