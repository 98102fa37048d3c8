"""Checkpoints of a model trained on several processes (DDP or FSDP2), that resume on any number of processes.

A checkpoint here is one ordinary torchformer checkpoint file (:mod:`torchformer.train.checkpoint`), with every
guarantee of that module: the *full* model and optimizer states, gathered from the shards onto the main process
(``torch.distributed.checkpoint.state_dict`` with ``full_state_dict=True``, PyTorch's own conversion), which writes
it. Whole tensors rather than ``world_size`` shards: a run on 2 processes resumes on 1 or 8, and
:func:`~torchformer.train.loading.load_model` reads it like any checkpoint; a model whose full state does not fit in
one machine's CPU memory needs ``torch.distributed.checkpoint``'s sharded format instead. The optimizer state is
keyed by parameter names, so it fits a model sharded in any way.

Both functions are collective: every process calls them, with the same arguments; when loading, every process reads
the file (on several machines the folder must be shared). The file holds every process's random number
generators: resumed on the same number of processes, each gets its own back and the run continues exactly; on
another number each gets rank 0's, and training continues correctly but not bit for bit (docs/going-big.md,
"Checkpoints across world sizes").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions, get_model_state_dict, get_state_dict, set_model_state_dict, set_state_dict,
)

from torchformer._checks import check_bool
from torchformer._files import check_file_path
from torchformer.saving import unwrap_model
from torchformer.train.checkpoint import (
    PATH_EXAMPLE, PathLike, build_payload, capture_rng_state, check_payload, generator_states, read_payload,
    restore_rng_state, write_payload,
)
from torchformer.train.distributed import rank_and_world_size


def save_distributed_checkpoint(path: PathLike, *, model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                                scheduler: Optional[Any] = None, step: int, extra: Optional[Mapping[str, Any]] = None,
                                generators: Optional[Mapping[str, torch.Generator]] = None,
                                process_state: Any = None) -> Path:
    """Gather the full model and optimizer states onto rank 0, which writes them to ``path`` atomically.

    Every process must call it, with the same arguments. The arguments are those of
    :func:`~torchformer.train.checkpoint.save_checkpoint`; the file also holds every process's generator states.

    Args:
        path: the file to write (e.g. :func:`~torchformer.train.checkpoint.checkpoint_path`); replaced if it exists.
        model: the wrapped model (DDP, FSDP2, ``torch.compile``, or a plain module in a single process).
        optimizer: the optimizer, built after wrapping; its full state is gathered too. ``None``: none saved.
        scheduler: the learning-rate scheduler (anything with ``state_dict()``); ``None``: none saved.
        step: the number of optimizer steps taken so far, a non-negative int.
        extra: plain data the script needs to resume, as for ``save_checkpoint``; ``None``: an empty dict.
        generators: this process's named ``torch.Generator`` objects (each process saves its own states).
        process_state: this process's own data, kept with its generator states (plain data and CPU tensors: a
            segment memory of the batch rows it trains, say); ``None``: none.

    Returns:
        ``path``, on every process, once the file is complete.

    Raises:
        Exception: on rank 0, whatever made the write fail (as ``save_checkpoint`` raises it); on the other
            processes a ``RuntimeError`` quoting it, so that no process waits forever.
    """
    path = check_file_path(path, "path", example=PATH_EXAMPLE)
    target = unwrap_model(model)
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)  # whole tensors, on rank 0's CPU only
    if optimizer is None:
        model_state, optimizer_state = get_model_state_dict(target, options=options), None
    else:
        model_state, optimizer_state = get_state_dict(target, optimizer, options=options)
    ranks = _gather({"rng": capture_rng_state(), "generators": generator_states(generators), "state": process_state})
    error = None
    if ranks is not None:  # the main process
        try:
            payload = build_payload(target, model_state, optimizer, optimizer_state, scheduler, step=step,
                                    extra=extra, generators=generators)
            payload["ranks"] = ranks  # every process's generators, by rank
            write_payload(path, payload)
        except Exception as e:  # noqa: BLE001 - reported on every process below, so none waits forever
            error = e
    message = _broadcast(None if error is None else f"{type(error).__name__}: {error}")
    if error is not None:
        raise error
    if message is not None:
        raise RuntimeError(f"rank 0 could not save the checkpoint {path}: {message}")
    return path


def load_distributed_checkpoint(path: PathLike, *, model: nn.Module,
                                optimizer: Optional[torch.optim.Optimizer] = None, scheduler: Optional[Any] = None,
                                generators: Optional[Mapping[str, torch.Generator]] = None,
                                restore_rng: bool = True) -> dict:
    """Load a checkpoint of :func:`save_distributed_checkpoint` into a model on any number of processes.

    Every process must call it (with the wrapped model, and the optimizer built after wrapping). Each process
    reads the file, checks it as :func:`~torchformer.train.checkpoint.load_checkpoint` does (integrity,
    architecture, keys and shapes, optimizer and scheduler classes) and takes its part of every tensor. It also
    reads checkpoints of :func:`~torchformer.train.checkpoint.save_checkpoint` (a single process's).

    Args:
        path: the checkpoint file, readable by every process (on several machines, a shared folder).
        model: the wrapped model (DDP, FSDP2, ``torch.compile``, or a plain module).
        optimizer: the optimizer to restore, built after wrapping; ``None``: not restored.
        scheduler: the learning-rate scheduler to restore, of the saved class; ``None``: not restored.
        generators: named ``torch.Generator`` objects to restore: each process gets its own saved states when the
            number of processes is the same, else rank 0's.
        restore_rng: also restore the global generators (Python, NumPy, torch), chosen the same way.

    Returns:
        ``{"step": int, "extra": dict, "world_size": int, "process_state": ...}``, ``world_size`` being that of the
        saving run, and ``process_state`` what this process's rank saved as its ``process_state`` (``None`` when
        the number of processes changed, or nothing was saved).

    Raises:
        FileNotFoundError: there is no file at ``path``.
        CheckpointError: the file is empty, truncated, damaged or not a checkpoint.
        ValueError: the checkpoint does not fit the model, optimizer, scheduler or generators (as
            ``load_checkpoint`` says).
        TypeError: ``restore_rng`` is not a bool.
    """
    path = Path(path)
    ckpt = read_payload(path, map_location="cpu", mmap=False, verify=True)
    target = unwrap_model(model)
    state = check_payload(ckpt, path, target, optimizer=optimizer, scheduler=scheduler, generators=generators)
    check_bool(restore_rng, "restore_rng")

    options = StateDictOptions(full_state_dict=True)  # every process passes the whole state and keeps its shard
    if optimizer is None:
        set_model_state_dict(target, state, options=options)
    else:
        saved_keys = {key for group in ckpt["optimizer"].get("param_groups", []) for key in group}
        missing = sorted(saved_keys - {key for group in optimizer.param_groups for key in group} - {"params"})
        if missing:  # set_state_dict would fail with a bare KeyError, after the weights were loaded
            raise ValueError(f"checkpoint {path} holds optimizer settings {missing} that the optimizer given lacks "
                             f"(a learning-rate scheduler adds 'initial_lr'): build the optimizer and its scheduler "
                             f"as the saving run did, before loading")
        set_state_dict(target, optimizer, model_state_dict=state, options=options,
                       optim_state_dict=_keyed_by_name(ckpt["optimizer"], optimizer, target))
    if scheduler is not None:
        scheduler.load_state_dict(ckpt["scheduler"])
    ranks = ckpt.get("ranks") or [{"rng": ckpt.get("rng"), "generators": ckpt.get("generators", {})}]
    rank, world_size = rank_and_world_size()
    mine = ranks[rank] if len(ranks) == world_size else ranks[0]  # see the module docstring
    own = mine.get("state") if len(ranks) == world_size else None  # another process's rows would be wrong
    for name, g in (generators or {}).items():
        g.set_state(mine["generators"][name].cpu())
    if restore_rng and mine["rng"] is not None:  # a bare state_dict saved by other code holds no generator states
        restore_rng_state(mine["rng"])
    return {"step": int(ckpt.get("step", 0)), "extra": ckpt.get("extra", {}), "world_size": len(ranks),
            "process_state": own}


def _keyed_by_name(state: dict, optimizer: torch.optim.Optimizer, model: nn.Module) -> dict:
    """An optimizer state keyed by parameter names, as ``set_state_dict`` takes it.

    :func:`save_distributed_checkpoint` writes names already. A checkpoint of
    :func:`~torchformer.train.checkpoint.save_checkpoint` (a single process's, e.g. of an earlier version of a
    script) numbers the parameters instead, in the order the optimizer holds them: that order names them here.
    """
    numbered = [k for k in state["state"] if not isinstance(k, str)]
    numbered += [k for group in state["param_groups"] for k in group["params"] if not isinstance(k, str)]
    if not numbered:
        return state
    names = {id(p): name for name, p in model.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    return {"state": {order[k]: v for k, v in state["state"].items()},
            "param_groups": [{**group, "params": [order[k] for k in group["params"]]}
                             for group in state["param_groups"]]}


def _gather(obj: Any) -> Optional[list]:
    """Every process's ``obj``, as a list by rank, on rank 0; ``None`` on the others."""
    if not dist.is_initialized():
        return [obj]
    rank, world_size = rank_and_world_size()
    gathered = [None] * world_size if rank == 0 else None
    dist.gather_object(obj, gathered, dst=0)
    return gathered


def _broadcast(obj: Any) -> Any:
    """Rank 0's ``obj`` on every process."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]
