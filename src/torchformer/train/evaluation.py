"""Bits per byte: how well a byte-level language model compresses held-out text.

A model that assigns probability ``p`` to the byte that actually comes next could encode that byte in ``-log2 p``
bits (arithmetic coding gets within a few bits of this for the whole file). Bits per byte is the average of that
cost over the evaluated bytes; lower is better, and 8.0 is what a model that knows nothing (uniform over 256 values)
pays.

Every byte of the data after the first is predicted exactly once, from the bytes before it. The model sees at most
``context`` bytes, so long data is cut into windows of ``context`` inputs that start every ``stride`` bytes; each
window after the first scores only its last ``stride`` predictions, the ones the previous window did not reach. A
scored byte thus sees at least ``context - stride + 1`` bytes of context (fewer near the start of the data). The
default ``stride = context // 2`` costs about twice as much as ``stride = context`` and gives every scored byte at
least half a context (docs/enwik8.md draws the windows and weighs the choices).

While training, scoring a whole validation split at every evaluation costs too much. ``windows=k`` scores
``k`` windows of that same plan, one drawn at random (seeded: the same bytes at every evaluation) from each of ``k``
equal stretches of the data: an estimate of the whole split's figure, which its first bytes alone are not (one
stretch of text can be much easier than the rest; docs/enwik8.md has the figures).

A model trained with Transformer-XL's segment memory (``GTransformer.new_memory``) reads text as a stream, and is
scored that way with ``memory=m``: the data is cut into ``batch_size`` contiguous streams, each fed in segments of
``context`` bytes through the model's memory, so that every byte is predicted once, seeing its segment up to itself
and the ``m`` bytes before the segment (fewer at the start of a stream).

On several processes (:mod:`torchformer.train.distributed`), ``distributed=True`` shares the batches out: each
process scores every ``world_size``-th batch, and the sums of bits and of scored bytes are added up over the
processes. The result is the single-process figure exactly: each batch's sum is computed as one process would, and
the per-batch sums are added with ``math.fsum`` (exactly rounded, so the order of addition does not matter).
"""

from __future__ import annotations

import math
from typing import Optional, Union

import torch
from torch import Tensor, nn

from torchformer._checks import check_bool, check_positive_int, is_int, require_method
from torchformer.train.distributed import all_reduce_sum, rank_and_world_size
from torchformer.train.training import progress as progress_bar


def _window_plan(n: int, length: int, stride: int) -> tuple[Tensor, Tensor]:
    """Start positions of the windows and, per window, the index of its first scored prediction.

    A window starting at ``s`` feeds ``data[s : s + length]`` and predicts ``data[s + 1 : s + length + 1]``.
    The last window is moved left so that it ends exactly at the last byte; all windows then have
    the same length and can be batched.
    """
    last = n - 1 - length
    starts = list(range(0, last + 1, stride))
    if starts[-1] != last:
        starts.append(last)
    starts = torch.tensor(starts, dtype=torch.long)
    # Window k's predictions up to position starts[k-1] + length were scored by window k - 1.
    first = torch.zeros_like(starts)
    first[1:] = starts[:-1] + length - starts[1:]
    return starts, first


@torch.no_grad()
def bits_per_byte(model: nn.Module, data: Tensor, *, context: int, batch_size: int = 32, stride: Optional[int] = None,
                  windows: Optional[int] = None, seed: int = 0, device: Optional[Union[str, torch.device]] = None,
                  progress: Optional[str] = None, distributed: bool = False, memory: Optional[int] = None) -> float:
    """Average number of bits the model needs per byte of ``data`` (see the module docstring).

    Args:
        model: maps ``(b, t)`` int64 token ids to ``(b, t, vocab)`` natural-log probabilities of
            the next token at every position, causally (position ``i`` sees inputs ``<= i``).
        data: 1-D integer tensor (e.g. ``uint8`` bytes) with at least 2 elements.
        context: the most inputs the model sees at once.
        batch_size: windows per forward pass.
        stride: distance between window starts, in ``[1, context]``; default ``max(1, context // 2)``.
        windows: score only this many of the windows (about ``windows * stride`` bytes), drawn as the module
            docstring says: an estimate of the whole figure. Default: all.
        seed: which windows ``windows`` draws; the same seed draws the same windows on every call.
        device: where to run; default the device of the model's parameters (or of ``data``).
        progress: show a progress bar with this label while scoring (when tqdm is installed; see
            :func:`torchformer.train.training.progress`); default none. Scoring a whole split can take minutes.
        distributed: every process of the process group calls this with the same arguments and scores its
            share of the batches; all return the figure of the whole data (see the module docstring). Without
            a process group, the same as ``False``.
        memory: score the data as ``batch_size`` streams fed through the model's segment memory of this many
            positions (``model.new_memory(memory)``), in segments of ``context``; not with ``stride`` or
            ``windows``. With ``distributed``, every process scores the whole data (the same figure).

    Returns:
        total bits over the ``len(data) - 1`` predicted bytes, divided by ``len(data) - 1`` (with ``windows``:
        over the bytes those windows score).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(data, Tensor) or data.dim() != 1:
        raise ValueError(f"data must be a 1-D tensor, got {type(data).__name__} with shape "
                         f"{tuple(data.shape) if isinstance(data, Tensor) else None}")
    if data.is_floating_point() or data.is_complex() or data.dtype == torch.bool:
        raise TypeError(f"data must hold integer token ids, got dtype {data.dtype}")
    if len(data) < 2:
        raise ValueError(f"data must hold at least 2 tokens (the first is never predicted), got {len(data)}")
    check_positive_int(context, "context")
    check_positive_int(batch_size, "batch_size")
    if windows is not None:
        check_positive_int(windows, "windows")
    if not is_int(seed):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    check_bool(distributed, "distributed")
    if progress is not None and not isinstance(progress, str):
        raise TypeError(f"progress must be a label (str) or None, got {type(progress).__name__} {progress!r}")
    if device is None:
        param = next(model.parameters(), None)
        device = param.device if param is not None else data.device
    if memory is not None:
        check_positive_int(memory, "memory")
        require_method(model, "new_memory", f"bits_per_byte(memory={memory}) (Transformer-XL's segment memory; a "
                                            f"GTransformer with positions inside attention)")
        if windows is not None or stride is not None:
            raise ValueError(f"memory={memory} scores every byte once as streams: leave out windows ({windows}) "
                             f"and stride ({stride})")
        return _bits_per_byte_streamed(model, data.to(device), context, memory, batch_size, progress)
    if stride is None:
        stride = max(1, context // 2)
    if not is_int(stride) or not 1 <= stride <= context:
        raise ValueError(f"stride must be an int in [1, context={context}], got {stride!r}")

    n = len(data)
    length = min(context, n - 1)  # short data: a single window over all of it
    starts, first = _window_plan(n, length, stride)
    if windows is not None and windows < len(starts):
        # One window drawn at random from each of `windows` equal stretches of the plan (stratified sampling): the
        # sample covers the whole data evenly, and a trend along the data (easier text first) does not bias it.
        # Each window keeps the part it scores in the full plan, so every scored byte has the same context there.
        edges = torch.linspace(0, len(starts), windows + 1).long()  # (windows + 1,)
        offsets = torch.rand(windows, generator=torch.Generator().manual_seed(seed))
        picked = edges[:-1] + (offsets * (edges[1:] - edges[:-1])).long()  # (windows,), one per stretch
        starts, first = starts[picked], first[picked]
    data = data.to(device)
    starts, first = starts.to(device), first.to(device)
    offsets = torch.arange(length + 1, device=device)
    positions = torch.arange(length, device=device)

    batches = list(range(0, len(starts), batch_size))
    nats = torch.zeros(len(batches), dtype=torch.float64)  # per batch: the sum of -log p over its scored bytes
    counts = torch.zeros(len(batches), dtype=torch.long)
    rank, world_size = rank_and_world_size() if distributed else (0, 1)
    mine = range(rank, len(batches), world_size)
    # Every process runs the same number of forward passes: an FSDP model gathers its parameters with all the
    # processes in each one. A process whose share is one batch short scores its first batch again, unrecorded.
    rounds = math.ceil(len(batches) / world_size)
    plan = [*mine, *[None] * (rounds - len(mine))]
    was_training = model.training
    model.eval()
    if progress is not None:
        plan = progress_bar(plan, desc=progress)
    try:
        for k in plan:
            i = batches[0 if k is None else k]
            rows = data[starts[i:i + batch_size, None] + offsets].long()  # (b, length + 1): a batch of windows
            inputs, targets = rows[:, :-1], rows[:, 1:]
            logp = model(inputs)
            if i == 0:
                _check_output(logp, inputs, data)
            if k is None:
                continue
            picked = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (b, length)
            scored = positions >= first[i:i + batch_size, None]
            nats[k] = -torch.where(scored, picked.double(), 0.0).sum().cpu()
            counts[k] = int(scored.sum())
    finally:
        model.train(was_training)
    if world_size > 1:  # each batch was scored by one process and is 0 elsewhere: the sums are exact
        nats, counts = all_reduce_sum(nats), all_reduce_sum(counts)
    total_nats, counted = math.fsum(nats.tolist()), int(counts.sum())

    assert windows is not None or counted == n - 1, (counted, n)  # every byte after the first, exactly once
    return total_nats / math.log(2) / counted


def _bits_per_byte_streamed(model: nn.Module, data: Tensor, context: int, memory: int, streams: int,
                            progress: Optional[str]) -> float:
    """``bits_per_byte`` with ``memory``: ``streams`` contiguous rows, fed a segment at a time through the memory."""
    predictions = len(data) - 1  # inputs data[p], targets data[p + 1], for p = 0 .. predictions - 1
    length = math.ceil(predictions / streams)  # each stream's predictions; the last one may be shorter
    rows = math.ceil(predictions / length)
    index = torch.arange(rows * length, device=data.device).view(rows, length)  # (r, l): a prediction each
    real = index < predictions  # the last row's tail is padding
    index = index.clamp(max=predictions - 1)
    inputs, targets = data[index].long(), data[index + 1].long()
    caches = model.new_memory(memory)  # type: ignore[operator]
    nats = []
    was_training = model.training
    model.eval()
    plan = range(0, length, context)
    try:
        for start in (progress_bar(plan, desc=progress) if progress is not None else plan):
            x, mask = inputs[:, start:start + context], real[:, start:start + context]
            positions = torch.arange(start, start + x.size(1), device=data.device)
            logp = model(x, None if bool(mask.all()) else mask, caches=caches, positions=positions)
            if start == 0:
                _check_output(logp, x, data)
            picked = logp.gather(-1, targets[:, start:start + context, None]).squeeze(-1)  # (r, segment)
            nats.append(-torch.where(mask, picked.double(), 0.0).sum().item())
    finally:
        model.train(was_training)
    return math.fsum(nats) / math.log(2) / predictions


def _check_output(logp: Tensor, inputs: Tensor, data: Tensor) -> None:
    """Catch the usual mistakes (wrong shape, logits instead of log-probabilities) on the first batch."""
    b, t = inputs.shape
    if not isinstance(logp, Tensor) or logp.dim() != 3 or tuple(logp.shape[:2]) != (b, t):
        shape = tuple(logp.shape) if isinstance(logp, Tensor) else type(logp).__name__
        raise ValueError(f"model output must have shape (b, t, vocab) = ({b}, {t}, vocab), got {shape}")
    vocab = logp.shape[-1]
    top = int(data.max())
    if top >= vocab:
        raise ValueError(f"data holds token id {top}, but the model's vocab has only {vocab} entries")
    if logp.isnan().any() or logp.isposinf().any():  # (-inf is a fine log-probability: an impossible token)
        raise ValueError("model output holds NaN or +inf log-probabilities: its weights are probably NaN or "
                         "infinite (did training diverge?)")
    # A sum of probabilities far from 1 means the model returns logits (apply log_softmax) or garbage.
    drift = logp.float().logsumexp(-1).abs().max().item()
    if not drift <= 0.1:
        raise ValueError(
            "model must return log-probabilities (e.g. log_softmax of the logits): their logsumexp over "
            f"the last dimension should be 0, got up to {drift:.3g} away from it"
        )
