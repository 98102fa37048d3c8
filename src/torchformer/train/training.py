"""The small pieces every training script needs, written once.

The example scripts (character-level generation on enwik8, classification on IMDb) share these:

* :func:`resolve_device` and :func:`autocast`: pick the device, and run the forward pass in bfloat16 on GPUs.
* :func:`warmup_cosine`: the learning-rate schedule transformers are usually trained with.
* :func:`set_seed` and :func:`count_parameters`.
* :class:`CSVLogger`, :func:`plot_curves` and :func:`progress`: record, draw and watch the training curves.
* :func:`check_finite_losses`: stop a diverged run with a message that names the step and the usual remedies.
* Checkpointing (:func:`save_checkpoint`, :func:`load_checkpoint`, :func:`latest_checkpoint`,
  :func:`latest_intact_checkpoint`, :func:`unwrap_model`) lives in :mod:`torchformer.train.checkpoint` and is re-exported here.

Only torch and numpy are required. tqdm and matplotlib are used when installed; without them :func:`progress`
falls back to a plain iterator and :func:`plot_curves` returns ``False``.
"""

from __future__ import annotations

import contextlib
import csv
import math
import os
import random
from pathlib import Path
from typing import Any, ContextManager, Iterable, Iterator, Optional, Sequence, Union

import numpy as np
import torch
from torch import nn

from torchformer.train.checkpoint import (
    CheckpointError,
    checkpoint_path,
    latest_checkpoint,
    latest_intact_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    save_checkpoint,
    unwrap_model,
    write_atomically,
)

__all__ = [
    "CSVLogger",
    "CheckpointError",
    "TrainingDiverged",
    "autocast",
    "check_finite_losses",
    "checkpoint_path",
    "count_parameters",
    "latest_checkpoint",
    "latest_intact_checkpoint",
    "load_checkpoint",
    "plot_curves",
    "progress",
    "prune_checkpoints",
    "resolve_device",
    "save_checkpoint",
    "set_seed",
    "unwrap_model",
    "warmup_cosine",
]

PathLike = Union[str, os.PathLike]


def resolve_device(device: Union[str, torch.device, None] = None) -> torch.device:
    """``None`` or ``"auto"``: CUDA if available, else CPU. Otherwise the named device, checked to exist."""
    if device is None or (isinstance(device, str) and device.strip().lower() == "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(device, str):
        try:
            device = torch.device(device)
        except RuntimeError as e:
            raise ValueError(f"device must be 'auto', 'cpu', 'cuda', 'cuda:N', ...; got {device!r} ({e})") from None
    elif not isinstance(device, torch.device):
        raise TypeError(f"device must be a str, torch.device or None, got {type(device).__name__}")

    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"device {str(device)!r} was requested but CUDA is not available "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda}); use 'cpu' or 'auto'"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {str(device)!r} was requested but only {torch.cuda.device_count()} CUDA device(s) exist"
            )
    elif device.type != "cpu":
        backend = getattr(torch.backends, device.type, None) or getattr(torch, device.type, None)
        is_available = getattr(backend, "is_available", None)
        if callable(is_available) and not is_available():
            raise ValueError(f"device {str(device)!r} was requested but is not available on this machine")
    return device


def autocast(device: Union[torch.device, str], *, enabled: bool = True) -> ContextManager:
    """Mixed precision for the forward pass: bfloat16 autocast on CUDA, a no-op elsewhere.

    bfloat16 has float32's exponent range, so unlike float16 it needs no loss scaling. On the CPU autocast is
    usually slower than float32, so it is off there.
    """
    device = torch.device(device) if isinstance(device, str) else device
    if not isinstance(device, torch.device):
        raise TypeError(f"device must be a torch.device or str, got {type(device).__name__}")
    if enabled and device.type == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def warmup_cosine(
    optimizer: torch.optim.Optimizer, *, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.1
) -> torch.optim.lr_scheduler.LambdaLR:
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
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    _check_int(warmup_steps, "warmup_steps", minimum=0)
    _check_int(total_steps, "total_steps", minimum=1)
    if total_steps < warmup_steps:
        raise ValueError(f"total_steps must be >= warmup_steps ({warmup_steps}), got {total_steps}")
    if isinstance(min_lr_ratio, bool) or not isinstance(min_lr_ratio, (int, float)) or not 0 <= min_lr_ratio <= 1:
        raise ValueError(f"min_lr_ratio must be a float in [0, 1], got {min_lr_ratio!r}")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        if step >= total_steps:
            return min_lr_ratio
        progress = (step - warmup_steps) / (total_steps - warmup_steps)
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def set_seed(seed: int) -> None:
    """Seed Python's ``random``, NumPy's global generator and torch (CPU and every CUDA device)."""
    _check_int(seed, "seed", minimum=0)
    if seed >= 2**32:
        raise ValueError(f"seed must be < 2**32 (NumPy's limit), got {seed}")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds all CUDA devices


def count_parameters(model: nn.Module, *, trainable_only: bool = False) -> int:
    """Number of parameter elements; parameters shared between layers (tied embeddings) count once."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


class TrainingDiverged(RuntimeError):
    """The training loss became NaN or infinite (:func:`check_finite_losses`)."""


def check_finite_losses(losses: Sequence[float], steps: Sequence[int]) -> None:
    """Raise :class:`TrainingDiverged` naming the first step whose loss is NaN or infinite.

    Once the loss is NaN, every weight soon is too, and whatever fails next (an evaluation, a sampler) blames
    its input instead of the cause; so a training loop checks the losses it reads anyway (e.g. every few steps)
    and stops at once, before the next checkpoint would save the broken weights. ``losses[i]`` is the loss of
    ``steps[i]``.
    """
    if len(losses) != len(steps):
        raise ValueError(f"losses and steps must have the same length, got {len(losses)} and {len(steps)}")
    for step, loss in zip(steps, losses):
        if not math.isfinite(loss):
            raise TrainingDiverged(
                f"training diverged at step {step}: the loss is {loss}. The usual remedies: a lower learning rate, "
                f"a longer warmup, gradient clipping, normalised keys and queries (kqnorm=True), or float32 instead "
                f"of half precision"
            )


class CSVLogger:
    """Append rows of metrics to a CSV file, one row per :meth:`log` call, flushed immediately.

    The header is written when the file is new or empty. Opening an existing file appends to it (a resumed
    run continues the same file) after checking its header matches ``fieldnames``. Columns missing from a row
    are left empty, so metrics logged at different rates (training loss every step, validation every 1000)
    can share a file. One-element tensors are logged as numbers.

    ``resume_step``: the step a run (re)starts from. Rows of the existing file logged *after* it (column
    ``step_column``) are dropped first: a killed run may have logged past its last checkpoint, and the resumed
    run logs those steps again. ``resume_step=0`` starts the log afresh. Rows whose step is not a number (or
    empty) are kept.
    """

    def __init__(
        self,
        path: PathLike,
        fieldnames: Sequence[str],
        *,
        resume_step: Optional[int] = None,
        step_column: str = "step",
    ) -> None:
        if isinstance(fieldnames, str) or not all(isinstance(f, str) and f for f in fieldnames):
            raise TypeError(f"fieldnames must be a sequence of non-empty str, got {fieldnames!r}")
        self.fieldnames = list(fieldnames)
        if not self.fieldnames or len(set(self.fieldnames)) != len(self.fieldnames):
            raise ValueError(f"fieldnames must be non-empty and unique, got {self.fieldnames}")
        if resume_step is not None and (isinstance(resume_step, bool) or not isinstance(resume_step, int)
                                        or resume_step < 0):
            raise ValueError(f"resume_step must be a non-negative int or None, got {resume_step!r}")
        if resume_step is not None and step_column not in self.fieldnames:
            raise ValueError(f"step_column {step_column!r} is not one of the fieldnames {self.fieldnames}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

        existing = self._existing_header()
        if existing is not None and existing != self.fieldnames:
            raise ValueError(
                f"{self.path} already has columns {existing}, but fieldnames is {self.fieldnames}; "
                f"use a new file or the same columns"
            )
        if existing is not None and resume_step is not None:
            self._drop_rows_after(resume_step, step_column)
        self._file = open(self.path, "a", newline="", encoding="utf-8")
        if existing is not None and not self._ends_with_newline():
            self._file.write("\n")  # a crash mid-row left a partial line; don't glue the next row onto it
        self._writer = csv.DictWriter(self._file, fieldnames=self.fieldnames, restval="")
        if existing is None:
            self._writer.writeheader()
            self._file.flush()

    def _drop_rows_after(self, step: int, column: str) -> None:
        with open(self.path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))

        def keep(row: dict) -> bool:
            try:
                return float(row[column]) <= step
            except (TypeError, ValueError):  # empty, missing or not a number: not ours to judge
                return True

        def write(tmp: Path) -> None:
            with open(tmp, "x", newline="", encoding="utf-8") as f:
                writer = csv.DictWriter(f, self.fieldnames, restval="")
                writer.writeheader()
                writer.writerows(row for row in rows if keep(row))

        write_atomically(self.path, write)

    def log(self, **row: Any) -> None:
        if self._file.closed:
            raise ValueError(f"log() called after close() on the CSVLogger for {self.path}")
        unknown = [k for k in row if k not in self.fieldnames]
        if unknown:
            raise ValueError(f"unknown column(s) {unknown}; the columns of {self.path} are {self.fieldnames}")
        row = {k: v.item() if isinstance(v, torch.Tensor) and v.numel() == 1 else v for k, v in row.items()}
        self._writer.writerow(row)
        self._file.flush()  # so the curves can be watched (and survive a crash) while training runs

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> CSVLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _existing_header(self) -> Optional[list]:
        if not self.path.exists() or self.path.stat().st_size == 0:
            return None
        with open(self.path, newline="", encoding="utf-8") as f:
            return next(csv.reader(f), None)

    def _ends_with_newline(self) -> bool:
        with open(self.path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1) in (b"\n", b"\r")


def plot_curves(
    csv_path: PathLike, png_path: PathLike, *, x: str, ys: Sequence[str], title: Optional[str] = None
) -> bool:
    """Plot columns ``ys`` of a CSV (as written by :class:`CSVLogger`) against column ``x`` into a PNG.

    Empty cells are skipped, so sparsely logged columns plot as their own points. Returns ``True`` when the
    PNG was written and ``False`` when matplotlib is not installed.
    """
    if isinstance(ys, str) or not ys:
        raise ValueError(f"ys must be a non-empty sequence of column names, got {ys!r}")
    with open(csv_path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        columns = reader.fieldnames or []
        absent = [c for c in [x, *ys] if c not in columns]
        if absent:
            raise ValueError(f"column(s) {absent} not in {csv_path}; its columns are {columns}")
        rows = list(reader)

    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return False
    del matplotlib  # imported only to fail early; Figure + FigureCanvasAgg avoid pyplot's global state

    fig = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for y in ys:
        present = [r for r in rows if r.get(x) not in (None, "") and r.get(y) not in (None, "")]
        points = [(float(r[x]), float(r[y])) for r in present]
        ax.plot([p[0] for p in points], [p[1] for p in points], label=y, marker="." if len(points) < 50 else None)
    ax.set_xlabel(x)
    if len(ys) == 1:
        ax.set_ylabel(ys[0])
    else:
        ax.legend()
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    Path(png_path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path, dpi=100)
    return True


def progress(
    iterable: Optional[Iterable] = None,
    *,
    total: Optional[int] = None,
    desc: Optional[str] = None,
    disable: bool = False,
):
    """A tqdm progress bar if tqdm is installed, else a silent stand-in with the same basic methods."""
    try:
        from tqdm import tqdm
    except ImportError:
        return _PlainProgress(iterable, total=total, desc=desc)
    return tqdm(iterable, total=total, desc=desc, disable=disable, dynamic_ncols=True)


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

    def set_description(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> _PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_int(value: object, name: str, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value}")
    return value
