"""The optimizers the example scripts choose from: Adam, and Muon for the blocks' matrices with Adam for the rest.

**Muon** (Jordan et al. 2024, the optimizer of the modded-nanogpt speedruns; ``torch.optim.Muon`` since torch 2.9)
keeps a momentum of the gradient, like SGD, but before it steps it replaces the momentum matrix ``G`` by the
nearest *orthogonal* matrix, ``U V^T`` of ``G = U S V^T`` (five Newton–Schulz iterations approximate it without an
SVD). Every direction of the update then has the same size: the rare directions of a gradient get as large a step
as the dominant ones.

The orthogonalisation is defined for matrices and meant for the hidden layers, so :func:`muon_split` gives **Muon**
the 2-D weights inside the transformer blocks and **Adam** everything else (embeddings, the output layer, norms'
gains, biases). One learning rate drives both: Muon rescales its update to Adam's typical size
(``adjust_lr_fn="match_rms_adamw"``, 0.2 times the square root of the larger side). :class:`MuonWithAdam` is one
``torch.optim.Optimizer`` over the two, so schedulers, checkpoints and training loops treat it as any optimizer.
docs/training.md ("The optimizer") tells more, with the measured gain.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch import nn

from torchformer._checks import check_choice, is_number
from torchformer.models import TransformerModel
from torchformer.saving import unwrap_model

try:  # torch >= 2.5, where torch.distributed is built
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - no distributed build: nothing can be sharded
    DTensor = ()

OPTIMIZERS = ("adam", "muon")


def muon_split(model: nn.Module, blocks: Optional[Sequence[nn.Module]] = None) -> tuple[list, list]:
    """``(matrices, rest)``: the 2-D weights inside ``blocks`` (for Muon), and every other parameter (for Adam).

    Args:
        model: the model (unwrapped; DDP's ``module``).
        blocks: its transformer blocks; default ``model.transformer_blocks()`` for a torchformer model.

    Returns:
        Two lists of parameters, each in ``model.parameters()`` order, together every parameter once.

    Raises:
        TypeError: ``blocks`` is missing for a model that is not a torchformer model.
    """
    if blocks is None:
        if not isinstance(model, TransformerModel):
            raise TypeError(f"blocks must be given for a {type(model).__name__}, which is not a torchformer model")
        blocks = model.transformer_blocks()
    inside = {id(p) for block in blocks for p in block.parameters() if p.dim() == 2}
    matrices = [p for p in model.parameters() if id(p) in inside]
    rest = [p for p in model.parameters() if id(p) not in inside]
    return matrices, rest


class MuonWithAdam(torch.optim.Optimizer):
    """Muon for ``matrices``, Adam for ``rest``: one optimizer with two parameter groups (0: Muon, 1: Adam).

    The groups are the two inner optimizers' own, so a scheduler that sets ``group["lr"]`` sets it for the one that
    steps with it. ``step`` runs Muon, then Adam.

    Args:
        matrices: 2-D parameters (:func:`muon_split`).
        rest: every other parameter.
        lr: the learning rate of both.
        fused: the fused Adam kernel (CUDA).
    """

    def __init__(self, matrices: list, rest: list, *, lr: float, fused: bool = False) -> None:
        if any(p.dim() != 2 for p in matrices):
            raise ValueError("matrices must hold 2-D parameters only: Muon orthogonalises matrices")
        # Weight decay off in both: the same update rule as the plain Adam it is compared with, but for Muon.
        self.muon = torch.optim.Muon(matrices, lr=lr, weight_decay=0.0, adjust_lr_fn="match_rms_adamw")
        self.adam = torch.optim.Adam(rest, lr=lr, fused=fused or None)
        groups = self.muon.param_groups + self.adam.param_groups  # the same dicts: one lr for each, shared
        super().__init__(groups, defaults={})
        self._share_state()

    def _share_state(self) -> None:
        """One state per parameter, the inner optimizers' own, seen here too (for ``state_dict``)."""
        self.state.update(self.muon.state)
        self.state.update(self.adam.state)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One step of both: Muon on group 0, Adam on group 1.

        Args:
            closure: re-evaluates the model and returns the loss (as for any torch optimizer), or ``None``.

        Returns:
            The closure's loss, or ``None``.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.muon.step()
        self.adam.step()
        if len(self.state) < len(self.muon.state) + len(self.adam.state):  # only after a first step: new entries
            self._share_state()
        return loss

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore both, groups and per-parameter state, from what ``state_dict()`` returned.

        Args:
            state_dict: the saved state.
        """
        super().load_state_dict(state_dict)
        # torch built new groups and a new state here: the inner optimizers step with them from now on.
        self.muon.param_groups, self.adam.param_groups = self.param_groups[:1], self.param_groups[1:]
        for inner in (self.muon, self.adam):
            params = [p for group in inner.param_groups for p in group["params"]]
            inner.state.update({p: self.state[p] for p in params if p in self.state})


def make_optimizer(model: nn.Module, name: str, *, lr: float, fused: bool = False,
                   blocks: Optional[Sequence[nn.Module]] = None) -> torch.optim.Optimizer:
    """The optimizer ``name`` over ``model``'s parameters: ``"adam"``, or ``"muon"`` (:class:`MuonWithAdam`).

    Build it after wrapping the model for DDP (the parameters are the same objects). FSDP2 shards each matrix over
    the processes, and Muon needs whole matrices: ``"muon"`` with a sharded model is refused.

    Args:
        model: the model, or a wrapper (DDP, ``torch.compile``) around it.
        name: ``"adam"`` or ``"muon"``.
        lr: the learning rate.
        fused: the fused Adam kernel (CUDA only).
        blocks: the transformer blocks, for a model that is not a torchformer model (see :func:`muon_split`).

    Returns:
        The optimizer.

    Raises:
        ValueError: ``name`` is neither, ``lr`` is negative or not a number, or ``"muon"`` for an FSDP2-sharded model.
    """
    check_choice(name, "optimizer", OPTIMIZERS)
    if not is_number(lr) or not lr >= 0:  # 0: an optimizer that does all the work of a step and changes nothing
        raise ValueError(f"lr must be a non-negative number, got {lr!r}")
    if name == "adam":
        return torch.optim.Adam(model.parameters(), lr=lr, fused=fused or None)
    inner = unwrap_model(model)  # DDP's module, torch.compile's original
    if any(isinstance(p, DTensor) for p in inner.parameters()):
        raise ValueError("optimizer 'muon' needs whole matrices, but the model is sharded (FSDP2): use strategy "
                         "'ddp', or the optimizer 'adam'")
    matrices, rest = muon_split(inner, blocks)
    return MuonWithAdam(matrices, rest, lr=lr, fused=fused)
