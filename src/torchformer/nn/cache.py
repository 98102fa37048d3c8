"""The KV caches: what attention layers have computed, kept for incremental decoding and segment memory.

See ``docs/generation.md`` (slots, horizon, compiled steps) and ``docs/long-context.md`` (:class:`RingKVCache`).
Shapes: b batch size, h heads, s head size, t new positions, c capacity (slots), u context length.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import Tensor

from torchformer._checks import check_positive_int, is_int


def mark_static_address(*tensors: Tensor) -> None:
    """Tell ``torch.compile`` that these tensors keep their memory across calls (CUDA graphs use them in place).

    Args:
        *tensors: buffers that stay at one address while compiled code uses them; no effect without ``torch._dynamo``.
    """
    mark = getattr(getattr(torch, "_dynamo", None), "mark_static_address", None)
    if mark is not None:
        for tensor in tensors:
            mark(tensor)


class KVCache:
    """What one attention layer keeps of each position, in preallocated buffers, slot ``p`` for position ``p``.

    *Entries* per position are tensors ``(b, n, t, d)`` (:meth:`~torchformer.nn.attention.SelfAttention.entries`),
    in buffers ``(b, n, c, d)`` the first :meth:`write` allocates. A cross-attention's is a :class:`ContextCache`.

    Args:
        capacity: the number of slots ``c``, the most positions the cache holds (a generator's ``seq_length``).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = check_positive_int(capacity, "capacity")
        self.entries: Optional[tuple[Tensor, ...]] = None  # each (b, n, c, d): keys (b, g, c, s), values, ...
        self.real: Optional[Tensor] = None  # (b, c) bool: False at padding; None while no mask was ever given
        self.slots: Optional[Tensor] = None  # (c,): 0 .. c-1, the position each slot holds
        self.written: Optional[Tensor] = None  # (c,) bool: which slots hold a key and value
        self._any_written = False  # the same, summarised on the host (reading `written` would wait for a GPU)
        self.horizon: Optional[int] = None  # reads cover slots 0 .. horizon-1; None: all (set by the model's door)
        self.span: Optional[tuple[int, int]] = None  # the positions this call writes, when the host knows them
        self.filled = 0  # slots 0 .. filled-1 are known, on the host, to hold real tokens' entries (see dense)

    @property
    def keys(self) -> Optional[Tensor]:
        """The first entry's buffer, a plain layer's keys ``(b, g, c, s)``; ``None`` before the first write."""
        return None if self.entries is None else self.entries[0]

    @property
    def values(self) -> Optional[Tensor]:
        """The second entry's buffer, a plain layer's values ``(b, g, c, s)``; ``None`` before the first write."""
        return None if self.entries is None or len(self.entries) < 2 else self.entries[1]

    @property
    def empty(self) -> bool:
        """True until the first write and after :meth:`reset` (a host-side flag: reading it never waits)."""
        return not self._any_written

    def update(self, keys: Tensor, values: Tensor, positions: Tensor,
               mask: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
        """:meth:`write` with the two entries of a plain attention layer, its keys and values.

        Args:
            keys: the new keys ``(b, g, t, s)`` (``g``: the key/value heads the layer stores).
            values: the new values ``(b, g, t, s)``.
            positions: ``(t,)`` long, the absolute positions of the new keys, hence their slots.
            mask: ``(b, t)`` bool, ``True`` at real tokens and ``False`` at padding; ``None``: all real.

        Returns:
            ``(keys, values, usable)``: the buffers ``(b, g, c, s)`` and the usable slots, as :meth:`write`.
        """
        (keys, values), usable = self.write((keys, values), positions, mask)
        return keys, values, usable

    def write(self, entries: tuple[Tensor, ...], positions: Tensor,
              mask: Optional[Tensor] = None) -> tuple[tuple[Tensor, ...], Tensor]:
        """Write new entries into the slots of their positions; return the buffers up to the :attr:`horizon`.

        Args:
            entries: the new positions' entries, each ``(b, n, t, d)`` (a plain layer's keys and values).
            positions: ``(t,)`` long, the absolute positions, hence the slots; below the capacity (the model checks).
            mask: ``(b, t)`` bool, ``True`` at real tokens and ``False`` at padding (remembered); ``None``: all real.

        Returns:
            ``(buffers, usable)``: views ``(b, n, c, d)`` up to the horizon, and the written, real slots ``(b, c)``
            bool (``(1, c)`` while none was padding).

        Raises:
            ValueError: entries of another number, batch size or layout than the buffers, or more than ``c`` at first.
            TypeError: entries of another dtype or device than the buffers.
        """
        if self.entries is None:
            self._allocate(entries)
        self._check_fits(entries)
        # The slot of a position is its index: index_copy_ writes in place, so the buffers keep their memory and
        # one compiled step (or CUDA graph) serves every position.
        for buffer, new in zip(self.entries, entries):  # type: ignore[arg-type]
            buffer.index_copy_(2, positions, new)
        self.written.index_fill_(0, positions, True)  # type: ignore[union-attr]
        if not self._any_written:  # only the first write changes it (a compiled step then has nothing to record)
            self._any_written = True
        if self.span is not None and mask is None and self.span[0] <= self.filled:  # no gap: the filled prefix grows
            self.filled = max(self.filled, self.span[1])
        b, t = entries[0].size(0), entries[0].size(2)
        if mask is not None and self.real is None:  # the first padding: until now every slot was real
            self.real = torch.ones(b, self.capacity, dtype=torch.bool, device=entries[0].device)  # (b, c)
        if self.real is None:
            usable = self.written[None, :]  # type: ignore[index]  # (1, c)
        else:
            new_real = mask if mask is not None else torch.ones_like(self.real[:, :t])
            self.real.index_copy_(1, positions, new_real)
            usable = self.real & self.written  # (b, c)
        n = self.horizon
        if n is None:
            return self.entries, usable  # type: ignore[return-value]
        # Views of the first n slots: a causal query at position < n sees nothing beyond them.
        return tuple(buffer[:, :, :n] for buffer in self.entries), usable[:, :n]  # type: ignore[union-attr]

    @property
    def dense(self) -> bool:
        """Whether the call reads only written, real slots, to its last position (host-side; ``docs/generation.md``)."""
        return (self.real is None and self.span is not None and self.horizon == self.span[1]
                and self.filled >= self.span[1])

    @property
    def key_positions(self) -> Optional[Tensor]:
        """``(u,)``: the position each slot a read covers holds (``slots``, its first :attr:`horizon` ones)."""
        if self.slots is None or self.horizon is None:
            return self.slots
        return self.slots[: self.horizon]

    def set_horizon(self, horizon: Optional[int], *, span: Optional[tuple[int, int]] = None) -> None:
        """Let the next reads cover only slots ``0 .. horizon-1`` (the model's door sets it on every call).

        Args:
            horizon: an int in ``[1, capacity]``; ``None``: every slot.
            span: ``(first, end)``: the call writes positions ``first .. end-1`` (:attr:`dense`); ``None``: unknown.

        Raises:
            ValueError: ``horizon`` or ``span`` is neither ``None`` nor in range (``0 <= first < end <= capacity``).
        """
        if horizon is not None and (not is_int(horizon) or not 1 <= horizon <= self.capacity):
            raise ValueError(f"horizon must be an int in [1, {self.capacity}] (the cache's capacity) or None, got "
                             f"{horizon!r}")
        if span is not None and not (isinstance(span, tuple) and len(span) == 2 and all(is_int(p) for p in span)
                                     and 0 <= span[0] < span[1] <= self.capacity):
            raise ValueError(f"span must be (first, end), ints with 0 <= first < end <= {self.capacity} (the "
                             f"positions the call writes), or None; got {span!r}")
        self.horizon, self.span = horizon, span

    @property
    def position_limit(self) -> Optional[int]:
        """The first position the cache cannot hold: its capacity (a :class:`RingKVCache` has none)."""
        return self.capacity

    @property
    def padded(self) -> bool:
        """Whether any token written so far was padding (a host-side flag, free to read)."""
        return self.real is not None

    def reset(self) -> None:
        """Forget what was written; the buffers (and their memory) stay for the next sequence."""
        if self.written is not None:
            self.written.fill_(False)
        self.real, self._any_written, self.horizon, self.span, self.filled = None, False, None, None, 0

    def state_dict(self, *, device: Optional[torch.device | str] = None) -> dict:
        """What the cache holds, as plain data and tensors: to save a training run's segment memory with it.

        Args:
            device: where the tensors go (``"cpu"`` to save them); ``None``: the buffers themselves, not copies.

        Returns:
            ``{"entries", "real", "slots", "written", "any_written"}``: the buffers (``entries``: ``None`` unwritten).
        """
        move = (lambda t: t) if device is None else (lambda t: None if t is None else t.to(device))  # noqa: E731
        return {"entries": None if self.entries is None else [move(t) for t in self.entries], "real": move(self.real),
                "slots": move(self.slots), "written": move(self.written), "any_written": self._any_written}

    def load_state_dict(self, state: dict, *, device: Optional[torch.device] = None) -> None:
        """Hold what :meth:`state_dict` returned (of a cache of the same capacity), on ``device``.

        Args:
            state: a :meth:`state_dict` (the older form, with ``"keys"`` and ``"values"``, too).
            device: where the buffers go; ``None``: where they are.

        Raises:
            ValueError: the saved buffers have another number of slots than this cache's capacity.
        """
        entries = state["entries"] if "entries" in state else (
            None if state["keys"] is None else [state["keys"], state["values"]])
        if entries is not None and entries[0].size(2) != self.capacity:
            raise ValueError(f"the saved cache has {entries[0].size(2)} slots, this one {self.capacity} (capacity)")
        move = (lambda t: t) if device is None else (lambda t: None if t is None else t.to(device))  # noqa: E731
        self.entries = None if entries is None else tuple(move(t) for t in entries)
        self.real, self.slots, self.written = move(state["real"]), move(state["slots"]), move(state["written"])
        self._any_written = bool(state["any_written"])
        # The filled prefix, read once here (a load may wait for a device; decoding steps never do).
        self.filled = 0 if self.written is None else int(self.written.long().cumprod(0).sum())

    def _allocate(self, entries: tuple[Tensor, ...]) -> None:
        first = entries[0]
        c, t = self.capacity, first.size(2)
        if t > c:
            raise ValueError(f"the cache has {c} slots (capacity), but {t} positions were written at once")
        # Entries may differ in dtype (with kqnorm under autocast, layer norm gives float32 keys).
        self.entries = tuple(e.new_zeros(e.size(0), e.size(1), c, *e.shape[3:]) for e in entries)
        self.slots = torch.arange(c, device=first.device)
        self.written = torch.zeros(c, dtype=torch.bool, device=first.device)
        mark_static_address(*self.entries, self.slots, self.written)

    def _check_fits(self, entries: tuple[Tensor, ...]) -> None:
        held = self.entries
        assert held is not None
        if len(entries) != len(held):
            raise ValueError(f"this KVCache holds {len(held)} entries per position, but {len(entries)} were written: "
                             f"another model. Use fresh caches (model.new_caches(), or new_memory()) for each model")
        names = ("keys", "values") if len(held) == 2 else tuple(f"entries[{i}]" for i in range(len(held)))
        for name, new, buffer in zip(names, entries, held):
            if new.shape[:2] != buffer.shape[:2] or new.shape[3:] != buffer.shape[3:]:
                raise ValueError(f"this KVCache holds {name} of shape (b, h, c, s) = {tuple(buffer.shape)}, but the "
                                 f"new {name} have shape {tuple(new.shape)}: another batch size or another model. Use "
                                 f"fresh caches (model.new_caches(), or new_memory()) for each batch")
            if new.dtype != buffer.dtype or new.device != buffer.device:
                raise TypeError(f"this KVCache holds {name} of dtype {buffer.dtype} on {buffer.device}, but the new "
                                f"{name} are {new.dtype} on {new.device}; run the prompt and the decoding steps under "
                                f"the same autocast setting and device")

    def reorder(self, index: Tensor) -> None:
        """Keep the batch rows ``index`` in that order (beam search), in place when their number is unchanged.

        Args:
            index: ``(n,)`` long, the rows to keep, in order, a row maybe several times (no buffers yet: ignored).
        """
        if self.entries is None:
            return
        if index.numel() == self.entries[0].size(0):
            for buffer in self.entries:
                buffer.copy_(buffer.index_select(0, index))
            if self.real is not None:
                self.real.copy_(self.real.index_select(0, index))
            return
        self.entries = tuple(buffer.index_select(0, index) for buffer in self.entries)
        mark_static_address(*self.entries)
        if self.real is not None:
            self.real = self.real.index_select(0, index)


class RingKVCache(KVCache):
    """A KV cache that keeps the last ``capacity`` positions of an endless stream: Transformer-XL's memory.

    Positions go on where the last call stopped, or start again after :meth:`~KVCache.reset` (``docs/long-context.md``).
    Arguments: as :class:`KVCache`; ``capacity`` is the memory plus the longest call (``GTransformer.new_memory``).
    """

    @property
    def position_limit(self) -> Optional[int]:
        """``None``: a ring takes any position."""
        return None

    def set_horizon(self, horizon: Optional[int], *, span: Optional[tuple[int, int]] = None) -> None:
        """As :meth:`KVCache.set_horizon`, but a ring reads every slot: only ``horizon=None``; ``span`` is ignored.

        Raises:
            ValueError: ``horizon`` is not ``None``.
        """
        if horizon is not None:
            raise ValueError(f"a RingKVCache (a segment memory) reads all its slots: horizon must be None, got "
                             f"{horizon!r}")

    def write(self, entries: tuple[Tensor, ...], positions: Tensor,
              mask: Optional[Tensor] = None) -> tuple[tuple[Tensor, ...], Tensor]:
        """As :meth:`KVCache.write`, into slots ``positions mod c`` (earlier entries detached), returning whole buffers.

        ``positions`` may pass the capacity; ``slots`` then holds each slot's position.

        Raises:
            ValueError: more than ``c`` positions at once, or entries of another shape than the buffers'.
        """
        if entries[0].size(2) > self.capacity:  # more would overwrite their own entries
            raise ValueError(f"the ring cache has {self.capacity} slots (capacity), but {entries[0].size(2)} "
                             f"positions were written at once")
        if self.entries is not None and any(buffer.requires_grad for buffer in self.entries):
            # Memory carries no gradient: cut it from the graph of the step that wrote it, and write into a copy,
            # so that graph keeps the buffers it read (an in-place write would invalidate its backward pass).
            self.entries = tuple(buffer.detach().clone() for buffer in self.entries)
        index = positions.remainder(self.capacity)  # (t,) the slots
        result = super().write(entries, index, mask)
        self.slots.index_copy_(0, index, positions)  # type: ignore[union-attr]  # the position each slot holds
        return result


class ContextCache:
    """The keys, values and padding of a cross-attention's context, computed once per sequence.

    :meth:`~torchformer.nn.attention.CrossAttention.fill_cache` (``model.fill_caches``) fills it before the first step.
    """

    def __init__(self) -> None:
        self.keys: Optional[Tensor] = None  # (b, g, u, s)
        self.values: Optional[Tensor] = None  # (b, g, u, s_v)
        self.mask: Optional[Tensor] = None  # (b, u) bool: True at real context tokens; None: all real

    @property
    def filled(self) -> bool:
        """Whether :meth:`fill` has stored a context's keys and values (a host-side flag, free to read)."""
        return self.keys is not None

    def fill(self, keys: Tensor, values: Tensor, mask: Optional[Tensor] = None) -> None:
        """Store the keys and values of a whole context, and its padding, for every later step.

        Args:
            keys: the context's keys ``(b, g, u, s)`` (``g`` the key/value heads).
            values: its values ``(b, g, u, s)``.
            mask: ``(b, u)`` bool, ``True`` at real context tokens; ``None``: all real.

        Raises:
            ValueError: the cache is already filled (:meth:`reset` it, or take fresh caches, for another context).
        """
        if self.keys is not None:
            raise ValueError(f"this cross-attention cache is already filled, with a context of {self.keys.size(2)} "
                             f"positions: a context's keys and values are computed once; reset() the cache (or take "
                             f"fresh caches, model.new_caches()) for another context")
        self.keys, self.values, self.mask = keys, values, mask

    def check_batch(self, batch: int) -> None:
        """Check that the cache was filled, for ``batch`` rows, before a step reads it (Python ints, no sync).

        Args:
            batch: the batch size ``b`` of the step's queries.

        Raises:
            ValueError: the cache was never filled (the message says how), or it holds another batch size.
        """
        if self.keys is None:
            raise ValueError("this cross-attention cache was never filled: compute the context's keys and values "
                             "once, before the first decoding step, with model.fill_caches(caches, memory, src_mask) "
                             "(a Seq2SeqTransformer; Decoder.fill_caches, DecoderBlock.fill_cache and "
                             "CrossAttention.fill_cache at the lower levels)")
        if self.keys.size(0) != batch:
            raise ValueError(f"this cross-attention cache holds a context of batch size {self.keys.size(0)}, but "
                             f"the queries have batch size {batch}: fill caches for this batch, or reorder() these "
                             f"to its rows")

    def reorder(self, index: Tensor) -> None:
        """Keep the batch rows ``index`` as :meth:`KVCache.reorder` does; an empty cache is left as it is."""
        if self.keys is None or self.values is None:
            return
        self.keys, self.values = self.keys.index_select(0, index), self.values.index_select(0, index)
        if self.mask is not None:
            self.mask = self.mask.index_select(0, index)

    def reset(self) -> None:
        """Forget the context: the cache is empty again, to be filled with the next one."""
        self.keys = self.values = self.mask = None


class BlockCache:
    """One block's caches: ``self_attention``, a :class:`KVCache`, and ``cross_attention``, a :class:`ContextCache`.

    Args:
        capacity: slots of the self-attention cache (what the model's ``new_caches`` got, else ``seq_length``).
        ring: the self-attention cache is a :class:`RingKVCache` (a segment memory) instead of a :class:`KVCache`.
    """

    def __init__(self, capacity: int, *, ring: bool = False) -> None:
        if not is_int(capacity) or capacity <= 0:
            raise ValueError(f"capacity must be a positive int (the positions a block's cache holds), got {capacity!r}")
        self.self_attention = (RingKVCache if ring else KVCache)(capacity)
        self.cross_attention = ContextCache()

    @property
    def capacity(self) -> int:
        """The slots of the self-attention cache: the most positions the block's cache holds."""
        return self.self_attention.capacity

    @property
    def position_limit(self) -> Optional[int]:
        """The first position the self-attention cache cannot hold (``None`` for a ring)."""
        return self.self_attention.position_limit

    def set_horizon(self, horizon: Optional[int], *, span: Optional[tuple[int, int]] = None) -> None:
        """As :meth:`KVCache.set_horizon`, for the self-attention cache (a ring's takes only ``horizon=None``)."""
        self.self_attention.set_horizon(horizon, span=span)

    def reorder(self, index: Tensor) -> None:
        """Keep the batch rows ``index`` of both caches, as :meth:`KVCache.reorder` does."""
        self.self_attention.reorder(index)
        self.cross_attention.reorder(index)

    def reset(self) -> None:
        """Forget both caches' contents, as :meth:`KVCache.reset` (memory kept) and :meth:`ContextCache.reset` do."""
        self.self_attention.reset()
        self.cross_attention.reset()


def check_caches(caches: Optional[Sequence[BlockCache]], depth: int) -> Optional[int]:
    r"""Check, at a model's door, that ``caches`` holds one :class:`BlockCache` per block, all of one kind.

    Args:
        caches: what the model's ``new_caches()`` made, one :class:`BlockCache` per block; ``None``: no caches.
        depth: the number of blocks.

    Returns:
        The caches' :attr:`BlockCache.position_limit` (the capacity; ``None`` for rings), or ``None`` without caches.

    Raises:
        ValueError: ``caches`` is not a list (or tuple) of ``depth`` :class:`BlockCache`\ s of one capacity and kind.
    """
    if caches is None:
        return None
    if not isinstance(caches, (list, tuple)) or len(caches) != depth:
        got = len(caches) if isinstance(caches, (list, tuple)) else type(caches).__name__
        raise ValueError(f"caches must be a list of one BlockCache per block ({depth}), got {got}; use new_caches()")
    for i, cache in enumerate(caches):
        if not isinstance(cache, BlockCache):  # a check of the argument, as for a tensor: no dispatch on its class
            raise ValueError(f"caches[{i}] must be a BlockCache with a capacity, as model.new_caches() makes them; "
                             f"got {type(cache).__name__}")
        if cache.capacity != caches[0].capacity or cache.position_limit != caches[0].position_limit:
            raise ValueError(f"caches must all have one capacity and kind, as model.new_caches() and new_memory() "
                             f"make them; caches[0] has {caches[0].capacity} slots (limit {caches[0].position_limit}), "
                             f"caches[{i}] {cache.capacity} (limit {cache.position_limit})")
    return caches[0].position_limit
