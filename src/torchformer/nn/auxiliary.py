"""Auxiliary losses: what a part adds to the training loss besides the model's prediction.

A part records each term with its weight into an :class:`AuxiliaryLosses` in its ``forward``; the training loop
adds :func:`auxiliary_loss` to its loss and logs :func:`auxiliary_terms` (``docs/extending.md``, "Example 7").
"""

from __future__ import annotations

from typing import Callable, Optional, Union

import torch
from torch import Tensor, nn

from torchformer._checks import is_number


class AuxiliaryLosses(nn.Module):
    """The auxiliary loss terms, and statistics, of one part's latest forward pass (not in the ``state_dict``).

    Shapes:
        Each recorded loss is a scalar; a noted statistic any shape.
    """

    def __init__(self) -> None:
        super().__init__()
        self.losses: dict[str, tuple[float, Tensor]] = {}  # name -> (weight, value), the latest call's
        self.statistics: dict[str, Tensor] = {}  # name -> a detached tensor, the latest call's

    def record(self, name: str, value: Tensor, *, weight: float) -> None:
        """Set the term ``name`` of this part's latest call: ``weight * value`` joins the loss.

        Args:
            name: the term's name; the parts' terms of one name are summed in the loss and averaged in the log.
            value: a scalar tensor, part of the forward pass's graph.
            weight: its weight in the loss; 0 logs the term without training on it.

        Raises:
            ValueError: ``value`` is not a scalar tensor, or ``weight`` not a number.
        """
        if not isinstance(value, Tensor) or value.dim() != 0:
            raise ValueError(f"an auxiliary loss must be a scalar tensor, got {type(value).__name__} "
                             f"{tuple(value.shape) if isinstance(value, Tensor) else ''} for {name!r}")
        if not is_number(weight):
            raise ValueError(f"weight must be a number, got {weight!r} for {name!r}")
        self.losses[name] = (float(weight), value)

    def note(self, name: str, value: Tensor) -> None:
        """Set the statistic ``name`` of this part's latest call (detached: it only informs).

        Args:
            name: the statistic's name (``"expert_load"``).
            value: a tensor of any shape.
        """
        self.statistics[name] = value.detach()

    def after_step(self, reduce: Callable[[Tensor], Tensor]) -> None:
        """What the part does after each optimizer step (nothing here; :func:`step_parts` calls it).

        Args:
            reduce: sums a tensor over the processes of a data-parallel run (the identity for one process).
        """


def _records(model: nn.Module) -> list[AuxiliaryLosses]:
    # The library's record type found like parameters are: by what the modules hold, not by what they are.
    return [module for module in model.modules() if isinstance(module, AuxiliaryLosses)]


def auxiliary_loss(model: nn.Module) -> Union[Tensor, float]:
    """The sum of the terms ``model``'s parts recorded, each times its weight: a scalar tensor (``0.0`` without terms).

    Args:
        model: the model (or a DDP or ``torch.compile`` wrapper of it), after its forward pass.
    """
    total: Union[Tensor, float] = 0.0
    for record in _records(model):
        for weight, value in record.losses.values():
            if weight:
                total = total + weight * value.float()
    return total


def auxiliary_terms(model: nn.Module) -> dict[str, float]:
    """Each term's value, averaged over the parts that recorded it, for the log (one read of the device).

    Args:
        model: the model (or a wrapper), after its forward pass.

    Returns:
        ``{name: mean value}`` (unweighted), in the order the terms were first met; empty without terms.
    """
    values: dict[str, list[Tensor]] = {}
    for record in _records(model):
        for name, (_, value) in record.losses.items():
            values.setdefault(name, []).append(value.detach().float())
    if not values:
        return {}
    means = torch.stack([torch.stack(v).mean() for v in values.values()]).tolist()
    return dict(zip(values, means))


def auxiliary_statistics(model: nn.Module) -> dict[str, list[Tensor]]:
    """Each statistic the parts noted in their latest call, one tensor per part, in the order of the modules.

    Args:
        model: the model (or a wrapper), after its forward pass.

    Returns:
        ``{name: [tensor of the first part that noted it, ...]}``.
    """
    found: dict[str, list[Tensor]] = {}
    for record in _records(model):
        for name, value in record.statistics.items():
            found.setdefault(name, []).append(value)
    return found


def step_parts(model: nn.Module, reduce: Optional[Callable[[Tensor], Tensor]] = None) -> None:
    """Call every part's :meth:`AuxiliaryLosses.after_step`: once per optimizer step, after ``optimizer.step()``.

    Args:
        model: the model (or a wrapper).
        reduce: sums a tensor over the processes (``torchformer.train.distributed.all_reduce_sum``); ``None``: one.
    """
    for record in _records(model):
        record.after_step(reduce if reduce is not None else (lambda t: t))
