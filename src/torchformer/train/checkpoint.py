"""Checkpoints that survive crashes and resume a run exactly.

A checkpoint is one file holding everything needed to continue training as if it had never stopped:

* the model's ``state_dict`` (from the module behind any ``torch.compile`` / DataParallel wrapper, so the keys are
  the same whichever way the model was run), the optimizer and learning-rate scheduler states and the step counter,
* ``extra``: whatever the script needs to rebuild itself (config, vocabulary, best validation loss, ...),
* the state of every random number generator: Python's, NumPy's, torch's CPU and CUDA ones, and the named
  ``torch.Generator`` objects the script samples batches from. Without these a resumed run would draw different
  dropout masks and batches, and would not reproduce the uninterrupted run,
* for a :class:`~torchformer.models.TransformerModel`, its class name and config (:mod:`torchformer.saving`):
  loading into another architecture is an error naming the fields that differ, and
  :func:`~torchformer.train.loading.load_model` rebuilds the model from the file alone.

Three guarantees (docs/training.md, "Checkpoints", tells more):

* **Atomic writes.** A temporary file in the same folder, flushed and fsync'ed, is renamed over the target
  (``os.replace``): a crash or a full disk halfway through a save leaves the previous checkpoint untouched.
* **Damage is detected.** The file holds a SHA-256 digest of everything in it, which :func:`load_checkpoint`
  recomputes: a file changed after it was written is a :class:`CheckpointError` naming it, never a silently wrong
  model. :func:`latest_intact_checkpoint` resumes from the newest checkpoint that passes this check.
* **Safe loading.** ``torch.load(..., weights_only=True)`` runs no pickled code, so everything saved is tensors or
  plain containers of str/int/float/bool/None (Python's and NumPy's RNG states are converted on save and back on
  load), and ``save_checkpoint`` rejects an ``extra`` it could not load again, naming the offending entry.

Typical use::

    start = 0
    if (ckpt := latest_intact_checkpoint(run_dir)) is not None:
        start = load_checkpoint(ckpt, model=model, optimizer=opt, scheduler=sched, generators={"batches": g})["step"]
    for step in range(start, total_steps):
        ...
        if (step + 1) % every == 0:
            save_checkpoint(checkpoint_path(run_dir, step + 1), model=model, optimizer=opt, scheduler=sched,
                            step=step + 1, extra={"config": vars(args)}, generators={"batches": g})
"""

from __future__ import annotations

import collections
import errno
import hashlib
import os
import random
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any, Mapping, Optional

import numpy as np
import torch
from torch import Tensor, nn

from torchformer._checks import check_bool, check_positive_int, is_int
from torchformer._devices import check_map_location
from torchformer._files import check_file_path, is_stale, write_atomically
from torchformer.models import TransformerModel
from torchformer.saving import CheckpointError, PathLike, check_architecture, model_record, saved_config, unwrap_model

# 2: the payload holds an "integrity" digest (format 1 files, written before, load without the check).
# 3: the model's record has a config_version (torchformer 0.5: "rotary" pairs halves; see torchformer.saving), so
# that an older torchformer, which would read "rotary" in its old layout, refuses the file instead.
FORMAT_VERSION = 3
# Errors of the system, not of the file's content, when reading it: raised as they are, never called damage.
_SYSTEM_ERRNOS = (errno.EACCES, errno.EPERM, errno.EIO, errno.ENOMEM, errno.EMFILE, errno.ENFILE)
_NAME = re.compile(r"^step_([0-9]+)\.pt$")  # ASCII digits: \d would take "step_\u0663.pt" for step 3
# Temporary files of write_atomically: ".<target name>.tmp-<host>-<pid>-<random>" (see torchformer._files).
_TEMPORARY = re.compile(r"^\.(?P<target>.+)\.tmp-(?P<host>[A-Za-z0-9_]+)-(?P<pid>\d+)-[0-9a-f]+$")
# Wrappers prepend these to every state_dict key: torch.compile (OptimizedModule) and DataParallel/DDP.
_WRAPPER_PREFIXES = ("_orig_mod.", "module.")
# What torch.load(weights_only=True) accepts (on every torch version we support), besides tensors.
_SAFE_LEAVES = (type(None), bool, int, float, str, torch.dtype, torch.device)
_SAFE_CONTAINERS = (dict, collections.OrderedDict, list, tuple, torch.Size)
# How the messages about a checkpoint path that names a folder say to name a file in it (torchformer._files).
PATH_EXAMPLE = "checkpoint_path({folder}, step)"


class CheckpointVersionError(CheckpointError):
    """An intact checkpoint written by a newer torchformer (a higher format version): upgrade to read it.

    :func:`latest_intact_checkpoint` raises it rather than skip the file: the run would silently go back to an
    older step.
    """


def checkpoint_path(directory: PathLike, step: int) -> Path:
    """The conventional file name for the checkpoint at ``step``: ``directory/step_00001000.pt``.

    Args:
        directory: the run's checkpoint folder (it need not exist yet).
        step: the number of optimizer steps taken, a non-negative int; zero-padded to 8 digits (more are kept).

    Returns:
        The path of the file (nothing is created).

    Raises:
        ValueError: ``step`` is not a non-negative int.
    """
    return Path(directory) / f"step_{_check_step(step):08d}.pt"


def _checkpoints(directory: PathLike) -> list[Path]:
    """The ``step_N.pt`` files in ``directory``, oldest (smallest ``N``) first; none if there is no folder."""
    directory = Path(directory)
    if not directory.exists():
        return []
    if not directory.is_dir():
        raise NotADirectoryError(f"directory must be a folder of checkpoints, got the file {directory}")
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name)) and p.is_file()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(directory: PathLike) -> Optional[Path]:
    """The ``step_N.pt`` file in ``directory`` with the largest ``N``; ``None`` if there is none (or no folder).

    Steps are compared as numbers, so ``step_123456789.pt`` beats ``step_99999999.pt``. Temporary files of an
    interrupted save (hidden names) and other files are ignored. The file is not read: it may be damaged
    (:func:`latest_intact_checkpoint` checks).

    Args:
        directory: the run's checkpoint folder.

    Returns:
        The path of the newest checkpoint, or ``None``.

    Raises:
        NotADirectoryError: ``directory`` is a file.
    """
    found = _checkpoints(directory)
    return found[-1] if found else None


def latest_intact_checkpoint(directory: PathLike, *, set_aside: bool = False) -> Optional[Path]:
    """The newest ``step_N.pt`` in ``directory`` that reads back whole and passes its integrity check.

    This is where a run resumes: a crash can leave the newest checkpoint damaged (a disk that lost the end of a
    file, a bad copy of the folder), and the one before it is then the right place to continue. Each skipped file
    gets a ``UserWarning`` naming it and saying why. Each candidate is read in full to check it, once.

    A run that resumes there must set the damaged files aside (``set_aside=True``): they carry higher step numbers
    than the checkpoints it will write, so :func:`prune_checkpoints`, which keeps the highest numbers, would delete
    the new, intact checkpoints and keep the damaged ones. In a run of several processes only the main one should
    pass it.

    Args:
        directory: the run's checkpoint folder.
        set_aside: rename each damaged checkpoint newer than the one returned to ``<name>.damaged`` (kept for a
            look, no longer a checkpoint).

    Returns:
        The path of the newest intact checkpoint; ``None`` when the folder holds no intact checkpoint (or no
        checkpoint, or does not exist).

    Raises:
        NotADirectoryError: ``directory`` is a file.
        CheckpointVersionError: the newest checkpoint is intact but written by a newer torchformer.
        OSError: the system could not read a checkpoint (permissions, an I/O error): nothing is set aside.
        TypeError: ``set_aside`` is not a bool.
    """
    check_bool(set_aside, "set_aside")
    for path in reversed(_checkpoints(directory)):
        try:
            verify_checkpoint(path)
        except FileNotFoundError:  # another process set it aside or pruned it while this one looked
            continue
        except CheckpointVersionError:
            raise  # intact, only newer than this torchformer: not to be skipped (the run would go back) nor set aside
        except CheckpointError as e:
            note = ""
            if set_aside:
                damaged = path.with_name(path.name + ".damaged")
                os.replace(path, damaged)
                note = f" (renamed {damaged.name}, so that the checkpoints of the resumed run replace it)"
            warnings.warn(f"skipping a damaged checkpoint: {e}{note}", stacklevel=2)
            continue
        return path
    return None


def prune_checkpoints(directory: PathLike, *, keep: int = 2) -> list[Path]:
    """Delete all but the ``keep`` newest ``step_N.pt`` files in ``directory``; return the deleted paths.

    The stale temporary files of interrupted saves go too (:func:`remove_stale_temporaries`). Keeping more than one
    checkpoint guards against one that turns out to be bad; keeping all of a long GPU run's checkpoints (hundreds of
    MB each) fills the disk.

    Args:
        directory: the run's checkpoint folder; a missing folder deletes nothing.
        keep: how many of the newest checkpoints stay, at least 1.

    Returns:
        The deleted checkpoints, oldest first, then the deleted temporary files.

    Raises:
        ValueError: ``keep`` is not a positive int.
        NotADirectoryError: ``directory`` is a file.
    """
    check_positive_int(keep, "keep")
    old = _checkpoints(directory)[:-keep]
    for path in old:
        path.unlink()
    return old + remove_stale_temporaries(directory)


def remove_stale_temporaries(directory: PathLike) -> list[Path]:
    """Delete the temporary files that saves interrupted by a crash or a kill left in ``directory``; return them.

    :func:`~torchformer._files.write_atomically` names its temporary file ``.<name>.tmp-<host>-<pid>-<random>``.
    A file written on this machine is stale when its process no longer runs; any file when nobody wrote to it for a
    day (the only rule for files of another machine sharing the folder, whose processes we cannot see). The
    temporary file of a save still in progress is never touched.

    Args:
        directory: the folder to clean; nothing happens when it is not a folder.

    Returns:
        The deleted files (a file that another process removes first is skipped).
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    removed = []
    for path in directory.iterdir():
        match = _TEMPORARY.match(path.name)
        try:
            if match is None or not path.is_file() or not is_stale(match["host"], int(match["pid"]),
                                                                   path.stat().st_mtime):
                continue
            path.unlink()
        except OSError:  # its writer just renamed it, or another process cleans up at the same time
            continue
        removed.append(path)
    return removed


def save_checkpoint(path: PathLike, *, model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                    scheduler: Optional[Any] = None, step: int, extra: Optional[Mapping[str, Any]] = None,
                    generators: Optional[Mapping[str, torch.Generator]] = None) -> Path:
    """Atomically write a checkpoint to ``path`` (parent folders are created) and return the path.

    ``extra`` must hold only tensors and (nested) dicts/lists/tuples of str/int/float/bool/None; convert dataclasses
    with ``dataclasses.asdict`` and NumPy scalars with ``.item()``. For a :class:`~torchformer.models.TransformerModel`
    the checkpoint also holds ``"model_class"`` (its class name), ``"model_class_path"`` (where to import it from,
    :meth:`~torchformer.models.TransformerModel.import_path`) and ``"config"`` (``model.config.to_dict()``).

    Args:
        path: the file to write (e.g. :func:`checkpoint_path`); an existing file is replaced.
        model: the model, wrapped or not: the weights are those of the module behind any wrapper
            (:func:`~torchformer.saving.unwrap_model`).
        optimizer: the optimizer whose state to save; ``None``: none.
        scheduler: the learning-rate scheduler (anything with ``state_dict()``) whose state to save; ``None``: none.
        step: the number of optimizer steps taken so far (the step to resume from), a non-negative int.
        extra: anything else the script needs to resume (plain data, see above); ``None``: an empty dict.
        generators: named ``torch.Generator`` objects whose states to save (e.g. ``{"batches": g}``); the global
            generators of Python, NumPy and torch's CPU are always saved, CUDA's once CUDA is in use.

    Returns:
        ``path``, as a :class:`~pathlib.Path`.

    Raises:
        TypeError: ``path`` is not a str or path, ``extra`` is not a dict, holds something that
            ``torch.load(weights_only=True)`` would refuse (the message names the entry), or ``generators`` is not a
            dict of ``torch.Generator``.
        ValueError: ``step`` is not a non-negative int, or ``path`` names no file.
        IsADirectoryError: ``path`` is a folder.
        NotADirectoryError: a parent of ``path`` is a file.
    """
    path = check_file_path(path, "path", example=PATH_EXAMPLE)
    target = unwrap_model(model)
    payload = build_payload(
        target, target.state_dict(), optimizer, None if optimizer is None else optimizer.state_dict(), scheduler,
        step=step, extra=extra, generators=generators,
    )
    return write_payload(path, payload)


def build_payload(target: nn.Module, model_state: Mapping[str, torch.Tensor],
                  optimizer: Optional[torch.optim.Optimizer], optimizer_state: Optional[Mapping[str, Any]],
                  scheduler: Optional[Any], *, step: int, extra: Optional[Mapping[str, Any]],
                  generators: Optional[Mapping[str, torch.Generator]]) -> dict:
    """What a checkpoint file holds, from the states already taken.

    :func:`save_checkpoint` takes ``model_state`` from the unwrapped ``target`` and ``optimizer_state`` from
    ``optimizer``; :mod:`torchformer.train.distributed_checkpoint` gathers them from all processes first. A bad
    ``extra``, ``generators`` or ``step`` raises the ``TypeError`` or ``ValueError`` that :func:`save_checkpoint` lists.

    Args:
        target: the unwrapped model (a :class:`~torchformer.models.TransformerModel`'s class and config are stored).
        model_state: the model's ``state_dict``.
        optimizer: the optimizer, for its class name; ``None``: no optimizer state.
        optimizer_state: the optimizer's ``state_dict``, or ``None``.
        scheduler: the learning-rate scheduler whose ``state_dict()`` and class name to store; ``None``: none.
        step: the number of optimizer steps taken so far, a non-negative int.
        extra: the script's own data, or ``None``.
        generators: named ``torch.Generator`` objects whose states to store, or ``None``.

    Returns:
        The payload: a dict with the format version, step, model, optimizer and scheduler states (and classes),
        extra, the global random states and the generators' states. It is not yet checked to be loadable.
    """
    if extra is not None and not isinstance(extra, Mapping):
        raise TypeError(f"extra must be a dict (or None), got {type(extra).__name__}")
    payload = {
        "format_version": FORMAT_VERSION,
        "step": _check_step(step),
        "model": model_state,
        "optimizer": optimizer_state,
        # The classes, so that loading Adam's state into SGD (which would fail at its first step) is refused.
        "optimizer_class": None if optimizer is None else type(optimizer).__name__,
        "scheduler": None if scheduler is None else scheduler.state_dict(),
        "scheduler_class": None if scheduler is None else type(scheduler).__name__,
        "extra": {} if extra is None else dict(extra),
        "rng": capture_rng_state(),
        "generators": generator_states(generators),
    }
    if isinstance(target, TransformerModel):  # class name, import path and config: plain data that rebuilds it
        payload.update(model_record(target))
    return payload


def generator_states(generators: Optional[Mapping[str, torch.Generator]]) -> dict:
    """``{name: state}`` of the named generators (checked).

    Args:
        generators: a dict of names to ``torch.Generator`` objects, or ``None``.

    Returns:
        Each generator's state (a CPU byte tensor, ``g.get_state()``) under its name; empty for ``None``.

    Raises:
        TypeError: ``generators`` is not a dict of str names to ``torch.Generator`` objects.
    """
    return {name: g.get_state() for name, g in _check_generators(generators).items()}


def write_payload(path: Path, payload: dict) -> Path:
    """Check that ``payload`` loads with ``weights_only=True``, add its integrity digest, write it atomically.

    Args:
        path: the file to write (checked by the caller); an existing file is replaced.
        payload: what :func:`build_payload` built.

    Returns:
        ``path``.

    Raises:
        TypeError: the payload holds something ``torch.load(weights_only=True)`` would refuse; the message names
            the entry.
    """
    _check_loadable(payload, "checkpoint")
    payload = {**payload, "integrity": {"sha256": _digest(payload)}}  # last: it covers everything above

    def write(tmp: Path) -> None:
        with open(tmp, "xb") as f:
            try:
                torch.save(payload, f)
            except RuntimeError as e:  # torch's zip writer reports a failed write (a full disk) as RuntimeError
                if not isinstance(e.__context__, OSError):
                    raise
                raise e.__context__ from e

    return write_atomically(path, write)


def load_checkpoint(path: PathLike, *, model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                    scheduler: Optional[Any] = None, generators: Optional[Mapping[str, torch.Generator]] = None,
                    map_location: Any = "cpu", restore_rng: bool = True) -> dict:
    """Load ``path`` into ``model`` (and the optimizer, scheduler and generators given); return step and extra.

    ``model`` may be wrapped (``torch.compile``, DataParallel): the weights go into the module behind the wrapper. Keys
    saved from a wrapped model by other code (prefixed ``_orig_mod.`` or ``module.``) are accepted too. A plain
    ``state_dict`` file (not written by :func:`save_checkpoint`) loads as weights only, with step 0.

    When the checkpoint holds a config and ``model`` is a :class:`~torchformer.models.TransformerModel`, the two
    configs must agree in every field except the training-time ones (:data:`~torchformer.saving.TRAINING_ONLY_FIELDS`:
    ``dropout``, ``impl``, ``checkpoint_blocks``): they do not change what the weights mean, and a model is routinely
    evaluated with dropout 0, on the reference attention path, or without activation checkpointing. Other modules
    are checked by their weights' keys and shapes. Nothing is changed unless everything fits.

    Args:
        path: the checkpoint file (e.g. from :func:`latest_intact_checkpoint`).
        model: the model to load the weights into, wrapped or not.
        optimizer: an optimizer to restore, built over the same parameters in the same order; ``None``: not
            restored. The checkpoint must then hold an optimizer state of the same class.
        scheduler: a learning-rate scheduler to restore, of the saved class; ``None``: not restored.
        generators: named ``torch.Generator`` objects to restore (whatever ``restore_rng`` says); each name must be
            in the checkpoint.
        map_location: where the tensors are loaded, as ``torch.load`` takes it (default ``"cpu"``; the weights then
            move to the model's device as they are copied in).
        restore_rng: also restore the global generators (Python, NumPy, torch CPU and CUDA), so the run continues
            with the same random numbers.

    Returns:
        ``{"step": int, "extra": dict}``: the step to resume from, and what the script saved in ``extra``.

    Raises:
        FileNotFoundError: there is no file at ``path``.
        IsADirectoryError: ``path`` is a folder (:func:`latest_checkpoint` finds the newest file in one).
        CheckpointError: the file is empty, truncated, damaged (its integrity digest does not match or is missing)
            or not a checkpoint; :class:`CheckpointVersionError` when a newer torchformer wrote it.
        OSError: the system could not read it (permissions, an I/O error): the file itself may be fine.
        TypeError: ``restore_rng`` is not a bool.
        ValueError: the checkpoint's architecture differs from the model's (naming every differing field with both
            values), its weights do not fit the model (listing the missing, unexpected and mis-shaped keys), it
            lacks a requested state, or ``map_location`` names a device this machine lacks.
    """
    path = Path(path)
    check_map_location(map_location)
    check_bool(restore_rng, "restore_rng")  # "no" would be truthy
    ckpt = read_payload(path, map_location=map_location, mmap=False, verify=True)

    # Check everything before changing anything, so a bad checkpoint leaves the run as it was.
    target = unwrap_model(model)
    state = check_payload(ckpt, path, target, optimizer=optimizer, scheduler=scheduler, generators=generators)
    if restore_rng and "rng" in ckpt:
        _check_rng_state(ckpt["rng"], path)

    target.load_state_dict(state)
    for name, obj in {"optimizer": optimizer, "scheduler": scheduler}.items():
        if obj is not None:
            obj.load_state_dict(ckpt[name])
    for name, g in _check_generators(generators).items():  # each name is in the checkpoint (check_payload)
        g.set_state(ckpt["generators"][name].cpu())  # generator states are CPU byte tensors, even for CUDA generators
    if restore_rng and "rng" in ckpt:
        restore_rng_state(ckpt["rng"])
    return {"step": int(ckpt.get("step", 0)), "extra": ckpt.get("extra", {})}


def check_payload(ckpt: Mapping[str, Any], path: Path, target: nn.Module, *, optimizer: Optional[torch.optim.Optimizer],
                  scheduler: Optional[Any], generators: Optional[Mapping[str, torch.Generator]]) -> dict:
    """Everything :func:`load_checkpoint` checks before it changes anything.

    Args:
        ckpt: the payload read from the file.
        path: the file, for the messages.
        target: the unwrapped model the weights are for.
        optimizer: the optimizer to be restored, or ``None``.
        scheduler: the scheduler to be restored, or ``None``.
        generators: the named generators to be restored, or ``None``.

    Returns:
        The model's ``state_dict`` from the checkpoint, with any wrapper prefixes (``_orig_mod.``, ``module.``)
        stripped, ready for ``target.load_state_dict``.

    Raises:
        ValueError: naming what does not fit: another architecture or model class, missing, unexpected or
            mis-shaped weights, a missing or different optimizer or scheduler state, a generator not saved.
    """
    check_architecture(saved_config(ckpt, f"checkpoint {path}"), ckpt.get("model_class"), target, f"checkpoint {path}")
    state = _match_state_dict(ckpt["model"], target, path)
    for name, obj in {"optimizer": optimizer, "scheduler": scheduler}.items():
        if obj is None:
            continue
        if ckpt.get(name) is None:
            raise ValueError(f"{name} was given but the checkpoint {path} holds no {name} state")
        saved_class = ckpt.get(f"{name}_class")  # absent in checkpoints written before 0.3
        if saved_class is not None and saved_class != type(obj).__name__:
            raise ValueError(f"checkpoint {path} holds the state of a {saved_class} {name}, but the {name} given is "
                             f"a {type(obj).__name__}; use a {saved_class}, or leave the {name} out")
    if optimizer is not None:
        check_optimizer_groups(ckpt["optimizer"], optimizer, path)
    saved = ckpt.get("generators", {})
    for name in _check_generators(generators):
        if name not in saved:
            raise ValueError(f"generators[{name!r}] is not in the checkpoint {path}; it has {sorted(saved)}")
    return state


def read_checkpoint(path: PathLike) -> dict:
    """What a checkpoint file holds besides its weights, without loading the weights into memory.

    ``config`` and ``model_class`` are ``None`` for a checkpoint of a plain ``nn.Module`` (or a bare
    ``state_dict``). The file is read with ``torch.load(..., weights_only=True, mmap=True)``: the tensors are
    mapped, not read, so this is cheap even for a checkpoint of many gigabytes; for the same reason the weights'
    integrity is not checked here (:func:`verify_checkpoint` does that, and :func:`load_checkpoint` always does).

    Args:
        path: the checkpoint file.

    Returns:
        ``{"step": int, "extra": dict, "config": TransformerConfig or None, "model_class": str or None,
        "model_class_path": str or None}``.

    Raises:
        FileNotFoundError: there is no file at ``path``.
        IsADirectoryError: ``path`` is a folder.
        CheckpointError: the file is empty, truncated, or not a checkpoint (the message names it).
        ValueError: the stored config cannot be read by this version of torchformer.
    """
    path = Path(path)
    ckpt = read_payload(path, map_location="cpu", mmap=True, verify=False)
    return {
        "step": int(ckpt.get("step", 0)),
        "extra": ckpt.get("extra", {}),
        "config": saved_config(ckpt, f"checkpoint {path}"),
        "model_class": ckpt.get("model_class"),
        "model_class_path": ckpt.get("model_class_path"),  # absent in checkpoints written before 0.5
    }


def verify_checkpoint(path: PathLike) -> None:
    """Check that ``path`` is a whole, undamaged checkpoint; raise :class:`CheckpointError` naming it if not.

    Reads every tensor (memory-mapped) and recomputes the SHA-256 digest that :func:`save_checkpoint` stored. A
    checkpoint written before torchformer 0.3 holds no digest: it passes if it reads back. So does a bare
    ``state_dict`` saved by other code.

    Args:
        path: the checkpoint file.

    Raises:
        FileNotFoundError: there is no file at ``path``.
        IsADirectoryError: ``path`` is a folder.
        CheckpointError: the file is empty, truncated, damaged, or not a checkpoint.
    """
    read_payload(Path(path), map_location="cpu", mmap=True, verify=True)


def check_optimizer_groups(saved: Mapping[str, Any], optimizer: torch.optim.Optimizer, path: Path) -> None:
    """Refuse a saved optimizer state that does not fit ``optimizer``'s parameter groups, before anything is loaded.

    These are the checks ``Optimizer.load_state_dict`` makes, which raises only after the model's weights would
    already have changed, plus one it cannot make: a state tensor with another parameter's shape (the optimizer was
    built over the same parameters in another order).

    Args:
        saved: the saved ``optimizer.state_dict()``.
        optimizer: the optimizer about to be restored.
        path: the checkpoint, for the messages.

    Raises:
        ValueError: the groups' sizes differ, or a state tensor has the shape of another parameter of its group.
    """
    groups, saved_groups = optimizer.param_groups, saved.get("param_groups", [])
    sizes = [len(g["params"]) for g in groups]
    saved_sizes = [len(g["params"]) for g in saved_groups]
    if sizes != saved_sizes:
        raise ValueError(f"checkpoint {path} holds optimizer state for parameter groups of sizes {saved_sizes}, but "
                         f"the optimizer has groups of sizes {sizes}: build it over the same parameters, in the same "
                         f"order")
    # State is matched to parameters by position. Another order is refused where a state tensor does not broadcast
    # to its parameter (Adam's moments have its shape, Adafactor's factored ones 1 in a dimension) but has another
    # parameter's shape. Other state (L-BFGS's flat vectors) has shapes of its own; parameters of one shape swapped
    # among themselves cannot be told apart. State keyed by names (save_distributed_checkpoint's) is matched by name.
    state = saved.get("state", {})
    for g, (group, saved_group) in enumerate(zip(groups, saved_groups)):
        shapes = {tuple(p.shape) for p in group["params"]}
        for i, (param, key) in enumerate(zip(group["params"], saved_group["params"])):
            if isinstance(key, str):
                continue
            for name, value in state.get(key, {}).items() if isinstance(state.get(key), Mapping) else ():
                if (isinstance(value, Tensor) and value.dim() == param.dim() > 0
                        and any(v not in (1, p) for v, p in zip(value.shape, param.shape))
                        and tuple(value.shape) in shapes):
                    raise ValueError(
                        f"checkpoint {path} holds optimizer state {name!r} of shape {tuple(value.shape)} for "
                        f"parameter {i} of group {g}, whose shape is {tuple(param.shape)}: build the optimizer over "
                        f"the same parameters, in the same order")


def _check_step(step: object) -> int:
    if not is_int(step) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    return step


def _check_generators(generators: object) -> dict:
    if generators is None:
        return {}
    if not isinstance(generators, Mapping):
        raise TypeError(f"generators must be a dict of name -> torch.Generator, got {type(generators).__name__}")
    for name, g in generators.items():
        if not isinstance(name, str) or not isinstance(g, torch.Generator):
            raise TypeError(
                f"generators must map str names to torch.Generator objects, got {name!r}: {type(g).__name__}"
            )
    return dict(generators)


def _check_loadable(obj: Any, where: str) -> None:
    """Raise TypeError, naming the entry, for anything ``torch.load(weights_only=True)`` would refuse."""
    if isinstance(obj, torch.Tensor):
        if obj.is_meta or obj.layout != torch.strided:
            kind = "a meta tensor (no data)" if obj.is_meta else f"a {obj.layout} tensor"
            raise TypeError(f"cannot save {where}: it is {kind}; checkpoints hold dense tensors with data "
                            f"(e.g. x.to_dense(), or materialise the model with to_empty() and initialise it)")
        return
    if type(obj) in _SAFE_LEAVES:
        return
    if type(obj) not in _SAFE_CONTAINERS:
        raise TypeError(
            f"cannot save {where} of type {type(obj).__module__}.{type(obj).__qualname__}: checkpoints are "
            f"loaded with torch.load(weights_only=True), which accepts only tensors and dicts/lists/tuples of "
            f"str/int/float/bool/None; convert it first (e.g. int(x), x.item(), dataclasses.asdict(config))"
        )
    if isinstance(obj, dict):
        for key, value in obj.items():
            _check_loadable(key, f"a key of {where}")
            _check_loadable(value, f"{where}[{key!r}]")
    else:
        for i, value in enumerate(obj):
            _check_loadable(value, f"{where}[{i}]")


def _match_state_dict(state: Mapping[str, torch.Tensor], target: nn.Module, path: Path) -> dict:
    """Strip wrapper prefixes from ``state``'s keys and check that they fit ``target`` exactly."""
    expected = target.state_dict()
    state = dict(state)
    stripped = True
    while stripped:  # prefixes can be stacked, e.g. "_orig_mod.module."
        stripped = False
        for prefix in _WRAPPER_PREFIXES:
            if state and all(k.startswith(prefix) for k in state) and not all(k.startswith(prefix) for k in expected):
                state = {k[len(prefix):]: v for k, v in state.items()}
                stripped = True

    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    mis_shaped = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and state[k].shape != v.shape
    ]
    if missing or unexpected or mis_shaped:
        problems = [
            f"{label} ({len(keys)}): {_short_list(keys)}"
            for label, keys in (
                ("missing keys, in the model but not the checkpoint", missing),
                ("unexpected keys, in the checkpoint but not the model", unexpected),
                ("shape mismatches", mis_shaped),
            )
            if keys
        ]
        raise ValueError(f"checkpoint {path} does not fit the {type(target).__name__} model: " + "; ".join(problems))
    return state


def _short_list(items: list, limit: int = 10) -> str:
    shown = ", ".join(map(str, items[:limit]))
    return shown + (f", ... and {len(items) - limit} more" if len(items) > limit else "")


def _numpy_to_plain(obj: Any) -> Any:
    # NumPy's state holds an ndarray and NumPy ints; weights_only loading accepts neither.
    if isinstance(obj, np.ndarray):
        return {"ndarray": obj.tolist(), "dtype": str(obj.dtype)}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k: _numpy_to_plain(v) for k, v in obj.items()}
    return obj


def _plain_to_numpy(obj: Any) -> Any:
    if isinstance(obj, dict):
        if set(obj) == {"ndarray", "dtype"}:
            return np.asarray(obj["ndarray"], dtype=obj["dtype"])
        return {k: _plain_to_numpy(v) for k, v in obj.items()}
    return obj


def capture_rng_state() -> dict:
    """The states of the global random number generators, in a form ``torch.load(weights_only=True)`` reads back.

    Python's ``random``, NumPy's global generator, torch's CPU generator and, once CUDA is in use, every visible GPU's.

    Returns:
        ``{"python": ..., "numpy": ..., "torch_cpu": ..., "torch_cuda": [...]}``, for :func:`restore_rng_state`.
    """
    version, internal, gauss_next = random.getstate()
    return {
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
        "numpy": _numpy_to_plain(np.random.get_state(legacy=False)),
        "torch_cpu": torch.get_rng_state(),
        # One state per visible GPU. Empty when CUDA was never initialised: then no CUDA random numbers were
        # drawn, and asking for the states would needlessly create a context on every GPU.
        "torch_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
    }


def _check_rng_state(state: Any, path: Path) -> None:
    """Raise CheckpointError unless ``state`` restores: tried on throwaway generators, so nothing changes yet."""
    try:
        py = state["python"]
        random.Random().setstate((py["version"], tuple(py["internal"]), py["gauss_next"]))
        np.random.RandomState().set_state(_plain_to_numpy(state["numpy"]))
        torch.Generator().set_state(state["torch_cpu"].cpu())
        list(state["torch_cuda"])
    except Exception as e:  # noqa: BLE001 - a hand-made or damaged entry fails in many ways
        raise CheckpointError(f"checkpoint {path} is damaged: its random number generator states do not restore "
                              f"({type(e).__name__}: {e}); pass restore_rng=False to load it without them") from e


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Set the global random number generators to ``state``, so the run draws the numbers it would have drawn.

    A run resumed on fewer GPUs restores those it has; on a machine without CUDA the GPUs' states are skipped.

    Args:
        state: what :func:`capture_rng_state` returned (possibly saved and loaded again).
    """
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss_next"]))
    np.random.set_state(_plain_to_numpy(state["numpy"]))
    torch.set_rng_state(state["torch_cpu"].cpu())  # map_location may have moved it; RNG states live on the CPU
    if torch.cuda.is_available():
        for index, cuda_state in enumerate(state["torch_cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state.cpu(), index)


def read_payload(path: Path, *, map_location: Any, mmap: bool, verify: bool) -> dict:
    """The dict in the checkpoint file ``path`` (a bare ``state_dict`` becomes ``{"step": 0, "model": ...}``).

    Every way a file can fail to be a checkpoint (empty, truncated, random bytes, pickled objects, bytes changed
    after writing) becomes one :class:`CheckpointError` naming the file, instead of whichever pickle, zip, EOF or
    OS error torch.load happens to raise, or silently wrong weights.

    Args:
        path: the checkpoint file.
        map_location: where the tensors are loaded, as ``torch.load`` takes it.
        mmap: map the tensors instead of reading them (files in torch's zip format; others are read whole).
        verify: recompute the integrity digest and compare it with the stored one.

    Returns:
        The checkpoint's entries (``"model"``, ``"step"``, ``"extra"``, ...), the integrity record removed.

    Raises:
        FileNotFoundError: there is no file at ``path``.
        IsADirectoryError: ``path`` is a folder.
        CheckpointError: the file is empty, truncated, damaged or not a checkpoint;
            :class:`CheckpointVersionError` when a newer torchformer wrote it.
        OSError: the system could not read it (permissions, an I/O error): the file itself may be fine.
    """
    if path.is_dir():
        raise IsADirectoryError(f"expected a checkpoint file, got the folder {path} (latest_checkpoint(folder) finds "
                                f"the newest checkpoint in a folder)")
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file at {path}")
    if path.stat().st_size == 0:
        raise CheckpointError(f"checkpoint {path} is an empty file (an interrupted copy?), not a checkpoint")
    # mmap needs torch's zip format; files in the legacy format (torch.save before 1.6) are read whole.
    mmap = mmap and zipfile.is_zipfile(path)
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as e:  # noqa: BLE001 - bad content raises pickle, zip, EOF, key and even OS errors
        if isinstance(e, MemoryError) or (isinstance(e, OSError) and e.errno in _SYSTEM_ERRNOS):
            raise  # the file may be fine: the system could not read it (permissions, I/O, memory)
        raise CheckpointError(f"checkpoint {path} is damaged (truncated?) or not a checkpoint: "
                              f"torch.load(weights_only=True) failed with {_load_error(e)}") from e
    if not isinstance(ckpt, dict):
        raise CheckpointError(f"{path} does not hold a checkpoint (a dict), it holds a {type(ckpt).__name__}")
    if "model" not in ckpt:
        if not ckpt or not all(isinstance(v, torch.Tensor) for v in ckpt.values()):
            raise CheckpointError(
                f"{path} is neither a checkpoint nor a state_dict; its keys are {_short_list(list(ckpt))}")
        ckpt = {"step": 0, "model": ckpt, "extra": {}}  # a bare state_dict saved by someone else
    model_state = ckpt["model"]
    if not isinstance(model_state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                    for k, v in model_state.items()):
        raise CheckpointError(f"checkpoint {path} is damaged or not a checkpoint: its 'model' must be a state_dict "
                              f"(names -> tensors), got {type(model_state).__name__} {model_state!r:.60}")
    version = ckpt.get("format_version", 1)  # files of torchformer before 0.3 have none
    if not is_int(version) or version < 1:
        raise CheckpointError(f"checkpoint {path} is damaged: its format_version is {version!r}, not a positive int")
    if version > FORMAT_VERSION:
        raise CheckpointVersionError(f"checkpoint {path} has format {version}, written by a newer torchformer; this "
                                     f"one reads formats up to {FORMAT_VERSION}: upgrade torchformer to load it")
    integrity = ckpt.pop("integrity", None)
    if verify and integrity is None and version >= 2:  # format 2 always stores its digest
        raise CheckpointError(f"checkpoint {path} is damaged: it has format {version} but no integrity record, which "
                              f"every file of that format has (removed or edited by hand?)")
    if verify and integrity is not None:
        expected = integrity.get("sha256") if isinstance(integrity, dict) else None
        if not isinstance(expected, str):
            raise CheckpointError(f"checkpoint {path} is damaged: its integrity record is unreadable ({integrity!r})")
        received = _digest(ckpt)
        if received != expected:
            raise CheckpointError(
                f"checkpoint {path} is damaged: its content changed after it was written (SHA-256 {received[:16]}..., "
                f"stored {expected[:16]}...); resume from an older checkpoint (latest_intact_checkpoint) or a backup")
    return ckpt


def _digest(payload: Mapping[str, Any]) -> str:
    """SHA-256 of a checkpoint's content: every tensor's dtype, shape and bytes, and every plain value, in order.

    Hashing the content rather than the file lets the digest live inside the file it checks. Dicts keep their
    order through torch.save/torch.load, so the same walk on the loaded payload sees the same sequence.
    """
    h = hashlib.sha256()

    def walk(obj: Any) -> None:
        if isinstance(obj, torch.Tensor):
            t = obj.detach().to("cpu").contiguous()  # a no-op for the CPU tensors of a checkpoint
            h.update(f"tensor {t.dtype} {tuple(t.shape)};".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy())  # the raw bytes, whatever the dtype (bf16 too)
        elif isinstance(obj, dict):
            h.update(f"dict {len(obj)};".encode())
            for key, value in obj.items():
                walk(key)
                walk(value)
        elif isinstance(obj, (list, tuple)):  # torch.Size included
            h.update(f"{type(obj).__name__} {len(obj)};".encode())
            for value in obj:
                walk(value)
        else:  # None, bool, int, float, str, torch.dtype, torch.device: repr is exact (floats round-trip)
            h.update(f"{type(obj).__name__} {obj!r};".encode())

    walk(payload)
    return h.hexdigest()


def _load_error(error: Exception) -> str:
    """The useful line of a torch.load error: weights_only errors bury it under advice on loading unsafely."""
    message = str(error)
    if "WeightsUnpickler error:" in message:
        message = message.split("WeightsUnpickler error:", 1)[1].strip().split("\n\n", 1)[0]
    message = " ".join(message.split())
    return f"{type(error).__name__}: {message[:200] + '...' if len(message) > 200 else message}"
