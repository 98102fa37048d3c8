"""Training on several processes (GPUs, machines) with PyTorch's own engines: DDP and FSDP2.

``torchrun`` starts one process per GPU and tells each who it is through environment variables (``RANK``, its
number among all processes; ``WORLD_SIZE``, how many there are; ``LOCAL_RANK``, its number on this machine). This
module turns that into a few lines of research code::

    run = setup_distributed()                     # a single process when not started by torchrun
    model = wrap_model(GTransformer(...).to(run.device), strategy="fsdp")
    optimizer = torch.optim.AdamW(model.parameters())   # after wrapping: FSDP2 replaces the parameters
    for batch in shard(batches):                  # this process's share of the data
        ...
    loss = all_reduce_mean(loss.item())           # the same figure on every process
    if run.is_main:
        print(loss)
    del model, optimizer                          # let go of the model first (see teardown_distributed)
    teardown_distributed()

Two strategies, both PyTorch's:

* ``"ddp"`` (``DistributedDataParallel``): every process holds the whole model and optimizer, and the gradients are
  averaged across processes in the backward pass. Simple and fast while the model fits on one GPU.
* ``"fsdp"`` (FSDP2, ``torch.distributed.fsdp.fully_shard``): parameters, gradients and optimizer state are split
  into ``world_size`` shards, one per process; each block's parameters are gathered just before it runs and freed
  after. Memory per GPU falls with the number of GPUs, for more communication. Each transformer block is sharded
  on its own (so only one block is ever whole at a time), then the root module (embeddings, head, final norm).

Averaging the gradients over processes means that one step on ``n`` processes with ``b`` examples each is one step
on the ``n * b`` examples together, exactly as one process would take it (up to the order of float additions).

Outside ``torchrun`` (no ``RANK`` in the environment) everything here works on a single process without a process
group: ``wrap_model`` returns the model as it is, ``shard`` returns everything, the all-reduces return their
input. The same script runs either way.
"""

from __future__ import annotations

import gc
import math
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Optional, Sequence, TypeVar, Union

import torch
import torch.distributed as dist
from torch import nn

from torchformer._checks import check_bool, is_number
from torchformer.models import TransformerModel

STRATEGIES = ("ddp", "fsdp")
T = TypeVar("T")


@dataclass(frozen=True)
class DistributedRun:
    """Who this process is, as :func:`setup_distributed` found out.

    Args:
        rank: this process's number among all processes, ``0 .. world_size - 1``; 0 is the main process.
        world_size: how many processes there are (1 for a single process).
        local_rank: this process's number on its machine; on CUDA, the number of its GPU.
        device: the device it computes on (``cuda:LOCAL_RANK``, or the CPU).
        backend: ``"nccl"`` or ``"gloo"``, or ``None`` for a single process with no process group.
    """

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: Optional[str]

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0, the process that prints, logs and writes files."""
        return self.rank == 0


def setup_distributed(*, device: Union[str, torch.device, None] = None,
                      timeout: Optional[timedelta] = None) -> DistributedRun:
    """Join the processes ``torchrun`` started, or set up a single process when it did not start this one.

    Calling it again in a process that already joined returns the same answer.

    Args:
        device: ``"cuda"`` or ``"cpu"``; default CUDA when available. On CUDA each process takes the GPU
            ``cuda:LOCAL_RANK`` and the processes talk over NCCL; on the CPU over gloo.
        timeout: how long a collective operation waits for the other processes before failing (default
            PyTorch's, 10 minutes for NCCL and 30 for gloo). A short one makes a crashed process fail the
            others quickly instead of leaving them waiting.

    Returns:
        This process's :class:`DistributedRun`: rank 0 of 1 with ``backend=None`` outside ``torchrun``.

    Raises:
        ValueError: ``device`` is neither CUDA nor the CPU, or CUDA is not available; ``RANK``, ``WORLD_SIZE`` or
            ``LOCAL_RANK`` is malformed; or ``LOCAL_RANK`` has no GPU on this machine.
    """
    kind = _device_type(device)
    if "RANK" not in os.environ:  # not started by torchrun: one process, no process group
        return DistributedRun(rank=0, world_size=1, local_rank=0, device=torch.device(kind), backend=None)
    rank, world_size = _env_int("RANK", minimum=0), _env_int("WORLD_SIZE", minimum=1)
    local_rank = _env_int("LOCAL_RANK", minimum=0) if "LOCAL_RANK" in os.environ else rank
    if rank >= world_size:
        raise ValueError(f"RANK must be below WORLD_SIZE ({world_size}), got {rank}")
    if kind == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise ValueError(f"LOCAL_RANK {local_rank} has no GPU: this machine has {torch.cuda.device_count()}; "
                             f"start at most that many processes per machine (torchrun --nproc_per_node)")
        torch.cuda.set_device(local_rank)  # before the process group, so NCCL binds each process to its own GPU
        device_, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device_, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        options = {} if timeout is None else {"timeout": timeout}
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size, **options)
    return DistributedRun(rank=rank, world_size=world_size, local_rank=local_rank, device=device_, backend=backend)


def teardown_distributed() -> None:
    """Wait for every process, then leave the process group (nothing to do for a single process).

    Call it once the wrapped models are gone (say, after the function that trained returns): a model freed after
    its process group was destroyed may hold the group's last reference, and destroying a gloo group from there can
    deadlock (its thread waits for the interpreter lock that the destructor holds; seen with torch 2.13) or abort
    the process as it exits. A model sharded by FSDP2 is not freed when its last name goes: its hooks and its
    sharding state refer to each other, a reference cycle that waits for Python's garbage collector, which might
    run only at exit. So this function collects garbage first, freeing such models while their group is alive.
    """
    if dist.is_initialized():
        gc.collect()  # models in reference cycles (FSDP2's) are freed now, not after the group is gone
        dist.barrier()  # no process leaves while another may still talk to it (a save, a last all-reduce)
        dist.destroy_process_group()


def rank_and_world_size() -> tuple[int, int]:
    """``(rank, world_size)`` of this process; ``(0, 1)`` without a process group.

    Returns:
        ``(rank, world_size)`` of the default process group.
    """
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_main_process() -> bool:
    """Whether this process is rank 0 (or the only one): the one that prints, logs and writes files.

    Returns:
        True on rank 0 and without a process group.
    """
    return rank_and_world_size()[0] == 0


def wrap_model(model: nn.Module, *, strategy: str, mixed_precision: bool = True,
               blocks: Optional[Sequence[nn.Module]] = None) -> nn.Module:
    """``model`` made data-parallel over the process group: ``strategy="ddp"`` or ``"fsdp"`` (FSDP2).

    Move the model to ``run.device`` first, and build the optimizer after wrapping (FSDP2 replaces each
    parameter with a sharded ``DTensor``).

    Args:
        model: the model, on its device.
        strategy: ``"ddp"``, or ``"fsdp"``: shards the model in place with ``fully_shard``, each of ``blocks`` on
            its own and then the whole.
        mixed_precision: with FSDP on CUDA, compute in bfloat16 (``MixedPrecisionPolicy(param_dtype=bfloat16,
            reduce_dtype=float32)``: parameters are gathered in bf16, gradients averaged in fp32, and the
            sharded master weights stay fp32). Ignored on the CPU and by DDP, where mixed precision is the
            training loop's ``autocast``.
        blocks: the modules FSDP shards one at a time; default ``model.transformer_blocks()`` for a torchformer
            model. Pass them for any other module.

    Returns:
        The data-parallel model: a ``DistributedDataParallel`` around ``model`` for ``"ddp"``, ``model`` itself
        (sharded; the same object, still a ``TransformerModel``) for ``"fsdp"``, and ``model`` unchanged without a
        process group.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``, ``mixed_precision`` is not a bool, or ``blocks`` is missing
            for a model that is not a torchformer model.
        ValueError: ``strategy`` is neither ``"ddp"`` nor ``"fsdp"``.
        RuntimeError: ``"fsdp"`` on a torch without FSDP2 (before 2.6), also for a single process.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be 'ddp' or 'fsdp', got {strategy!r}")
    check_bool(mixed_precision, "mixed_precision")
    if blocks is None:
        if not isinstance(model, TransformerModel):
            raise TypeError(f"blocks must be given for a {type(model).__name__}, which is not a torchformer model: "
                            f"pass the modules FSDP should shard one by one (e.g. its transformer blocks)")
        blocks = model.transformer_blocks()
    blocks = list(blocks)
    if strategy == "fsdp":
        fully_shard, MixedPrecisionPolicy = _fsdp2()  # fails here, also for one process, on a torch without FSDP2
    if not dist.is_initialized():
        return model
    device = next(model.parameters()).device
    if strategy == "ddp":
        return nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)

    if mixed_precision and device.type == "cuda":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        policy = MixedPrecisionPolicy()
    # The mesh is the model's own device type. Left to itself, fully_shard builds one for the machine's
    # accelerator: a CPU (gloo) run on a machine with one GPU would put every process on that GPU's index.
    from torch.distributed.device_mesh import init_device_mesh  # here: only a build with distributed has it

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)  # the rest: embeddings, head, final norm
    return model


def shard(items: Sequence[T]) -> Sequence[T]:
    """This process's share of ``items``: every ``world_size``-th one, starting at its ``rank``.

    Shares differ in length by at most one; a single process gets all of them.

    Args:
        items: anything that slices like a list (a list, a range, a tensor's first dimension).

    Returns:
        ``items[rank::world_size]``, of the type slicing gives.
    """
    rank, world_size = rank_and_world_size()
    return items[rank::world_size]


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """The element-wise sum of ``values`` over all processes (a new tensor; ``values`` itself for one process).

    Every process must call it with the same shape. Sums of counts and of float64 totals are what evaluations
    combine: the sum of every process's bits and bytes is the whole data's, where a mean of means would not be.

    Args:
        values: a tensor of any shape and dtype, on any device (it travels to the backend's device and back).

    Returns:
        The sums, shaped and placed as ``values``, detached.

    Raises:
        TypeError: ``values`` is not a tensor.
    """
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"values must be a tensor, got {type(values).__name__}")
    if not dist.is_initialized():
        return values
    # NCCL reduces only CUDA tensors, gloo CPU ones.
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    summed = values.detach().to(device, copy=True)
    dist.all_reduce(summed, op=dist.ReduceOp.SUM)
    return summed.to(values.device)


def all_reduce_mean(value: float) -> float:
    """The mean of a number (say each process's loss) over all processes; the same on every process.

    Args:
        value: this process's number, finite.

    Returns:
        The mean over the processes (summed in float64); ``value`` itself for one process.

    Raises:
        ValueError: ``value`` is not a finite number.
    """
    if not is_number(value) or not math.isfinite(value):
        raise ValueError(f"value must be a finite number, got {value!r}")
    _, world_size = rank_and_world_size()
    return all_reduce_sum(torch.tensor(float(value), dtype=torch.float64)).item() / world_size


def _fsdp2():
    """``(fully_shard, MixedPrecisionPolicy)``: FSDP2, public in ``torch.distributed.fsdp`` from torch 2.6 on."""
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError as e:
        raise RuntimeError(f"strategy='fsdp' needs FSDP2 (torch.distributed.fsdp.fully_shard, torch >= 2.6), and "
                           f"this is torch {torch.__version__}: upgrade torch, or use strategy='ddp'") from e
    return fully_shard, MixedPrecisionPolicy


def _device_type(device: object) -> str:
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}") from e
    if kind not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError("device is 'cuda', but CUDA is not available on this machine; use 'cpu'")
    return kind


def _env_int(name: str, *, minimum: int) -> int:
    text = os.environ.get(name)
    if text is None:
        raise ValueError(f"the environment variable {name} is not set; start the script with torchrun, which sets "
                         f"RANK, WORLD_SIZE and LOCAL_RANK")
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ValueError(f"the environment variable {name} must be an integer >= {minimum}, got {text!r}")
    return value
