"""What a training script needs to run the same way as one process or as many under ``torchrun``.

:mod:`torchformer.train.distributed` has the engines (process group, DDP, FSDP2, all-reduces); this module has the
few decisions the example scripts share, so that each script stays a thin user of them:

* :func:`start_run`: join the processes (or be the only one), seed every process alike (the same initial weights
  everywhere), and keep the standard output of every process but the main one quiet: only rank 0 prints.
* :func:`seed_each_process`: after the model is built, give each process its own stream of the random generators.
* :func:`share_batch`: **the batch size is global.** Every process draws the same global batch (from generators
  seeded alike) and computes its rows ``rank, rank + world_size, ...``; its loss, summed over them, is divided by
  ``batch_size / world_size``, so averaging the gradients over the processes (DDP, FSDP2) gives the gradient of the
  whole batch's mean loss: the same ``-b`` and learning rate take the same steps on any number of processes (up to
  the rounding of sums), and the learning rate is never scaled (``docs/going-big.md``).
* :class:`NoLog`: what a process that writes nothing uses in place of a logger.

A batch that does not divide evenly (the last, smaller batch of an IMDb epoch) gives some processes a row fewer;
they compute a repeated row that counts for nothing instead (its target is ``IGNORE``), because every process must
run a forward and backward pass of the same shape of program at every step for the collectives to meet.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor

from torchformer._checks import check_positive_int
from torchformer.train.distributed import (
    STRATEGIES, DistributedRun, all_reduce_sum, rank_and_world_size, setup_distributed,
)
from torchformer.train.training import set_seed

IGNORE = -100  # the target of a row that counts for nothing: F.nll_loss's default ignore_index


def start_run(device: torch.device, *, strategy: str, seed: int, timeout: Optional[timedelta] = None) -> DistributedRun:
    """Join the processes ``torchrun`` started (or set up a single process), seed them all, quiet all but rank 0.

    The standard output of the other processes goes to ``os.devnull``; their standard error stays, so a failing
    process still says why.

    Args:
        device: the device the script resolved (``--device``). Under ``torchrun`` on CUDA each process takes
            ``cuda:LOCAL_RANK`` instead (the returned run's ``device``).
        strategy: ``"ddp"`` or ``"fsdp"``, checked here, before anything is loaded (one process: the plain model).
        seed: the same on every process, so that models built next get the same initial weights everywhere.
        timeout: how long a collective waits for the other processes (see :func:`setup_distributed`).

    Returns:
        This process's :class:`~torchformer.train.distributed.DistributedRun`.

    Raises:
        ValueError: ``strategy`` is not ``"ddp"`` or ``"fsdp"``, ``seed`` is negative or at least ``2**32``, or
            :func:`~torchformer.train.distributed.setup_distributed` refuses the device or the environment.
        TypeError: ``seed`` is not an int.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    run = setup_distributed(device=device.type, timeout=timeout)
    set_seed(seed)
    if not run.is_main:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the life of the process
    return run


def seed_each_process(seed: int) -> None:
    """Give each process its own stream of the global generators (Python's, NumPy's, torch's): its own dropout masks.

    Call it after building the model (which must be identical everywhere). Rank ``r > 0`` is seeded from ``(seed,
    r)`` by NumPy's ``SeedSequence`` (independent streams, reproducible from the seed and the rank); rank 0 keeps
    the stream it has, so that a single process draws exactly what it drew before this function existed.

    Args:
        seed: the run's seed, the one given to :func:`start_run`.
    """
    rank, _ = rank_and_world_size()
    if rank > 0:
        set_seed(int(np.random.SeedSequence(seed, spawn_key=(rank,)).generate_state(1)[0]))


@dataclass(frozen=True)
class BatchShare:
    """This process's part of a global batch, as :func:`share_batch` makes it.

    Every process gets the same number of rows ``k``.

    Args:
        rows: ``(k,)`` long, the indices of the batch rows this process computes.
        real: ``(k,)`` bool, ``False`` for a repeated row that counts for nothing.
        divisor: what the loss summed over the process's rows is divided by: ``batch_size / world_size``.
        whole: the share is the whole batch in order (one process): :meth:`take` and :meth:`targets` return their input.
    """

    rows: Tensor
    real: Tensor
    divisor: float
    whole: bool = False

    def take(self, batch: Tensor) -> Tensor:
        """This process's rows of ``batch``: ``(batch_size, ...) -> (k, ...)``.

        Args:
            batch: the global batch ``(batch_size, ...)``, the same on every process.

        Returns:
            The rows ``(k, ...)``; ``batch`` itself when :attr:`whole` (no index copied to the device every step).
        """
        return batch if self.whole else batch[self.rows.to(batch.device)]

    def targets(self, targets: Tensor) -> Tensor:
        """This process's rows of ``targets`` ``(batch_size, ...)``, those of repeated rows set to :data:`IGNORE`.

        Args:
            targets: the global batch's targets ``(batch_size, ...)``, integer class or token ids.

        Returns:
            ``(k, ...)``; ``targets`` itself for one process.
        """
        if self.whole:
            return targets
        mine = self.take(targets)
        real = self.real.to(mine.device).view(-1, *[1] * (mine.dim() - 1))
        return torch.where(real, mine, IGNORE)


def share_batch(batch_size: int) -> BatchShare:
    """This process's share of a global batch of ``batch_size`` rows (see the module docstring).

    Rows ``rank, rank + world_size, ...``; ``ceil(batch_size / world_size)`` of them on every process, the missing
    ones repeats (of row ``index % batch_size``) that do not count. One process: all rows, in order, divisor
    ``batch_size``, so ``F.nll_loss(..., reduction="sum") / divisor`` is exactly the mean loss of before.

    Args:
        batch_size: the global batch size, in rows (the script's ``-b``).

    Returns:
        This process's :class:`BatchShare`.

    Raises:
        ValueError: ``batch_size`` is not a positive int.
    """
    check_positive_int(batch_size, "batch_size")
    rank, world_size = rank_and_world_size()
    index = torch.arange(rank, world_size * math.ceil(batch_size / world_size), world_size)
    return BatchShare(rows=index % batch_size, real=index < batch_size, divisor=batch_size / world_size,
                      whole=world_size == 1)


def average_over_processes(values: Tensor) -> Tensor:
    """The element-wise mean of ``values`` over the processes.

    The figures of the whole batch from each process's part, e.g. losses read for the log or to check for a
    divergence. Every process must call it with the same shape.

    Args:
        values: this process's figures, a tensor of any shape.

    Returns:
        The means, shaped and placed as ``values`` (floating point); the same numbers for one process.
    """
    _, world_size = rank_and_world_size()
    return all_reduce_sum(values) / world_size


def describe_run(run: DistributedRun, *, strategy: str, batch_size: int, unit: str, learn_rate: float) -> str:
    """The start-up line that says how the work is shared: processes, strategy, the global batch, the learning rate.

    Args:
        run: this process's run (:func:`start_run`).
        strategy: ``"ddp"`` or ``"fsdp"``, named when there are several processes.
        batch_size: the global batch size.
        unit: what a row of the batch is, for the line (``"sequences"``, ``"reviews"``).
        learn_rate: the learning rate, the same on any number of processes.

    Returns:
        One line of text, without a newline.
    """
    if run.world_size == 1:
        how = "1 process (start with torchrun for more; --strategy applies only then)"
    else:
        how = f"{run.world_size} processes ({strategy.upper()} over {run.backend})"
    per = batch_size / run.world_size
    share = f"{per:g}" if per == int(per) else f"{math.floor(per)} or {math.ceil(per)}"
    return (f"processes: {how}; -b {batch_size} {unit} per step in all ({share} per process); learning rate "
            f"{learn_rate:g}, not scaled (the step is the same on any number of processes)")


class NoLog:
    """In place of a :class:`~torchformer.train.training.CSVLogger` (or a TensorBoard writer) on a silent process.

    It takes the same calls and keeps nothing: the processes other than rank 0 write no files.
    """

    def log(self, **row: Any) -> None:
        """Take a row, as :meth:`CSVLogger.log <torchformer.train.training.CSVLogger.log>` does, and drop it.

        Args:
            **row: the columns and their values, ignored.
        """

    def add_scalar(self, *args: Any, **kwargs: Any) -> None:
        """Take a scalar, as TensorBoard's ``SummaryWriter.add_scalar`` does, and drop it.

        Args:
            *args: ``add_scalar``'s arguments (tag, value, step, ...), ignored.
            **kwargs: its keyword arguments, ignored.
        """

    def close(self) -> None:
        """Nothing to close."""
