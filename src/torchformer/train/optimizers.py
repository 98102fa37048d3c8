"""The optimizers the example scripts choose from: Adam, and Muon for the blocks' matrices with Adam for the rest.

**Muon** (Jordan et al. 2024, the optimizer of the modded-nanogpt speedruns; ``torch.optim.Muon`` since torch 2.9)
keeps a momentum of the gradient, like SGD, but before it steps it replaces the momentum matrix ``G`` by the
nearest *orthogonal* matrix, ``U V^T`` of ``G = U S V^T`` (five Newton–Schulz iterations approximate it without an
SVD). Every direction of the update then has the same size: the rare directions of a gradient get as large a step
as the dominant ones.

The orthogonalisation is defined for matrices and meant for the hidden layers, so :func:`muon_split` gives **Muon**
the 2-D weights inside the transformer blocks and **Adam** everything else (embeddings, the output layer, norms'
gains, biases); a weight of more than 2 dims there, such as a mixture's experts, is a stack of matrices, each stepped
alone. :class:`Muon` steps both as ``torch.optim.Muon`` steps a matrix, with the iterations in bfloat16 on CUDA and
float32 elsewhere (CPUs without bfloat16 matrix units emulate it, many times slower). One learning rate drives
both: Muon rescales its update to Adam's typical size
(``adjust_lr_fn="match_rms_adamw"``, 0.2 times the square root of the larger side). :class:`MuonWithAdam` is one
``torch.optim.Optimizer`` over the two, so schedulers, checkpoints and training loops treat it as any optimizer.
docs/training.md ("The optimizer") tells more, with the measured gain.

Under FSDP2 each process holds some rows of every matrix, and Muon needs whole ones: :class:`ShardedMuon` keeps the
momentum of its own rows (momentum is element-wise), and hands each matrix to one process, which gathers its rows,
orthogonalises it and sends every process its rows of the result (docs/going-big.md, "Muon on sharded matrices").
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import torch
from torch import Tensor, nn

from torchformer._checks import check_choice, check_positive_int, is_number
from torchformer.models import TransformerModel
from torchformer.saving import unwrap_model

try:  # torch >= 2.5, where torch.distributed is built
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Shard
except ImportError:  # pragma: no cover - no distributed build: nothing can be sharded
    DTensor = ()

OPTIMIZERS = ("adam", "muon")


def muon_split(model: nn.Module, blocks: Optional[Sequence[nn.Module]] = None) -> tuple[list, list]:
    """``(matrices, rest)``: the weights of 2 or more dims inside ``blocks`` (for Muon), and the others (for Adam).

    A weight of more than 2 dims is a stack of matrices ``(..., m, n)``, such as a mixture's experts ``(E, e, h)``
    (:class:`Muon` steps each of its matrices); a mixture's router ``(E, e)`` is a matrix of the blocks too.

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
    inside = {id(p) for block in blocks for p in block.parameters() if p.dim() >= 2}
    matrices = [p for p in model.parameters() if id(p) in inside]
    rest = [p for p in model.parameters() if id(p) not in inside]
    return matrices, rest


def orthogonalise(matrix: Tensor, *, coefficients: tuple[float, float, float], steps: int, eps: float,
                  dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """Muon's approximation of ``U V^T`` for ``matrix = U S V^T``: quintic Newton–Schulz iterations in ``dtype``.

    The iteration ``X <- a X + (b X X^T + c (X X^T)^2) X`` pushes every singular value of ``X`` towards 1 (roughly:
    into 0.5 .. 1.5) and keeps the singular vectors, starting from ``matrix`` divided by its Frobenius norm (so no
    singular value is above 1). It runs on the wide side, so the Gram matrix ``X X^T`` is the smaller one.
    For a matrix in bfloat16, ``torch.optim.Muon``'s operations in its order: the same numbers. A stack of matrices
    is orthogonalised matrix by matrix, in one batched product per step.

    Args:
        matrix: ``(m, n)``, or a stack ``(..., m, n)``.
        coefficients: ``(a, b, c)``.
        steps: the iterations.
        eps: the smallest norm divided by (a zero matrix stays zero).
        dtype: the dtype the iterations run in (``torch.optim.Muon``'s: bfloat16).

    Returns:
        ``matrix``'s shape, in ``dtype``.
    """
    a, b, c = coefficients
    tall = matrix.size(-2) > matrix.size(-1)
    if matrix.dim() > 2:  # (..., m, n) -> (B, m', n'), each matrix divided by its own norm
        x = matrix.to(dtype).flatten(0, -3)
        x = x.mT if tall else x
        x = x / x.norm(dim=(1, 2), keepdim=True).clamp(min=eps)
        for _ in range(steps):
            gram = x @ x.mT  # (B, m', m')
            x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
        return (x.mT if tall else x).reshape(matrix.shape)
    x = matrix.to(dtype).T if tall else matrix.to(dtype)  # (m', n') with m' <= n'
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T  # (m', m')
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)  # a x + (b G + c G G) x
    return x.T if tall else x


def _iteration_dtype(device: torch.device, ns_dtype: Optional[torch.dtype]) -> torch.dtype:
    """The dtype Muon's iterations run in on ``device``: ``ns_dtype`` if given, else bfloat16 on CUDA (fast there,
    and ``torch.optim.Muon``'s choice) and float32 elsewhere (a CPU without bfloat16 matrix units emulates
    bfloat16 products, many times slower than float32's)."""
    if ns_dtype is not None:
        return ns_dtype
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def _check_ns_dtype(ns_dtype: Any) -> None:
    """``ns_dtype``'s door: ``None`` or a floating-point dtype, else a ``TypeError`` naming it."""
    if ns_dtype is not None and not (isinstance(ns_dtype, torch.dtype) and ns_dtype.is_floating_point):
        raise TypeError(f"ns_dtype must be None or a floating-point torch.dtype, got {ns_dtype!r}")


def muon_lr(lr: float, adjust_lr_fn: Optional[str], shape: Sequence[int]) -> float:
    """The learning rate Muon steps a matrix of ``shape`` ``(A, B)`` with (``torch.optim.Muon``'s adjustment).

    Args:
        lr: the group's learning rate.
        adjust_lr_fn: ``"match_rms_adamw"`` (``0.2 sqrt(max(A, B))`` times ``lr``, Adam's typical update size),
            ``"original"`` or ``None`` (``sqrt(max(1, A / B))`` times ``lr``).
        shape: the whole matrix's shape.

    Returns:
        The rescaled learning rate.
    """
    rows, cols = shape[:2]
    if adjust_lr_fn == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    return lr * math.sqrt(max(1.0, rows / cols))


def row_shares(rows: int, world_size: int) -> list[int]:
    """How many rows of a matrix of ``rows`` each of ``world_size`` processes holds under FSDP2.

    FSDP2 splits the first dimension as ``torch.chunk`` does: ``ceil(rows / n)`` rows each, the last processes fewer
    or none.

    Args:
        rows: the matrix's first dimension.
        world_size: the processes it is sharded over.

    Returns:
        One count per process, summing to ``rows``.
    """
    share = -(-rows // world_size)  # ceil
    return [max(0, min(share, rows - rank * share)) for rank in range(world_size)]


def _momentum_update(state: dict, grad: Tensor, group: dict) -> Tensor:
    """``torch.optim.Muon``'s momentum: the buffer in ``state`` moved towards ``grad``; returns the update."""
    if "momentum_buffer" not in state:
        state["momentum_buffer"] = torch.zeros_like(grad)
    buf = state["momentum_buffer"]
    buf.lerp_(grad, 1 - group["momentum"])
    return grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf


def _run_closure(closure: Any) -> Any:
    """The loss of an optimizer's ``closure``, computed with autograd on (``step`` runs under no_grad), or ``None``."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


class ShardedMuon(torch.optim.Muon):
    """``torch.optim.Muon`` for matrices that FSDP2 shards by rows: the same step, each matrix orthogonalised whole.

    Each process holds some rows of every parameter, of its gradient and (here) of its momentum, which is
    element-wise: each process updates its own rows. The orthogonalisation is not: matrix ``i`` of a group goes to
    process ``i mod n``, which gathers its rows from every process, orthogonalises it (:func:`orthogonalise`) and
    sends each process its rows of the result; every process owns about ``1/n`` of the work. The rows travel in
    the iterations' dtype (as :class:`Muon`'s), so the step is one process's :class:`Muon` step on the whole
    matrices, up to the order of the additions in the gradients' reduction. The state is ``torch.optim.Muon``'s
    (``momentum_buffer``, sharded as the parameter), so the distributed checkpoints gather it and load it into any
    number of processes, also into a :class:`Muon` of one process, and the other way (:func:`~torchformer.train.distributed_checkpoint.load_distributed_checkpoint` shards it; a plain
    ``load_state_dict`` of a one-process state does not).

    Args:
        params: 2-D parameters that FSDP2 sharded (``DTensor`` with the placement ``Shard(0)`` on a 1-D mesh).
        ns_dtype: the iterations' dtype, as :class:`Muon`'s.
        **options: ``torch.optim.Muon``'s (``lr``, ``momentum``, ``adjust_lr_fn``, ...).

    Raises:
        ValueError: a parameter is not a ``DTensor`` sharded by rows over a 1-D mesh, or the parameters lie on
            several meshes.
        TypeError: ``ns_dtype`` is not a floating-point dtype.
    """

    def __init__(self, params: Any, *, ns_dtype: Optional[torch.dtype] = None, **options: Any) -> None:
        _check_ns_dtype(ns_dtype)
        super().__init__(params, **options)
        self.ns_dtype = ns_dtype
        meshes = []
        for group in self.param_groups:
            for p in group["params"]:
                if not isinstance(p, DTensor) or p.device_mesh.ndim != 1 or tuple(p.placements) != (Shard(0),):
                    raise ValueError(f"ShardedMuon needs matrices that FSDP2 shards by rows (a DTensor placed "
                                     f"Shard(0) on a 1-D mesh), got a {type(p).__name__} of shape "
                                     f"{tuple(p.shape)} placed {getattr(p, 'placements', None)}")
                meshes.append(p.device_mesh)
        if any(mesh != meshes[0] for mesh in meshes):
            raise ValueError("ShardedMuon needs every matrix on one device mesh (the processes that gather and "
                             "scatter them), got several")

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One Muon step of every matrix with a gradient; every process of the mesh must call it.

        Args:
            closure: re-evaluates the model and returns the loss, or ``None``.

        Returns:
            The closure's loss, or ``None``.
        """
        loss = _run_closure(closure)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            updates = []
            for p in params:  # on this process's rows
                updates.append(_momentum_update(self.state[p], p.grad, group))
            ortho = self._orthogonalise_whole(updates, group)
            for p, rows in zip(params, ortho):
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.to_local().add_(rows, alpha=-muon_lr(group["lr"], group["adjust_lr_fn"], p.shape))
        return loss

    def _orthogonalise_whole(self, updates: list, group: dict) -> list[Tensor]:
        """This process's rows of each update orthogonalised whole: gathered to its owner, sent back in rows."""
        if not updates:
            return []
        process_group = updates[0].device_mesh.get_group()
        world, rank = dist.get_world_size(process_group), dist.get_rank(process_group)
        owners = [dist.get_global_rank(process_group, i % world) for i in range(len(updates))]
        shares = [row_shares(u.size(0), world) for u in updates]
        dtype = _iteration_dtype(updates[0].to_local().device, self.ns_dtype)
        for u, share in zip(updates, shares):  # before any collective: a process that raised would leave the others
            if u.to_local().size(0) != share[rank]:  # waiting in one
                raise ValueError(f"ShardedMuon: this process holds {u.to_local().size(0)} rows of a "
                                 f"{tuple(u.shape)} matrix, where FSDP2's split gives {share[rank]}")
        # 1. Every process sends its rows of matrix i to matrix i's owner, padded to the largest share.
        received, works = [], []
        for u, share, owner in zip(updates, shares, owners):
            local = u.to_local()
            padded = local.new_zeros(max(share), u.size(1), dtype=dtype)
            padded[:share[rank]] = local
            pieces = [torch.empty_like(padded) for _ in range(world)] if dist.get_rank() == owner else None
            works.append(dist.gather(padded, pieces, dst=owner, group=process_group, async_op=True))
            received.append(pieces)
        for work in works:
            work.wait()
        # 2. Each owner orthogonalises its matrices whole, cut into every process's padded rows.
        options = {"coefficients": group["ns_coefficients"], "steps": group["ns_steps"], "eps": group["eps"],
                   "dtype": dtype}
        outgoing = []
        for pieces, share in zip(received, shares):
            if pieces is None:
                outgoing.append(None)
                continue
            whole = torch.cat([piece[:n] for piece, n in zip(pieces, share)])  # (A, B)
            result = orthogonalise(whole, **options).split(share)
            outgoing.append([torch.cat([r, r.new_zeros(max(share) - n, r.size(1))]) for r, n in zip(result, share)])
        # 3. Each owner sends every process its rows of the result.
        rows, works = [], []
        for u, share, owner, pieces in zip(updates, shares, owners, outgoing):
            mine = torch.empty(max(share), u.size(1), dtype=dtype, device=u.to_local().device)
            works.append(dist.scatter(mine, pieces, src=owner, group=process_group, async_op=True))
            rows.append((mine, share[rank]))
        for work in works:
            work.wait()
        return [mine[:n] for mine, n in rows]


class Muon(torch.optim.Optimizer):
    """``torch.optim.Muon``'s step for matrices ``(m, n)`` and stacks of matrices ``(..., m, n)``, in a chosen dtype.

    A mixture's experts ``(E, e, h)`` are such a stack. The momentum is element-wise; the orthogonalisation
    (:func:`orthogonalise`, one batched product per iteration for a stack) and the learning rate's adjustment
    (:func:`muon_lr` of ``(m, n)``) are per matrix. The iterations run in ``ns_dtype``; by default bfloat16 on CUDA
    (there a matrix takes ``torch.optim.Muon``'s step) and float32 elsewhere. FSDP2 shards a stack along its first
    dimension, so each process holds whole matrices and steps its own, without communication (a sharded matrix
    needs :class:`ShardedMuon`). The state is ``torch.optim.Muon``'s (``momentum_buffer``, sharded as the
    parameter), and so are the groups: checkpoints move between the two.

    Args:
        params: parameters of 2 or more dims; stacks may be FSDP2's ``DTensor`` placed ``Shard(0)`` on a 1-D mesh.
        lr: the learning rate, adjusted per matrix by ``adjust_lr_fn``.
        weight_decay: decoupled weight decay.
        momentum: the momentum's factor.
        nesterov: Nesterov momentum.
        ns_coefficients: the Newton–Schulz coefficients ``(a, b, c)``.
        eps: the smallest norm divided by.
        ns_steps: the Newton–Schulz iterations.
        adjust_lr_fn: ``None``, ``"original"`` or ``"match_rms_adamw"`` (:func:`muon_lr`).
        ns_dtype: the iterations' dtype; ``None``: bfloat16 on CUDA, float32 elsewhere.

    All but ``ns_dtype`` as ``torch.optim.Muon``'s, with its defaults.

    Raises:
        ValueError: a parameter has fewer than 2 dims, is a sharded matrix or is sharded otherwise than
            ``Shard(0)`` on a 1-D mesh; ``lr``, ``weight_decay`` or ``momentum`` is negative, ``eps`` or
            ``ns_steps`` not positive, ``adjust_lr_fn`` none of the three.
        TypeError: ``ns_dtype`` is not a floating-point dtype.
    """

    def __init__(self, params: Any, lr: float = 1e-3, weight_decay: float = 0.1, momentum: float = 0.95,
                 nesterov: bool = True, ns_coefficients: tuple[float, float, float] = (3.4445, -4.775, 2.0315),
                 eps: float = 1e-7, ns_steps: int = 5, adjust_lr_fn: Optional[str] = None,
                 ns_dtype: Optional[torch.dtype] = None) -> None:
        for value, name in ((lr, "lr"), (weight_decay, "weight_decay"), (momentum, "momentum")):
            if not is_number(value) or not value >= 0:
                raise ValueError(f"{name} must be a non-negative number, got {value!r}")
        if not is_number(eps) or not eps > 0:
            raise ValueError(f"eps must be a positive number, got {eps!r}")
        check_positive_int(ns_steps, "ns_steps")
        check_choice(adjust_lr_fn, "adjust_lr_fn", (None, "original", "match_rms_adamw"))
        _check_ns_dtype(ns_dtype)
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_coefficients=ns_coefficients, eps=eps, ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn)
        super().__init__(params, defaults)
        # Not a group option: the dtype is how the step is computed, not what it is (checkpoints stay torch's).
        self.ns_dtype = ns_dtype
        for group in self.param_groups:
            for p in group["params"]:
                sharded = isinstance(p, DTensor)
                if p.dim() < 2 or sharded and (p.dim() < 3 or p.device_mesh.ndim != 1
                                               or tuple(p.placements) != (Shard(0),)):
                    raise ValueError(f"Muon needs matrices or stacks of matrices (2 or more dims; under FSDP2 "
                                     f"stacks placed Shard(0) on a 1-D mesh, sharded matrices need ShardedMuon), "
                                     f"got shape {tuple(p.shape)} placed {getattr(p, 'placements', None)}")

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One Muon step of every matrix of every parameter with a gradient.

        Args:
            closure: re-evaluates the model and returns the loss, or ``None``.

        Returns:
            The closure's loss, or ``None``.
        """
        loss = _run_closure(closure)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                update = _momentum_update(self.state[p], p.grad, group)
                local = _local(update)  # whole matrices under FSDP2 too: the stack is split along its first dim
                ortho = orthogonalise(local, coefficients=group["ns_coefficients"], steps=group["ns_steps"],
                                      eps=group["eps"], dtype=_iteration_dtype(local.device, self.ns_dtype))
                p.mul_(1 - group["lr"] * group["weight_decay"])
                _local(p).add_(ortho, alpha=-muon_lr(group["lr"], group["adjust_lr_fn"], p.shape[-2:]))
        return loss


def _local(tensor: Tensor) -> Tensor:
    """This process's part of an FSDP2-sharded tensor, or the tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class MuonWithAdam(torch.optim.Optimizer):
    """Muon for ``matrices``, Adam for ``rest``: one optimizer with groups 0 (Muon), 1 (Adam) and maybe 2 (stacks).

    Group 2 (:class:`Muon` of the stacks) is there when ``matrices`` holds stacks of matrices. The groups are the inner
    optimizers' own, so a scheduler that sets ``group["lr"]`` sets it for the one that steps with it. ``step`` runs
    Muon, then Adam, then the stacks' Muon.

    Matrices that FSDP2 sharded (``DTensor``) get :class:`ShardedMuon`, which steps them as one process would step
    the whole matrices; others :class:`Muon`, as do stacks.

    Args:
        matrices: parameters of 2 or more dims (:func:`muon_split`), all sharded or none.
        rest: every other parameter.
        lr: the learning rate of all.
        fused: the fused Adam kernel (CUDA).
        ns_dtype: the dtype of Muon's iterations (:class:`Muon`); ``None``: bfloat16 on CUDA, float32 elsewhere.

    Raises:
        ValueError: a matrix has fewer than 2 dims, or some matrices are sharded and others not.
        TypeError: ``ns_dtype`` is not a floating-point dtype.
    """

    def __init__(self, matrices: list, rest: list, *, lr: float, fused: bool = False,
                 ns_dtype: Optional[torch.dtype] = None) -> None:
        if any(p.dim() < 2 for p in matrices):
            raise ValueError("matrices must hold parameters of 2 or more dims only: Muon orthogonalises matrices, "
                             f"got shapes {[tuple(p.shape) for p in matrices if p.dim() < 2]}")
        sharded = [isinstance(p, DTensor) for p in matrices]
        if any(sharded) and not all(sharded):
            raise ValueError(f"matrices must be all sharded (FSDP2) or none, got {sum(sharded)} sharded of "
                             f"{len(matrices)}")
        muon = ShardedMuon if any(sharded) else Muon
        stacks = [p for p in matrices if p.dim() > 2]
        # Weight decay off in all: the same update rule as the plain Adam it is compared with, but for Muon.
        self.muon = muon([p for p in matrices if p.dim() == 2], lr=lr, weight_decay=0.0,
                         adjust_lr_fn="match_rms_adamw", ns_dtype=ns_dtype)
        self.adam = torch.optim.Adam(rest, lr=lr, fused=fused or None)
        self.inner = [self.muon, self.adam]
        if stacks:
            self.inner.append(Muon(stacks, lr=lr, weight_decay=0.0, adjust_lr_fn="match_rms_adamw",
                                   ns_dtype=ns_dtype))
        groups = [group for inner in self.inner for group in inner.param_groups]  # the same dicts: one lr each
        super().__init__(groups, defaults={})
        self._share_state()

    def _share_state(self) -> None:
        """One state per parameter, the inner optimizers' own, seen here too (for ``state_dict``)."""
        for inner in self.inner:
            self.state.update(inner.state)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One step of each inner optimizer, in the groups' order.

        Args:
            closure: re-evaluates the model and returns the loss (as for any torch optimizer), or ``None``.

        Returns:
            The closure's loss, or ``None``.
        """
        loss = _run_closure(closure)
        for inner in self.inner:
            inner.step()
        if len(self.state) < sum(len(inner.state) for inner in self.inner):  # only after a first step: new entries
            self._share_state()
        return loss

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore all, groups and per-parameter state, from what ``state_dict()`` returned.

        Args:
            state_dict: the saved state.
        """
        super().load_state_dict(state_dict)
        # torch built new groups and a new state here: the inner optimizers step with them from now on.
        for inner, group in zip(self.inner, self.param_groups):
            inner.param_groups = [group]
            inner.state.update({p: self.state[p] for p in group["params"] if p in self.state})


def make_optimizer(model: nn.Module, name: str, *, lr: float, fused: bool = False,
                   blocks: Optional[Sequence[nn.Module]] = None,
                   ns_dtype: Optional[torch.dtype] = None) -> torch.optim.Optimizer:
    """The optimizer ``name`` over ``model``'s parameters: ``"adam"``, or ``"muon"`` (:class:`MuonWithAdam`).

    Build it after wrapping the model for DDP or FSDP2 (FSDP2 replaces the parameters with sharded ones, which
    ``"muon"`` then steps with :class:`ShardedMuon`).

    Args:
        model: the model, or a wrapper (DDP, ``torch.compile``) around it.
        name: ``"adam"`` or ``"muon"``.
        lr: the learning rate.
        fused: the fused Adam kernel (CUDA only).
        blocks: the transformer blocks, for a model that is not a torchformer model (see :func:`muon_split`).
        ns_dtype: the dtype of Muon's iterations (:class:`Muon`); ``None``: bfloat16 on CUDA, float32 elsewhere.

    Returns:
        The optimizer.

    Raises:
        ValueError: ``name`` is neither, ``lr`` is negative or not a number, or ``ns_dtype`` is given for Adam.
        TypeError: ``ns_dtype`` is not a floating-point dtype.
    """
    check_choice(name, "optimizer", OPTIMIZERS)
    if name == "adam" and ns_dtype is not None:
        raise ValueError(f"ns_dtype is the dtype of Muon's iterations, got {ns_dtype} for optimizer 'adam'")
    if not is_number(lr) or not lr >= 0:  # 0: an optimizer that does all the work of a step and changes nothing
        raise ValueError(f"lr must be a non-negative number, got {lr!r}")
    if name == "adam":
        return torch.optim.Adam(model.parameters(), lr=lr, fused=fused or None)
    matrices, rest = muon_split(unwrap_model(model), blocks)  # DDP's module, torch.compile's original
    return MuonWithAdam(matrices, rest, lr=lr, fused=fused, ns_dtype=ns_dtype)
