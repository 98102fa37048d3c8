"""A trained model outside its training script: :func:`load_model` rebuilds it from its file.

A checkpoint file (:func:`~torchformer.train.checkpoint.save_checkpoint`) and an exported folder
(:func:`~torchformer.saving.export_model`) both hold the model's record, its class and
:class:`~torchformer.config.TransformerConfig` (:mod:`torchformer.saving`), next to its weights, so the model is
rebuilt from the file alone, in the dtype it was saved in (a ``model.half()`` stays float16)::

    model = load_model("runs/enwik8/step_00002000.pt")
    export_model(model, "exported/enwik8")                     # model.safetensors + config.json
    same = load_model("exported/enwik8")
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional, Union

import torch

from torchformer._checks import check_bool, check_finite_weights
from torchformer._devices import map_location_device
from torchformer._files import check_path
from torchformer.models import TransformerModel
from torchformer.saving import CONFIG_FILE, WEIGHTS_FILE, PathLike, load_exported, rebuild_model, resolve_model_class
from torchformer.train.checkpoint import load_checkpoint, read_checkpoint, read_payload


def load_model(path: PathLike, *, model_class: Optional[type[TransformerModel]] = None,
               classes: Optional[Mapping[str, type[TransformerModel]]] = None,
               map_location: Union[str, torch.device] = "cpu", check_finite: bool = True) -> TransformerModel:
    """The model saved at ``path``, rebuilt from its stored config, weights loaded, in ``eval()`` mode.

    Args:
        path: a checkpoint file written by :func:`~torchformer.train.checkpoint.save_checkpoint`, or a folder
            written by :func:`~torchformer.saving.export_model`.
        model_class: the class to build (``model_class.from_config(config)``): the saved class or a subclass of it.
            By default the saved class name is looked up in ``classes``, then where the file says it lives
            (:meth:`~torchformer.models.TransformerModel.import_path`, e.g. ``"my_variants:ParallelGPT"``) in a
            module already imported, then (files that record no path) in :data:`torchformer.models.MODEL_CLASSES`:
            a variant of your own loads without naming it once its module is imported (``load_model`` never
            imports a module a file names, which could run code).
        classes: more classes to look the saved name up in, ``{"MyGPT": MyGPT}``: a class whose recorded place is
            not imported, or that was moved or renamed since.
        map_location: the device of the returned model (``"cpu"``, ``"cuda"``, ``torch.device("cuda:1")``).
        check_finite: refuse weights that hold NaN or infinity (a run that diverged); ``False``: load them as they
            are (to inspect such a model, say).

    Returns:
        The model (a :class:`~torchformer.models.TransformerModel`), in ``eval()`` mode.

    The global random generators are left as they were (building a model draws its initial weights from them), so
    loading a model in the middle of a seeded script does not change its later random numbers. A folder needs the
    optional ``safetensors`` package (``pip install "torchformer[safetensors]"``); checkpoint files do not. The
    model's parameters and buffers get the dtypes of the saved weights (a model saved after ``.half()`` or
    ``.to(torch.bfloat16)`` loads as such, not as float32).

    Raises ``ValueError`` when the file holds no config (then build the model yourself and use
    :func:`~torchformer.train.checkpoint.load_checkpoint`), names a class that cannot be found, or holds weights
    that do not fit the config or (``check_finite``) hold NaN or infinity; :class:`~torchformer.saving.CheckpointError`
    (a ``ValueError``) naming the file when it is damaged (a checkpoint's digest, or an exported
    ``model.safetensors`` whose SHA-256 differs from the one in ``config.json``); ``TypeError`` for a
    ``model_class`` or ``classes`` that are not torchformer model classes.
    """
    path = check_path(path, "path")
    if path.is_dir():
        return load_exported(path, model_class=model_class, classes=classes, map_location=map_location,
                             check_finite=check_finite)
    check_bool(check_finite, "check_finite")
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint file or exported folder at {path}")
    if path.name in (WEIGHTS_FILE, CONFIG_FILE) and (path.parent / CONFIG_FILE).is_file():
        raise ValueError(f"{path} is one file of a folder written by export_model; pass the folder: "
                         f"load_model({str(path.parent)!r})")
    device = map_location_device(map_location)
    info = read_checkpoint(path)
    if info["config"] is None:
        raise ValueError(
            f"checkpoint {path} holds no model config (it was saved from a plain nn.Module or by an older "
            f"torchformer), so load_model cannot rebuild the model; build it yourself and call "
            f"load_checkpoint({str(path)!r}, model=model)"
        )
    cls = resolve_model_class(info["model_class"], model_class, classes, path, info["model_class_path"])
    model = rebuild_model(cls, info["config"], _checkpoint_dtypes(path))
    load_checkpoint(path, model=model, restore_rng=False)  # its digest, config and weight checks apply
    if check_finite:
        check_finite_weights(model, path)
    return model.to(device).eval()


def _checkpoint_dtypes(path: Path) -> dict[str, torch.dtype]:
    """The dtype of every floating point weight in a checkpoint file (memory-mapped: the weights stay on disk).

    Called after :func:`~torchformer.train.checkpoint.read_checkpoint` read the same file the same way, so it reads
    back, and its ``"model"`` is a state_dict (a bare state_dict file's too)."""
    state = read_payload(path, map_location="cpu", mmap=True, verify=False)["model"]
    return {name: t.dtype for name, t in state.items() if t.is_floating_point()}
