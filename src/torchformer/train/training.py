"""The small pieces every training script needs, written once.

The example scripts (character-level generation on enwik8, classification on IMDb) share these:

* :func:`resolve_device` and :func:`autocast`: pick the device, and run the forward pass in bfloat16 on GPUs.
* :func:`warmup_cosine`: the learning-rate schedule transformers are usually trained with;
  :func:`warmup_stable_decay` the speedruns' (a constant rate, then a linear decay at the end).
* :func:`set_seed` and :func:`count_parameters`.
* :class:`CSVLogger`, :func:`plot_curves` and :func:`progress`: record, draw and watch the training curves.
* :func:`check_finite_losses`: stop a diverged run with a message that names the step and the usual remedies.
* :class:`CheckpointClock`: save by wall time as well as by steps, so a killed run loses minutes, not an epoch.
* Checkpointing (:func:`save_checkpoint`, :func:`load_checkpoint`, :func:`latest_checkpoint`,
  :func:`latest_intact_checkpoint`) lives in :mod:`torchformer.train.checkpoint`, :func:`unwrap_model` and
  :class:`CheckpointError` in :mod:`torchformer.saving`; they are re-exported here.

Only torch and numpy are required. tqdm and matplotlib are used when installed; without them :func:`progress`
falls back to a plain iterator and :func:`plot_curves` returns ``False``.
"""

from __future__ import annotations

import contextlib
import csv
import math
import numbers
import os
import random
import textwrap
import time
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterable, Iterator, Mapping, Optional, Sequence, Union

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from torchformer._checks import check_bool, is_int, is_number, is_real
from torchformer._devices import parse_device, resolve_named_device
from torchformer._files import check_file_path, check_png_path, write_atomically
from torchformer.saving import CheckpointError, PathLike, unwrap_model
from torchformer.train.checkpoint import (
    checkpoint_path, latest_checkpoint, latest_intact_checkpoint, load_checkpoint, prune_checkpoints, save_checkpoint,
)

__all__ = [
    "CSVLogger", "CheckpointClock", "CheckpointError", "TrainingDiverged", "autocast", "check_finite_losses",
    "checkpoint_path", "count_parameters", "latest_checkpoint", "latest_intact_checkpoint", "load_checkpoint",
    "plot_curves", "progress", "prune_checkpoints", "resolve_device", "save_checkpoint", "set_seed", "unwrap_model",
    "warmup_cosine", "warmup_stable_decay",
]

def resolve_device(device: Union[str, torch.device, None] = None) -> torch.device:
    """``None`` or ``"auto"``: CUDA if available, else CPU. Otherwise the named device, checked to exist.

    Args:
        device: a device name (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"auto"``; case and surrounding spaces
            ignored), a ``torch.device``, or ``None`` (the same as ``"auto"``).

    Returns:
        The device, checked to exist on this machine.

    Raises:
        ValueError: naming the device: unknown names (``"gpu"``), devices this machine lacks (``"cuda"`` without a
            GPU, ``"cuda:3"`` with two GPUs, ``"mps"`` off a Mac), ``"meta"`` (it holds no data, so no model can
            run on it) and ``"cpu:N"`` for ``N != 0`` (torch ignores the index: all of the CPU is device 0).
        TypeError: ``device`` is not a str, ``torch.device`` or ``None``.
    """
    return resolve_named_device(device, "device")


def autocast(device: Union[torch.device, str, None], *, enabled: bool = True) -> ContextManager:
    """Mixed precision for the forward pass: bfloat16 autocast on CUDA, a no-op elsewhere.

    bfloat16 has float32's exponent range, so unlike float16 it needs no loss scaling. On the CPU autocast is
    usually slower than float32, so it is off there.

    ``device`` is read as :func:`resolve_device` reads it (``None``/``"auto"`` included), with the same errors;
    with ``enabled=False`` it is only checked to be a valid name, so ``autocast("cuda", enabled=False)`` works on a
    machine without a GPU.

    Args:
        device: where the forward pass runs: a name, a ``torch.device``, or ``None``/``"auto"``.
        enabled: False turns it into a no-op (e.g. from a ``--no-mixed-precision`` flag).

    Returns:
        A context manager: ``with autocast(device): loss = model(x)``.

    Raises:
        ValueError: ``device`` is not a valid device (or, when enabled, not one this machine has).
        TypeError: ``enabled`` is not a bool, or ``device`` not a str, ``torch.device`` or ``None``.
    """
    check_bool(enabled, "enabled")
    parsed = parse_device(device)  # checked also when disabled; resolved (it must exist here) only when enabled
    if enabled and resolve_device(parsed).type == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def warmup_cosine(optimizer: torch.optim.Optimizer, *, warmup_steps: int, total_steps: int,
                  min_lr_ratio: float = 0.1) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup to the base learning rate, then cosine decay to ``min_lr_ratio`` times it.

    After ``s`` calls of ``scheduler.step()`` the learning rate is ``base * f(s)`` with

    * ``f(s) = (s + 1) / (warmup_steps + 1)`` for ``s < warmup_steps`` (small but never zero, so no step is
      wasted; reaches 1 at ``s = warmup_steps``),
    * ``f(s) = m + (1 - m) * (1 + cos(pi * (s - warmup_steps) / (total_steps - warmup_steps))) / 2`` for
      ``warmup_steps <= s < total_steps``, where ``m = min_lr_ratio``,
    * ``f(s) = m`` for ``s >= total_steps``.

    Warmup matters for transformers: Adam's early updates are large and noisy while its moment estimates are
    still poor, and post-norm models in particular diverge without it. ``total_steps == warmup_steps`` is
    allowed (warmup, then straight to the minimum).

    Args:
        optimizer: the optimizer whose learning rates (each group's, as set when it was built) are scaled.
        warmup_steps: the steps of linear warmup, ``>= 0``.
        total_steps: the step at which the decay reaches its minimum, ``>= warmup_steps`` and ``>= 1``.
        min_lr_ratio: the final learning rate as a fraction of the base one, in [0, 1].

    Returns:
        The scheduler; call ``scheduler.step()`` once after each ``optimizer.step()``.

    Raises:
        TypeError: ``optimizer`` is not an optimizer, or a step count is not an int.
        ValueError: a step count is out of range, or ``min_lr_ratio`` is not in [0, 1].
    """
    _check_schedule(optimizer, warmup_steps, total_steps, min_lr_ratio)

    def cosine(step: int) -> float:  # from 1 at the end of warmup to 0 at total_steps
        progress = (step - warmup_steps) / (total_steps - warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * progress))

    return _warmup_then(optimizer, warmup_steps, total_steps, min_lr_ratio, cosine)


def _warmup_then(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int, min_lr_ratio: float,
                 decay: Callable[[int], float]) -> torch.optim.lr_scheduler.LambdaLR:
    """The schedules' shared frame: linear warmup, ``m + (1 - m) * decay(s)`` up to ``total_steps``, then ``m``."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        if step >= total_steps:
            return min_lr_ratio
        return min_lr_ratio + (1 - min_lr_ratio) * decay(step)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _check_schedule(optimizer: object, warmup_steps: object, total_steps: object, min_lr_ratio: object) -> None:
    """The arguments the schedules share, checked alike."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    _check_int(warmup_steps, "warmup_steps", minimum=0)
    _check_int(total_steps, "total_steps", minimum=1)
    if total_steps < warmup_steps:  # type: ignore[operator]
        raise ValueError(f"total_steps must be >= warmup_steps ({warmup_steps}), got {total_steps}")
    if not is_number(min_lr_ratio) or not 0 <= min_lr_ratio <= 1:  # type: ignore[operator]
        raise ValueError(f"min_lr_ratio must be a float in [0, 1], got {min_lr_ratio!r}")


def warmup_stable_decay(optimizer: torch.optim.Optimizer, *, warmup_steps: int, total_steps: int,
                        decay_fraction: float = 0.2, min_lr_ratio: float = 0.0) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup, the base learning rate for most of the run, then a linear decay over its last part (WSD).

    After ``s`` calls of ``scheduler.step()`` the learning rate is ``base * f(s)``, with ``d`` the decay steps,
    ``round(decay_fraction * (total_steps - warmup_steps))``, and ``m = min_lr_ratio``:

    * ``f(s) = (s + 1) / (warmup_steps + 1)`` for ``s < warmup_steps`` (as :func:`warmup_cosine`),
    * ``f(s) = 1`` until ``total_steps - d``,
    * ``f(s) = m + (1 - m) * (total_steps - s) / d`` from there, reaching ``m`` at ``s = total_steps``,
    * ``f(s) = m`` for ``s >= total_steps``.

    Why: a run spends longer at the full rate than under a cosine, which the speedruns (modded-nanogpt, MiniCPM's
    "WSD") found to learn more in the same steps; the final decay then collects the gain a cosine spreads out.

    Args:
        optimizer: the optimizer whose learning rates (each group's, as set when it was built) are scaled.
        warmup_steps: the steps of linear warmup, ``>= 0``.
        total_steps: the step at which the decay ends, ``>= warmup_steps`` and ``>= 1``.
        decay_fraction: the share of the steps after warmup spent decaying, in (0, 1].
        min_lr_ratio: the final learning rate as a fraction of the base one, in [0, 1].

    Returns:
        The scheduler; call ``scheduler.step()`` once after each ``optimizer.step()``.

    Raises:
        TypeError: ``optimizer`` is not an optimizer, or a step count is not an int.
        ValueError: a step count, ``decay_fraction`` or ``min_lr_ratio`` is out of range.
    """
    if not is_number(decay_fraction) or not 0 < decay_fraction <= 1:
        raise ValueError(f"decay_fraction must be a float in (0, 1], got {decay_fraction!r}")
    _check_schedule(optimizer, warmup_steps, total_steps, min_lr_ratio)
    decay = max(1, round(decay_fraction * (total_steps - warmup_steps)))
    return _warmup_then(optimizer, warmup_steps, total_steps, min_lr_ratio,
                        lambda step: min(1.0, (total_steps - step) / decay))


def resume_schedule(scheduler: torch.optim.lr_scheduler.LambdaLR) -> list[float]:
    """Set the optimizer's learning rates to what ``scheduler``'s rule gives at its step; return them.

    Call it after a checkpoint restored the optimizer and the scheduler. The optimizer's state holds the learning
    rates of the rule the run was saved with, and the scheduler's state only its step (its rule is code, rebuilt by
    the script): when the rule changed (a run extended with a larger ``-N`` decays more slowly), the first resumed
    step would otherwise take the old rule's rate, and only the steps after it the new one.

    Args:
        scheduler: a ``LambdaLR`` (as :func:`warmup_cosine` builds), its state restored.

    Returns:
        The learning rate of each parameter group, now set.

    Raises:
        TypeError: ``scheduler`` is not a ``LambdaLR``.
    """
    if not isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
        raise TypeError(f"scheduler must be a torch.optim.lr_scheduler.LambdaLR, got {type(scheduler).__name__}")
    rates = [base * rule(scheduler.last_epoch) for base, rule in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    for group, rate in zip(scheduler.optimizer.param_groups, rates):
        group["lr"] = rate
    scheduler._last_lr = list(rates)  # what get_last_lr() reports
    return rates


def set_seed(seed: int) -> None:
    """Seed Python's ``random``, NumPy's global generator and torch (CPU and every CUDA device).

    Args:
        seed: an int in ``[0, 2**32)`` (NumPy's range).

    Raises:
        TypeError: ``seed`` is not an int.
        ValueError: ``seed`` is negative or at least ``2**32``.
    """
    _check_int(seed, "seed", minimum=0)
    if seed >= 2**32:
        raise ValueError(f"seed must be < 2**32 (NumPy's limit), got {seed}")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds all CUDA devices


def count_parameters(model: nn.Module, *, trainable_only: bool = False) -> int:
    """Number of parameter elements; parameters shared between layers (tied embeddings) count once.

    Args:
        model: any module.
        trainable_only: count only the parameters with ``requires_grad`` (not the frozen ones).

    Returns:
        The number of scalar parameters.

    Raises:
        TypeError: ``model`` is not a module, or ``trainable_only`` not a bool.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    check_bool(trainable_only, "trainable_only")
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


class TrainingDiverged(RuntimeError):
    """The training loss became NaN or infinite (:func:`check_finite_losses`)."""


def check_finite_losses(losses: Iterable[float], steps: Iterable[int]) -> None:
    """Raise :class:`TrainingDiverged` naming the first step whose loss is NaN or infinite.

    Once the loss is NaN, every weight soon is too, and whatever fails next (an evaluation, a sampler) blames
    its input instead of the cause; so a training loop checks the losses it reads anyway (e.g. every few steps)
    and stops at once, before the next checkpoint would save the broken weights. Both arguments are read once, so
    generators work too; anything else than what they take is a ``TypeError`` naming the argument.

    Args:
        losses: the losses to check: any iterable of real numbers (Python or NumPy numbers, one-element tensors)
            or a 1-D tensor or array.
        steps: the step of each loss (``losses[i]`` is the loss of ``steps[i]``), as many, the same of integers
            (a ``range`` will do).

    Raises:
        TrainingDiverged: a loss is NaN or infinite; the message names its step and the usual remedies.
        TypeError: either argument is not an iterable of the right numbers.
        ValueError: they differ in length.
    """
    loss_values = _real_values(losses, "losses", integer=False)
    step_values = _real_values(steps, "steps", integer=True)
    if len(loss_values) != len(step_values):
        raise ValueError(f"losses and steps must have the same length, got {len(loss_values)} and {len(step_values)}")
    for step, loss in zip(step_values, loss_values):
        if not math.isfinite(loss):
            raise TrainingDiverged(f"training diverged at step {step}: the loss is {loss}. The usual remedies: a lower "
                                   f"learning rate, a longer warmup, gradient clipping, normalised keys and queries "
                                   f"(kqnorm=True), or float32 instead of half precision")


def _real_values(values: object, name: str, *, integer: bool) -> list:
    """``values`` (an iterable of real numbers, or a 1-D tensor/array) as a list of Python ints or floats."""
    kind = "integers" if integer else "real numbers"
    expected = f"{name} must be an iterable of {kind} (a list, range, generator, 1-D tensor or array)"
    if isinstance(values, (torch.Tensor, np.ndarray)):
        if values.ndim != 1:
            raise TypeError(f"{expected}, got a {type(values).__name__} of shape {tuple(values.shape)}")
        values = values.tolist()  # one conversion (and one wait for the GPU) for all of them
    elif isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{expected}, got {type(values).__name__} {values!r:.60}")
    result = []
    for i, value in enumerate(values):
        number = _scalar(value)
        if not (is_int(number) if integer else is_number(number)):
            raise TypeError(f"{expected}; {name}[{i}] is {type(value).__name__} {value!r:.60}")
        result.append(number)
    return result


def _scalar(value: Any) -> Any:
    """A one-element tensor or array, or a NumPy scalar, as the Python number it holds; anything else unchanged."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return value.item() if math.prod(value.shape) == 1 else value
    return value.item() if isinstance(value, np.generic) else value


class CSVLogger:
    """Append rows of metrics to a CSV file, one row per :meth:`log` call, flushed immediately.

    The header is written when the file is new or empty; an existing file (a resumed run's) is appended to. Columns
    missing from a row are left empty, so metrics logged at different rates (training loss every step, validation
    every 1000) can share a file. What a cell may hold, :meth:`log` says. The file is UTF-8.

    A resumed run passes ``resume_step``: rows of the existing file logged *after* it are dropped first, since a
    killed run may have logged past its last checkpoint and the resumed run logs those steps again. Rows whose step
    is not a finite number (empty, text, ``nan``, ``inf``: not a step) are kept, as they are. Use it as a context
    manager, or call :meth:`close`.

    Args:
        path: the CSV file; missing parent folders are created.
        fieldnames: the columns, non-empty and unique strs; an existing file must have exactly these.
        resume_step: the step a run (re)starts from: rows with a larger step are dropped. ``0`` starts the log
            afresh; ``None`` (default) keeps every row.
        step_column: the column that holds the step, one of ``fieldnames``.

    Raises:
        TypeError: ``fieldnames`` is not a sequence of non-empty strs, or ``path`` is not a path.
        ValueError: ``fieldnames`` is empty or repeats a name, ``resume_step`` is not a non-negative int,
            ``step_column`` is not a column, ``path`` is a folder, or the existing file has other columns or is not
            UTF-8.
    """

    def __init__(self, path: PathLike, fieldnames: Sequence[str], *, resume_step: Optional[int] = None,
                 step_column: str = "step") -> None:
        if isinstance(fieldnames, (str, bytes)) or not isinstance(fieldnames, Iterable):
            raise TypeError(f"fieldnames must be a sequence of non-empty str, got {type(fieldnames).__name__} "
                            f"{fieldnames!r}")
        self.fieldnames = list(fieldnames)  # once: a generator can be read only once
        if not all(isinstance(f, str) and f for f in self.fieldnames):
            raise TypeError(f"fieldnames must be a sequence of non-empty str, got {self.fieldnames!r}")
        if not self.fieldnames or len(set(self.fieldnames)) != len(self.fieldnames):
            raise ValueError(f"fieldnames must be non-empty and unique, got {self.fieldnames}")
        if resume_step is not None and (not is_int(resume_step) or resume_step < 0):
            raise ValueError(f"resume_step must be a non-negative int or None, got {resume_step!r}")
        if resume_step is not None and step_column not in self.fieldnames:
            raise ValueError(f"step_column {step_column!r} is not one of the fieldnames {self.fieldnames}")
        self.path = check_file_path(path, "path")
        self.path.parent.mkdir(parents=True, exist_ok=True)

        rows = _read_csv(self.path) if self.path.exists() and self.path.stat().st_size > 0 else None
        existing = rows[0] if rows else None
        if existing is not None and existing != self.fieldnames:
            raise ValueError(f"{self.path} already has columns {existing}, but fieldnames is {self.fieldnames}; use a "
                             f"new file or the same columns")
        if existing is not None and resume_step is not None:
            self._drop_rows_after(rows, resume_step, self.fieldnames.index(step_column))
        self._file = open(self.path, "a", newline="", encoding="utf-8")
        if existing is not None and not self._ends_with_newline():
            self._file.write("\n")  # a crash mid-row left a partial line; don't glue the next row onto it
        self._writer = csv.DictWriter(self._file, fieldnames=self.fieldnames, restval="")
        if existing is None:
            self._writer.writeheader()
            self._file.flush()

    def _drop_rows_after(self, rows: list[list[str]], step: int, column: int) -> None:
        def keep(row: list[str]) -> bool:
            try:
                value = float(row[column])
            except (IndexError, ValueError):  # missing, empty or not a number: not ours to judge
                return True
            return not math.isfinite(value) or value <= step  # nan and inf are not steps either

        def write(tmp: Path) -> None:
            with open(tmp, "x", newline="", encoding="utf-8") as f:
                writer = csv.writer(f)
                writer.writerow(self.fieldnames)
                writer.writerows(row for row in rows[1:] if keep(row))  # kept rows as they were, extra cells too

        write_atomically(self.path, write)

    def log(self, **row: Any) -> None:
        """Append one row: ``log(step=10, loss=2.31)``; columns not given stay empty.

        Args:
            **row: the cells, by column: numbers (Python or NumPy, one-element tensors or arrays: logged as the
                number they hold), strs or ``None`` (empty).

        Raises:
            ValueError: no column given, an unknown column, or the logger is closed.
            TypeError: a cell holds anything else (a list, a multi-element tensor); nothing is written then.
        """
        if self._file.closed:
            raise ValueError(f"log() called after close() on the CSVLogger for {self.path}")
        if not row:
            raise ValueError(f"log() needs at least one column, e.g. log(step=1, loss=0.5); the columns of "
                             f"{self.path} are {self.fieldnames}")
        unknown = [k for k in row if k not in self.fieldnames]
        if unknown:
            raise ValueError(f"unknown column(s) {unknown}; the columns of {self.path} are {self.fieldnames}")
        row = {k: _cell(k, v) for k, v in row.items()}  # all checked before anything is written
        self._writer.writerow(row)
        self._file.flush()  # so the curves can be watched (and survive a crash) while training runs

    def close(self) -> None:
        """Close the file (the rows written so far are on disk)."""
        self._file.close()

    def __enter__(self) -> CSVLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ends_with_newline(self) -> bool:
        with open(self.path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) in (b"\n", b"\r")


def _cell(column: str, value: Any) -> Any:
    """What :meth:`CSVLogger.log` writes for ``value``: a number, a str or ``None``; else a ``TypeError``."""
    number = _scalar(value)
    if number is None or isinstance(number, (str, int, float)):  # bool is an int
        return number
    if isinstance(number, numbers.Real):  # Fraction, Decimal: written as floats, which plot_curves reads
        return float(number)
    if isinstance(value, (torch.Tensor, np.ndarray)) and value is number:
        got = f"a {type(value).__name__} of shape {tuple(value.shape)}"
    else:
        got = f"{type(value).__name__} {value!r:.60}"
    raise TypeError(f"column {column!r} must be a number, str, None or a one-element tensor, got {got}; log one "
                    f"value per column (e.g. loss.mean().item())")


def _read_csv(path: Path) -> list[list[str]]:
    """The rows of the CSV file ``path`` (a ``ValueError`` naming it when it is not UTF-8 text)."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:  # -sig: a byte-order mark is not part of a name
            return list(csv.reader(f))
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not a UTF-8 text file (byte {e.start}: {e.reason}); CSV logs are UTF-8: "
                         f"use a new file, or convert this one") from None
    except csv.Error as e:  # e.g. a NUL byte: a binary file
        raise ValueError(f"{path} is not a readable CSV file ({e}); use a new file") from None


def plot_curves(csv_path: PathLike, png_path: PathLike, *, x: str, ys: Sequence[str], title: Optional[str] = None,
                ylabel: Optional[str] = None, marks: Optional[Mapping[str, tuple[float, float]]] = None,
                logy: bool = False) -> bool:
    """Plot columns ``ys`` of a CSV (as written by :class:`CSVLogger`) against column ``x`` into a PNG.

    Empty cells are skipped, so sparsely logged columns plot as their own points; a cell that is not a number is a
    ``ValueError`` naming its column and line.

    Args:
        csv_path: the CSV file to read.
        png_path: the PNG file to write, ending in ``.png`` (an existing folder is refused); missing parent folders
            are created.
        x: the column of the x axis (usually ``"step"``).
        ys: the columns to plot, one curve each.
        title: a title above the plot; ``None``: none.
        ylabel: the y axis's name (give it whenever the curves share a unit: say which); ``None``: the column's
            name when there is one curve, else none.
        marks: labelled single points to add, ``{label: (x, y)}``, e.g. a final figure ``{"test: 1.26": (step,
            value)}``; ``None``: none.
        logy: a logarithmic y axis (for losses: the first steps' large values then do not squash the range the rest
            of training moves in); values at or below zero are left out of the plot.

    Returns:
        ``True`` when the PNG was written, ``False`` when matplotlib is not installed.

    Raises:
        FileNotFoundError: ``csv_path`` does not exist.
        ValueError: a column is missing or holds text, ``ys`` or ``marks`` is malformed, or ``png_path`` is not a
            ``.png`` file path.
        TypeError: ``ylabel`` is not a str.
    """
    if isinstance(ys, (str, bytes)) or not isinstance(ys, Iterable):
        raise ValueError(f"ys must be a non-empty sequence of column names, got {ys!r}")
    ys = list(ys)
    if not ys or not all(isinstance(y, str) for y in [x, *ys]):
        raise ValueError(f"x must be a column name and ys a non-empty sequence of them, got x={x!r}, ys={ys!r}")
    if ylabel is not None and not isinstance(ylabel, str):
        raise TypeError(f"ylabel must be a str or None, got {type(ylabel).__name__} {ylabel!r}")
    check_bool(logy, "logy")
    marks = dict(marks or {})
    for label, point in marks.items():
        if not (isinstance(label, str) and isinstance(point, (tuple, list)) and len(point) == 2
                and all(is_real(v) for v in point)):
            raise ValueError(f"marks must map labels (str) to (x, y) number pairs, got {label!r}: {point!r}")
    csv_path = check_file_path(csv_path, "csv_path")
    png_path = check_png_path(png_path, "png_path")
    if not csv_path.is_file():
        raise FileNotFoundError(f"csv_path {csv_path} does not exist (a CSVLogger writes it)")
    lines = _read_csv(csv_path)
    columns = lines[0] if lines else []
    absent = [c for c in [x, *ys] if c not in columns]
    if absent:
        raise ValueError(f"column(s) {absent} not in {csv_path}; its columns are {columns}")

    def number(line: int, column: str, text: str) -> float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{csv_path}, line {line}: column {column!r} holds {text!r}, not a number; plot "
                             f"only numeric columns") from None

    index = {c: columns.index(c) for c in [x, *ys]}
    curves = {}
    for y in ys:
        cells = [(i, row[index[x]], row[index[y]]) for i, row in enumerate(lines[1:], start=2)
                 if max(index[x], index[y]) < len(row) and row[index[x]] != "" and row[index[y]] != ""]
        curves[y] = [(number(i, x, a), number(i, y, b)) for i, a, b in cells]

    try:  # Figure + FigureCanvasAgg avoid pyplot's global state
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return False

    fig = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for y, points in curves.items():
        ax.plot([p[0] for p in points], [p[1] for p in points], label=y, marker="." if len(points) < 50 else None)
    for label, (mx, my) in marks.items():
        ax.plot([mx], [my], marker="*", markersize=12, linestyle="none", label=label)
    ax.set_xlabel(x)
    if logy:
        ax.set_yscale("log", nonpositive="mask")
    if ylabel is not None or len(ys) == 1:
        ax.set_ylabel(ylabel if ylabel is not None else ys[0])
    if len(ys) > 1 or marks:
        ax.legend()
    ax.grid(alpha=0.3)
    if title:
        # A long line runs off both sides of the figure: each of the title's lines is wrapped on its own.
        ax.set_title("\n".join(textwrap.fill(line, 70) for line in title.splitlines()))
    fig.tight_layout()
    png_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path, dpi=100, format="png")
    return True


def progress(iterable: Optional[Iterable] = None, *, total: Optional[int] = None, desc: Optional[str] = None,
             disable: bool = False):
    """A tqdm progress bar if tqdm is installed, else a silent stand-in with the same basic methods.

    On several processes (``torch.distributed``) only the main one (rank 0) draws its bars: the others would write
    the same bars over each other on the same terminal.

    Args:
        iterable: what to iterate over; ``None`` for a bar advanced by hand with ``update(n)``.
        total: the number of items, for the bar's length; ``None``: ``len(iterable)`` where it has one.
        desc: a label in front of the bar; ``None``: none.
        disable: draw nothing (the items are still iterated).

    Returns:
        (Iterable): A ``tqdm`` bar, or without tqdm a silent stand-in that iterates and counts (``.n``,
        ``update(n)``) and ignores ``set_postfix``, ``set_description``, ``unpause`` and ``close``. Both work as
        context managers. Call ``bar.unpause()`` after work that is not the bar's (an evaluation, a checkpoint): tqdm
        then restarts its clock, so the rate, the time left and the elapsed time it shows count training steps only.

    Raises:
        TypeError: ``iterable`` is not iterable, or ``desc`` is not a str.
        ValueError: ``total`` is negative or not a number.
    """
    if iterable is not None and not isinstance(iterable, Iterable):
        raise TypeError(f"iterable must be an iterable or None, got {type(iterable).__name__}")
    if total is not None and (not is_real(total) or not total >= 0):
        raise ValueError(f"total must be a number >= 0 or None, got {total!r}")
    if desc is not None and not isinstance(desc, str):
        raise TypeError(f"desc must be a str or None, got {type(desc).__name__} {desc!r}")
    try:
        from tqdm import tqdm
    except ImportError:
        return _PlainProgress(iterable, total=total, desc=desc)
    quiet = dist.is_available() and dist.is_initialized() and dist.get_rank() > 0  # see the docstring
    return tqdm(iterable, total=total, desc=desc, disable=disable or quiet, dynamic_ncols=True)


class _PlainProgress:
    """What :func:`progress` returns without tqdm: iterates, counts, and ignores display calls."""

    def __init__(self, iterable: Optional[Iterable], *, total: Optional[int], desc: Optional[str]) -> None:
        self.iterable, self.desc, self.n = iterable, desc, 0
        self.total = len(iterable) if total is None and hasattr(iterable, "__len__") else total

    def __iter__(self) -> Iterator:
        if self.iterable is None:
            raise TypeError("progress() was created without an iterable; call update() instead of iterating")
        for item in self.iterable:
            yield item
            self.n += 1

    def __len__(self) -> int:
        if self.total is None:
            raise TypeError("progress() has no known total")
        return self.total

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix(self, *args: Any, **kwargs: Any) -> None:
        pass

    def unpause(self) -> None:
        pass

    set_description, close = set_postfix, unpause  # display calls: nothing to display

    def __enter__(self) -> _PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CheckpointClock:
    """Says when a run is due to save a checkpoint by wall time: ``minutes`` after its start or its last save.

    Steps alone are a poor clock for checkpoints: a setting that saves every few minutes on a GPU saves every hour
    on a CPU, and a run killed in between loses all of it. A training loop asks :meth:`due` at its logging steps
    and, when due, saves and calls :meth:`reset` (as after any save):

        clock = CheckpointClock(args.checkpoint_minutes, device=device)
        ...
        if step % log_every == 0 and clock.due():
            save(step)
            clock.reset()

    On several processes (``torch.distributed``) the main process's clock decides for all (a broadcast at each
    :meth:`due`): every process must take part in the same saves, and their clocks drift apart.

    Args:
        minutes: the wall time between saves, > 0; ``None``: never due (steps alone decide).
        device: where the broadcast's one-element tensor goes on several processes (a CUDA device with NCCL);
            ``None``: the CPU.

    Raises:
        TypeError: ``minutes`` is not a number or ``None``.
        ValueError: ``minutes`` is not positive and finite.
    """

    def __init__(self, minutes: Optional[float], *, device: Union[torch.device, str, None] = None) -> None:
        if minutes is not None and not is_real(minutes):
            raise TypeError(f"minutes must be a positive number or None, got {type(minutes).__name__} {minutes!r}")
        if minutes is not None and not (math.isfinite(minutes) and minutes > 0):
            raise ValueError(f"minutes must be a positive number or None, got {minutes!r}")
        self.minutes, self.device = minutes, torch.device("cpu") if device is None else torch.device(device)
        self.reset()

    def reset(self) -> None:
        """Start counting again from now: call it after every save."""
        self.last = time.monotonic()

    def due(self) -> bool:
        """Whether ``minutes`` have passed since the start or the last :meth:`reset` (the main process's clock).

        Returns:
            ``True`` when a checkpoint is due; always ``False`` without ``minutes``.
        """
        if self.minutes is None:
            return False
        due = time.monotonic() - self.last >= 60 * self.minutes
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            flag = torch.tensor([int(due)], device=self.device)
            dist.broadcast(flag, src=0)
            due = bool(flag.item())
        return due


def _check_int(value: object, name: str, *, minimum: int) -> int:
    if not is_int(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value}")
    return value
