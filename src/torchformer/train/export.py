"""A trained model outside its training script: rebuild it from a file, or export it in a portable format.

* :func:`load_model` rebuilds a model from a checkpoint file written by
  :func:`~torchformer.train.checkpoint.save_checkpoint` (which stores the model's class name and its
  :class:`~torchformer.config.TransformerConfig` next to the weights) or from a folder written by
  :func:`export_model`, and loads its weights.
* :func:`export_model` writes ``model.safetensors`` (the weights, in a format that cannot run code when read and
  that other tools read too) and ``config.json`` (the class name, the config and the SHA-256 of the weights file,
  which :func:`load_model` checks). ``safetensors`` is an optional dependency:
  ``pip install "torchformer[safetensors]"``.

Either way the model comes back in the dtype it was saved in (a ``model.half()`` stays float16).

    model = load_model("runs/enwik8/step_00002000.pt")       # or GTransformer.from_checkpoint(...)
    export_model(model, "exported/enwik8")                     # model.safetensors + config.json
    same = load_model("exported/enwik8")
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import zipfile
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import torch
from torch import nn

from torchformer._devices import map_location_device
from torchformer._files import check_parents, file_sha256
from torchformer.config import TransformerConfig
from torchformer.models import MODEL_CLASSES, TransformerModel
from torchformer.train.checkpoint import (
    CheckpointError, is_or_extends, load_checkpoint, read_checkpoint, unwrap_model, write_atomically,
)

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
        path: a checkpoint file written by :func:`~torchformer.train.checkpoint.save_checkpoint`, or a folder
            written by :func:`export_model`.
        model_class: the class to build (``model_class.from_config(config)``): the saved class or a subclass of it.
            By default the saved class name is looked up in ``classes``, then in
            :data:`torchformer.models.MODEL_CLASSES`, then where the file says it lives
            (:meth:`~torchformer.models.TransformerModel.import_path`, e.g. ``"my_variants:ParallelGPT"``) in a
            module already imported: a variant of your own loads without naming it once its module is imported
            (``load_model`` never imports a module a file names, which could run code).
        classes: more classes to look the saved name up in, ``{"MyGPT": MyGPT}``: a class whose recorded place is
            not imported, or that was moved or renamed since.
        map_location: the device of the returned model (``"cpu"``, ``"cuda"``, ``torch.device("cuda:1")``).

    Returns:
        The model (a :class:`~torchformer.models.TransformerModel`), in ``eval()`` mode.

    The global random generators are left as they were (building a model draws its initial weights from them), so
    loading a model in the middle of a seeded script does not change its later random numbers. A folder needs the
    optional ``safetensors`` package (``pip install "torchformer[safetensors]"``); checkpoint files do not.

    The model's parameters and buffers get the dtypes of the saved weights (a model saved after ``.half()`` or
    ``.to(torch.bfloat16)`` loads as such, not as float32).

    Raises ``ValueError`` when the file holds no config (then build the model yourself and use
    :func:`load_checkpoint`), names a class that is neither built in nor in ``classes``, or holds weights that do
    not fit the config; :class:`~torchformer.train.checkpoint.CheckpointError` (a ``ValueError``) naming the file
    when ``model.safetensors`` is not the file :func:`export_model` wrote (its SHA-256 differs from the one in
    ``config.json``; folders exported before the digest was recorded load unchecked); ``TypeError`` for a
    ``model_class`` or ``classes`` that are not torchformer model classes.
    """
    path = _check_path(path, "path")
    device = map_location_device(map_location)
    if path.is_dir():
        safetensors_torch = _import_safetensors()  # before any work: a missing package is the first thing to fix
        saved_class, config, digest, saved_path = _read_export_config(path)
        weights = path / WEIGHTS_FILE
        if not weights.is_file():
            raise FileNotFoundError(f"no weights file {weights}; expected one next to its {CONFIG_FILE} (see "
                                    f"export_model)")
        if digest is not None:
            _verify_weights(weights, digest)
        dtypes = _safetensors_dtypes(weights)
    else:
        info = read_checkpoint(path)
        saved_class, config, saved_path = info["model_class"], info["config"], info["model_class_path"]
        if config is None:
            raise ValueError(
                f"checkpoint {path} holds no model config (it was saved from a plain nn.Module or by an older "
                f"torchformer), so load_model cannot rebuild the model; build it yourself and call "
                f"load_checkpoint({str(path)!r}, model=model)"
            )
        dtypes = _checkpoint_dtypes(path)
    cls = _resolve_model_class(saved_class, model_class, classes, path, saved_path)
    with torch.random.fork_rng(devices=[]):  # the random initial weights are overwritten: don't consume the RNG
        model = cls.from_config(config)
    _adopt_dtypes(model, dtypes)  # before loading: float32 would round float64 weights
    if path.is_dir():
        _load_safetensors(safetensors_torch, model, weights)
    else:
        load_checkpoint(path, model=model, restore_rng=False)  # its config and weight checks apply
    return model.to(device).eval()


def export_model(model: nn.Module, directory: PathLike) -> Path:
    """Write a trained model to ``directory`` as ``model.safetensors`` + ``config.json``; return the folder.

    ``model.safetensors`` holds only the weights (of the module behind any ``torch.compile``/DataParallel
    wrapper; a tied embedding is stored once and tied again on loading); ``config.json`` holds
    ``{"model_class": ..., "model_class_path": "module:qualname", "config": {...}, "format_version": 1,
    "torchformer_version": ...,
    "config_sha256": ..., "weights_sha256": ...}``: the SHA-256 of the class and config (an edit that would read
    the weights into another architecture is refused) and of ``model.safetensors``, both checked by
    :func:`load_model`. Neither file can run code when read, and :func:`load_model` (or
    ``torchformer.load_model(directory)``) rebuilds the model from them without the training script. Each file is
    replaced atomically (temporary file, then rename). The weights keep their dtype (float16, bfloat16, ...).

    Requires a :class:`~torchformer.models.TransformerModel` (``TypeError`` otherwise), a folder path that is not
    empty (``""`` would mean the current folder) and not an existing file (``ValueError``/``NotADirectoryError``),
    and the optional ``safetensors`` package (``ImportError`` saying how to install it otherwise).

    Args:
        model: a trained :class:`~torchformer.models.TransformerModel` (or a compiled or wrapped one).
        directory: the folder to write; created if needed.

    Returns:
        The folder, as a :class:`pathlib.Path`.
    """
    target = unwrap_model(model)
    if not isinstance(target, TransformerModel):
        raise TypeError(
            f"model must be a torchformer TransformerModel (a model with a config to export), got "
            f"{type(target).__name__}; for other modules save the state_dict with save_checkpoint"
        )
    directory = _check_path(directory, "directory")
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"directory must be a folder to export the model to, got the file {directory}")
    check_parents(directory, "directory")
    safetensors_torch = _import_safetensors()
    from torchformer import __version__  # imported here: torchformer/__init__.py imports this module

    description = {
        "model_class": type(target).__name__,
        "model_class_path": type(target).import_path(),  # so that load_model finds a variant's class by itself
        "config": target.config.to_dict(),
        "format_version": EXPORT_FORMAT_VERSION,
        "torchformer_version": __version__,
    }
    description["config_sha256"] = _architecture_digest(description["model_class"], description["config"],
                                                        description["model_class_path"])

    def write_weights(tmp: Path) -> None:
        # save_model stores a tensor shared by two parameters (tie_weights=True) once, which safetensors requires.
        safetensors_torch.save_model(target, str(tmp))
        description["weights_sha256"] = file_sha256(tmp)  # of the bytes written, before they are renamed into place

    write_atomically(directory / WEIGHTS_FILE, write_weights)
    write_atomically(directory / CONFIG_FILE,
                      lambda tmp: tmp.write_text(json.dumps(description, indent=2) + "\n", encoding="utf-8"))
    return directory


def _resolve_model_class(
    saved: Optional[str],
    model_class: Optional[type[TransformerModel]],
    classes: Optional[Mapping[str, type[TransformerModel]]],
    path: Path,
    saved_path: Optional[str] = None,
) -> type[TransformerModel]:
    """The class :func:`load_model` builds: ``model_class``, or the class named ``saved`` in the file: found in
    ``classes``, else where ``saved_path`` (``"module:qualname"``) says it lives, else (files written before the path
    was recorded) among the built-in classes by name."""
    if classes is not None:
        if not isinstance(classes, Mapping):
            raise TypeError(f"classes must be a dict of class name -> model class, got {type(classes).__name__}")
        for name, cls in classes.items():
            _check_model_class(cls, f"classes[{name!r}]")
    # TransformerModel itself cannot be built (it has no layers): TransformerModel.from_checkpoint means "any model".
    if model_class is not None and model_class is not TransformerModel:
        _check_model_class(model_class, "model_class")
        if saved is not None and not is_or_extends(model_class, saved):
            raise ValueError(f"{path} holds a {saved}, and a {model_class.__name__} was asked for: a "
                             f"{model_class.__name__} cannot be built from it (it is another kind of model; the class "
                             f"asked for must be {saved} or a subclass of it)")
        return model_class
    if saved is None:
        raise ValueError(f"{path} does not say which model class it holds; pass model_class=... (e.g. GTransformer)")
    if classes is not None and saved in classes:
        return classes[saved]
    # The recorded path decides, not the name: a variant may have taken a built-in's name (my_variants:CTransformer).
    if saved_path is not None:
        return _find_model_class(saved, saved_path, path)
    if saved in MODEL_CLASSES:
        return MODEL_CLASSES[saved]
    raise ValueError(
        f"{path} holds a {saved}, which is not one of torchformer's model classes ({', '.join(MODEL_CLASSES)}); "
        f"pass the class: load_model(path, classes={{{saved!r}: {saved}}}) or model_class={saved}"
    )


def _find_model_class(saved: str, saved_path: object, path: Path) -> type[TransformerModel]:
    """The class at ``saved_path`` (``"module:qualname"``) in a module **already imported**, which must be a
    TransformerModel called ``saved``.

    Never imports a module itself: a file names the module, and importing a module named by a file (say a
    ``evil.py`` beside a downloaded folder) would run its code. Import the module that defines your variant first,
    as you import the class to train it; a script's classes are in ``__main__``, which is always imported.
    """
    how = f"import the module that defines it first, or pass the class: load_model(path, classes={{{saved!r}: {saved}}})"
    module_name, _, qualname = saved_path.partition(":") if isinstance(saved_path, str) else ("", "", "")
    if not module_name or not qualname:
        raise ValueError(f"{path} records its class's import path as {saved_path!r}, not 'module:qualname'; {how}")
    found: Any = sys.modules.get(module_name)
    if found is None:
        raise ValueError(f"{path} holds a {saved}, defined in the module {module_name}, which is not imported "
                         f"(load_model never imports a module a file names: that could run its code); {how}")
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if not (isinstance(found, type) and issubclass(found, TransformerModel) and found.__name__ == saved):
        raise ValueError(f"{path} holds a {saved}, defined at {saved_path}, which is not a torchformer model class "
                         f"of that name there (renamed, moved, or defined inside a function?); {how}")
    return found


def _check_model_class(cls: Any, name: str) -> None:
    if not (isinstance(cls, type) and issubclass(cls, TransformerModel)):
        got = cls.__name__ if isinstance(cls, type) else repr(cls)
        raise TypeError(f"{name} must be a TransformerModel subclass (e.g. GTransformer), got {got}")


def _check_path(path: object, name: str) -> Path:
    """``path`` as a ``Path``; ``TypeError`` for other types, ``ValueError`` for ``""`` (the current folder)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path (str or os.PathLike), got {type(path).__name__} {path!r:.60}")
    if os.fspath(path) in ("", b""):
        raise ValueError(f"{name} must be a path, got an empty one (write '.' to mean the current folder)")
    return Path(path)


def _import_safetensors() -> Any:
    """``safetensors.torch``, an optional dependency: needed only for exported folders."""
    try:
        import safetensors.torch
    except ImportError as e:
        raise ImportError('exporting and loading model folders (model.safetensors + config.json) needs the '
                          'safetensors package: pip install "torchformer[safetensors]"') from e
    return safetensors.torch


def _read_export_config(
    directory: Path,
) -> tuple[Optional[str], TransformerConfig, Optional[str], Optional[str]]:
    """The class name, the config, the weights' SHA-256 and the class's import path (each ``None`` if not
    recorded) in ``directory/config.json``, written by :func:`export_model`."""
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
    recorded = data.get("config_sha256")  # absent in folders exported before it was recorded
    described = _architecture_digest(data.get("model_class"), data["config"], data.get("model_class_path"))
    if recorded is not None and recorded != described:
        raise ValueError(f"{file} was changed after export_model wrote it: its model_class or config no longer "
                         f"matches its config_sha256, so the weights could be read into another architecture (same "
                         f"shapes, other heads, say). Export the model again; to change it on purpose, also "
                         f"delete config_sha256")
    digest = data.get("weights_sha256")  # absent in folders exported by torchformer before it was recorded
    if digest is not None and not (isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)):
        raise ValueError(f"{file} has a weights_sha256 that is not a SHA-256 digest (64 hex digits): {digest!r:.80}")
    try:
        config = TransformerConfig.from_dict(data["config"])
    except (TypeError, ValueError) as e:
        raise ValueError(f"{file} holds a config this version of torchformer cannot read: {e}") from e
    return data.get("model_class"), config, digest, data.get("model_class_path")


def _architecture_digest(model_class: object, config: object, model_class_path: object = None) -> str:
    """SHA-256 of the class name, config and (when recorded) the class's import path as canonical JSON (sorted
    keys): what ``config.json`` describes. Folders exported before the path was recorded keep their digest."""
    described = {"model_class": model_class, "config": config}
    if model_class_path is not None:  # an edited path would lead load_model to another class
        described["model_class_path"] = model_class_path
    text = json.dumps(described, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _verify_weights(file: Path, expected: str) -> None:
    """Raise :class:`CheckpointError` naming ``file`` unless its SHA-256 is ``expected``."""
    received = file_sha256(file)
    if received != expected:
        raise CheckpointError(
            f"{file} is damaged: it is not the file export_model wrote (SHA-256 {received[:16]}..., {CONFIG_FILE} "
            f"records {expected[:16]}...); export the model again or restore the folder from a copy"
        )


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
    dtypes = {}
    for name, info in header.items():
        dtype = getattr(torch, _SAFETENSORS_FLOATS.get(info.get("dtype"), ""), None) if isinstance(info, dict) else None
        if isinstance(dtype, torch.dtype):
            dtypes[name] = dtype
    return dtypes


def _checkpoint_dtypes(path: Path) -> dict[str, torch.dtype]:
    """The dtype of every floating point weight in a checkpoint file (memory-mapped: the weights stay on disk)."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except Exception:  # noqa: BLE001 - load_checkpoint reads the file next and names what is wrong with it
        return {}
    state = ckpt.get("model", ckpt) if isinstance(ckpt, dict) else None
    if not isinstance(state, dict):
        return {}
    return {name: t.dtype for name, t in state.items() if isinstance(t, torch.Tensor) and t.is_floating_point()}


def _adopt_dtypes(model: nn.Module, dtypes: Mapping[str, torch.dtype]) -> None:
    """Give ``model``'s floating point parameters and buffers the saved ``dtypes`` (by name), before loading.

    Saved in one dtype (``model.half()``): the whole model is converted, buffers outside the state dict included,
    as ``.half()`` did. Saved in several: each named tensor (wrapper prefixes such as ``_orig_mod.`` ignored).
    """
    kinds = set(dtypes.values())
    if len(kinds) == 1:
        (dtype,) = kinds
        model.to(dtype)  # floating point tensors only: integer buffers keep their dtype
        return
    plain = {re.sub(r"^((_orig_mod|module)\.)+", "", name): dtype for name, dtype in dtypes.items()}
    tensors = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    for name, tensor in tensors:
        dtype = plain.get(name)
        if dtype is not None and tensor.is_floating_point() and tensor.dtype != dtype:
            tensor.data = tensor.data.to(dtype)


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
