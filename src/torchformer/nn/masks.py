"""Which keys each query may attend to: positions, the causal rule and padding, in one object.

Every attention call gets an :class:`AttentionMask`. It records

* ``query_positions`` ``(t,)``: the absolute position of each query (``0 .. t-1`` for a whole sequence; the new
  positions when decoding with a cache);
* ``key_positions`` ``(u,)``: the absolute position of each key (the same tensor as the queries' without a cache;
  the cache's slots ``0 .. c-1`` with one; ``None`` for cross-attention, whose keys come from another sequence);
* ``key_mask`` ``(b, u)``: True for keys that may be used, False for padding (and, with a cache, for slots not
  written yet); ``None``: all may be used;
* ``causal``: a query at position ``i`` may only see keys at positions ``<= i``;
* ``window``: a query sees only keys less than ``window`` positions away (sliding-window, local attention);
* ``pattern``: an :class:`AttentionPattern`, a rule on the two positions alone: the sparse transformer's
  :class:`StridedPattern` and :class:`FixedPattern` (Child et al. 2019), under which a query sees about
  ``2 * sqrt(n)`` of ``n`` keys instead of all of them;
* ``documents`` ``(b, t)``: for a packed row of several documents (:mod:`torchformer.data.packing`), the document
  of each token: a query sees only keys of its own document, and a pattern applies to the positions within each
  document (:func:`document_positions`). The other rules need nothing more: within a document the distance
  between two tokens is the same as in the document alone, so causality, windows and the relative position schemes
  (rotary, ALiBi, the relative bias, which see only distances) give each document what it gets alone. In
  cross-attention, ``key_documents`` ``(b, u)`` numbers the context's documents: query document ``d`` reads
  context document ``d`` of its row (a packed source row and its packed target row).

Every rule is a condition that must hold, so they compose by "and": a pattern with the causal rule and padding is
all three at once. From these, :meth:`AttentionMask.allowed` builds the boolean matrix attention needs, and
:meth:`AttentionMask.mask_mod` the same rule one pair at a time, for ``torch.nn.attention.flex_attention``. Because
positions are absolute, the same rule is right with and without a cache. An attention variant that needs distances
(ALiBi, relative position biases) reads them from the same positions: see ``docs/extending.md``.

Shapes: b batch size, t queries, u keys.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import Tensor

from torchformer._checks import check_positive_int, is_int


class AttentionPattern:
    """A rule on positions alone, whether a query at position ``i`` may see a key at position ``j``.

    A variant subclasses it and writes :meth:`rule`, element-wise on broadcastable tensors (so that the same code
    serves a whole ``(t, u)`` matrix and flex attention's one pair at a time). The causal rule, windows and
    padding are applied besides it, by :class:`AttentionMask`.
    """

    def rule(self, i: Tensor, j: Tensor) -> Tensor:
        """Whether query position ``i`` may see key position ``j``, element-wise.

        Args:
            i: query positions, a long tensor.
            j: key positions, a long tensor broadcastable with ``i``.

        Returns:
            Bool, of the broadcast shape of ``i`` and ``j``.
        """
        raise NotImplementedError(f"{type(self).__name__} must define rule(i, j)")

    def allows(self, query_positions: Tensor, key_positions: Tensor) -> Tensor:
        """:meth:`rule` for every pair of a query and a key.

        Args:
            query_positions: ``(t,)`` long.
            key_positions: ``(u,)`` long.

        Returns:
            ``(t, u)`` bool: True where query ``i`` may see key ``j``.
        """
        return self.rule(query_positions[:, None], key_positions[None, :])


class StridedPattern(AttentionPattern):
    """The sparse transformer's strided pattern: the last ``stride`` positions, and every ``stride``-th before.

    Query ``i`` sees key ``j`` when ``|i - j| < stride`` (a local window) or ``i - j`` is a multiple of
    ``stride`` (a column every ``stride`` positions). With ``stride`` near ``sqrt(n)`` each query sees about
    ``2 sqrt(n)`` keys, and any position reaches any earlier one in two layers: first along its column, then
    within a window. Suits data with a period (image rows, a table): Child et al. used it for images.

    Args:
        stride: ``l``, the window and the distance between columns, ``>= 1``.
    """

    def __init__(self, stride: int) -> None:
        self.stride = check_positive_int(stride, "stride")

    def rule(self, i: Tensor, j: Tensor) -> Tensor:
        """``|i - j| < stride`` or ``i - j`` a multiple of ``stride``, element-wise.

        Args:
            i: query positions, a long tensor.
            j: key positions, broadcastable with ``i``.

        Returns:
            Bool, of the broadcast shape.
        """
        d = i - j
        return (d.abs() < self.stride) | (d.remainder(self.stride) == 0)

    def __repr__(self) -> str:
        return f"StridedPattern(stride={self.stride})"


class FixedPattern(AttentionPattern):
    """The sparse transformer's fixed pattern: the query's own block, and the last ``summary`` positions of each.

    Positions fall into blocks of ``stride``; query ``i`` sees key ``j`` when both lie in one block
    (``i // stride == j // stride``) or ``j`` is among the last ``summary`` positions of its block
    (``j mod stride >= stride - summary``): those positions summarise their block for every later query. Suits
    text, which has no period: Child et al. used it for enwik8.

    Args:
        stride: ``l``, the block length, ``>= 1``.
        summary: ``c``, the summary positions at the end of each block, in ``[1, stride]``.
    """

    def __init__(self, stride: int, summary: int = 1) -> None:
        self.stride, self.summary = check_positive_int(stride, "stride"), check_positive_int(summary, "summary")
        if summary > stride:
            raise ValueError(f"summary must be an int in [1, stride={stride}], got {summary!r}")

    def rule(self, i: Tensor, j: Tensor) -> Tensor:
        """``i`` and ``j`` in one block, or ``j`` among the last ``summary`` positions of its block, element-wise.

        Args:
            i: query positions, a long tensor.
            j: key positions, broadcastable with ``i``.

        Returns:
            Bool, of the broadcast shape.
        """
        same_block = i.div(self.stride, rounding_mode="floor") == j.div(self.stride, rounding_mode="floor")
        return same_block | (j.remainder(self.stride) >= self.stride - self.summary)

    def __repr__(self) -> str:
        return f"FixedPattern(stride={self.stride}, summary={self.summary})"


class AttentionMask:
    """Positions of queries and keys, the causal rule and the padding of the keys (see the module docstring).

    Args:
        query_positions: ``(t,)`` long, absolute positions of the queries.
        key_positions: ``(u,)`` long, absolute positions of the keys, or ``None`` when keys and queries belong to
            different sequences (cross-attention).
        key_mask: ``(b, u)`` bool, True for real keys; ``None`` when every key is real.
        causal: queries see only keys at or before their own position.
        window: queries see only keys less than ``window`` positions away (``|i - j| < window``; with ``causal``,
            the last ``window`` positions up to the query's own). ``None``: no window.
        pattern: an :class:`AttentionPattern` the positions must satisfy too; ``None``: none.
        padded: whether ``key_mask`` can leave a query without any key (it marks padding); default: whenever a
            ``key_mask`` is given. A cache's mask of written slots cannot: each query's own slot was just written.
        aligned: the keys are exactly the queries, in the same order (self-attention over one call's tokens,
            whose positions increase one by one). Then plain causal attention needs no mask tensor, which keeps the
            fused flash-attention kernels available.
        documents: ``(b, t)`` long, the document of each token of a packed row (non-decreasing along the row), for
            self-attention over one call's tokens (``aligned``, ``u = t``); ``None``: one document per row.
        key_documents: ``(b, u)`` long, the document of each key, for cross-attention between packed rows (query
            document ``d`` reads key document ``d``); ``None``: the keys are the queries (``documents``' own).
    """

    def __init__(self, query_positions: Tensor, key_positions: Optional[Tensor], key_mask: Optional[Tensor] = None, *,
                 causal: bool = False, window: Optional[int] = None, padded: Optional[bool] = None,
                 aligned: bool = False, pattern: Optional[AttentionPattern] = None,
                 documents: Optional[Tensor] = None, key_documents: Optional[Tensor] = None) -> None:
        # Cheap checks of the Python arguments (tensors are checked at the models' boundary): a window of 0 or a
        # non-bool mask would silently hide every key.
        if window is not None and (not is_int(window) or window <= 0):
            raise ValueError(f"window must be a positive int or None, got {window!r}")
        if key_mask is not None and key_mask.dtype != torch.bool:
            raise TypeError(f"key_mask must have dtype torch.bool (True = real key), got {key_mask.dtype}")
        self.query_positions, self.key_positions, self.key_mask = query_positions, key_positions, key_mask
        self.causal, self.window, self.aligned = causal, window, aligned
        if pattern is not None and key_positions is None:
            raise ValueError("an attention pattern needs the keys' positions; cross-attention's keys have none")
        self.pattern = pattern
        if key_documents is not None and documents is None:
            raise ValueError("key_documents number the keys' documents for the queries' documents: give documents too")
        if documents is not None and key_documents is None and not aligned:
            raise ValueError("documents mark the tokens of one call's packed rows: they need the keys to be the "
                             "queries (aligned self-attention, no cache), or key_documents for the keys")
        self.documents = documents
        self.key_documents = documents if key_documents is None else key_documents
        # Documents between two sequences may leave a query without a key (a padding query, whose number no key has).
        self.padded = (key_mask is not None or key_documents is not None) if padded is None else padded
        self._allowed: Optional[Tensor] = None
        self._built = False

    @property
    def needs_tensor(self) -> bool:
        """False when the mask is "everything" or "plain causal, keys = queries": SDPA then needs no mask tensor."""
        if (self.window is not None or self.pattern is not None) and self.key_positions is not None:
            return True
        if self.documents is not None:
            return True
        return self.key_mask is not None or (self.key_positions is not None and not self.aligned)

    @property
    def rows(self) -> Optional[int]:
        """``b`` when the rule differs from one row of the batch to another (padding, documents), else ``None``.

        What a block mask is built for: one per row, or one for all (a cache's ``(1, c)`` mask of written slots).
        """
        for per_row in (self.key_mask, self.documents, self.key_documents):
            if per_row is not None and per_row.size(0) > 1:
                return per_row.size(0)
        return None

    def distance(self) -> Tensor:
        """``(t, u)``: query position minus key position (positive = the key lies in the query's past).

        Returns:
            The distances ``(t, u)``, in the dtype of the positions (long).

        Raises:
            ValueError: the keys have no positions (cross-attention).
        """
        if self.key_positions is None:
            raise ValueError("cross-attention keys have no positions in the queries' sequence: no distance")
        return self.query_positions[:, None] - self.key_positions[None, :]

    def allowed(self) -> Optional[Tensor]:
        """Bool, broadcastable to ``(b, 1, t, u)``: may query ``i`` see key ``j``? ``None`` when all may.

        Built once per call and kept: attention asks for it on the fast path, for the zeroing of queries that see
        no real key, and a variant may ask again.

        Returns:
            ``(t, u)`` from the causal rule and the window alone, ``(b, 1, t, u)`` with a ``key_mask``; ``None``
            when every query may see every key.
        """
        if not self._built:
            self._allowed, self._built = self._build(), True
        return self._allowed

    def _build(self) -> Optional[Tensor]:
        allowed = None
        if self.causal and self.aligned:
            t = self.query_positions.size(0)  # keys = queries: the lower triangle, as SDPA's is_causal
            allowed = torch.ones(t, t, dtype=torch.bool, device=self.query_positions.device).tril()  # (t, t)
        elif self.causal and self.key_positions is not None:
            # Position i sees positions <= i: with a cache, the query's position against every slot's.
            allowed = self.key_positions[None, :] <= self.query_positions[:, None]  # (t, u)
        if self.window is not None and self.key_positions is not None:
            near = self.distance().abs() < self.window  # (t, u): a band around the diagonal
            allowed = near if allowed is None else allowed & near
        if self.pattern is not None and self.documents is not None:  # the pattern of each document's own positions
            within = document_positions(self.documents)  # (b, t)
            rule = self.pattern.rule(within[:, :, None], within[:, None, :])[:, None]  # (b, 1, t, t)
            allowed = rule if allowed is None else allowed & rule
        elif self.pattern is not None:
            rule = self.pattern.allows(self.query_positions, self.key_positions)  # type: ignore[arg-type]
            allowed = rule if allowed is None else allowed & rule
        if self.documents is not None:
            same = (self.documents[:, :, None] == self.key_documents[:, None, :])[:, None]  # (b, 1, t, u)
            allowed = same if allowed is None else allowed & same
        if self.key_mask is not None:
            keys = self.key_mask[:, None, None, :]  # (b, u) -> (b, 1, 1, u)
            allowed = keys if allowed is None else allowed & keys  # (b, 1, t, u)
        return allowed

    def mask_mod(self) -> Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]:
        """The same rule as :meth:`allowed`, one (batch, head, query, key) index at a time: flex attention's form.

        ``torch.nn.attention.flex_attention.create_block_mask`` calls it on index tensors and skips the blocks
        of the score matrix where it is False everywhere: a sparse pattern then costs only its blocks.

        Returns:
            ``mask_mod(b, h, q_idx, kv_idx) -> bool tensor``.
        """
        qp, kp, key_mask = self.query_positions, self.key_positions, self.key_mask
        if kp is None:
            raise ValueError("cross-attention keys have no positions in the queries' sequence: no mask_mod")
        causal, window, pattern = self.causal, self.window, self.pattern
        documents, key_documents = self.documents, self.key_documents
        within = None if documents is None or pattern is None else document_positions(documents)

        def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            i, j = qp[q_idx], kp[kv_idx]
            ok = j <= i if causal else i == i  # (i == i: an all-True tensor of the right kind)
            if window is not None:
                ok = ok & ((i - j).abs() < window)
            if pattern is not None:
                ok = ok & (pattern.rule(i, j) if within is None else pattern.rule(within[b, q_idx], within[b, kv_idx]))
            if documents is not None:
                ok = ok & (documents[b, q_idx] == key_documents[b, kv_idx])
            if key_mask is not None:  # (b, u), or (1, u) for every row
                ok = ok & key_mask[b if key_mask.size(0) > 1 else 0, kv_idx]
            return ok

        return mask_mod

    def block_mask(self, device: torch.device) -> Any:
        """This rule as flex attention's ``BlockMask``: which blocks of the score matrix hold allowed pairs.

        One block mask per row when the rule differs between rows (:attr:`rows`), else one for all.

        Args:
            device: where the block mask is built (the queries').

        Returns:
            A ``torch.nn.attention.flex_attention.BlockMask`` of ``(t, u)`` scores.

        Raises:
            ValueError: the keys have no positions (cross-attention).
        """
        from torch.nn.attention.flex_attention import create_block_mask

        rule = self.mask_mod()  # (refuses cross-attention's keys without positions)
        t, u = self.query_positions.size(0), self.key_positions.size(0)
        return create_block_mask(rule, self.rows, None, t, u, device=device)

    def query_has_key(self) -> Optional[Tensor]:
        """``(b, 1, t, 1)`` bool: False for a query that may see no real key at all (it gets a zero output).

        ``None`` without padding: then every query sees at least its own position (causal) or every key.

        Returns:
            ``(b, 1, t, 1)`` bool, or ``None`` when the mask is not ``padded``.
        """
        if not self.padded:
            return None
        allowed = self.allowed()  # not None: padded means a key_mask
        return None if allowed is None else allowed.any(dim=-1, keepdim=True)


def document_positions(documents: Tensor) -> Tensor:
    """Each token's position within its document: ``0, 1, ...`` from every document's first token, ``(b, t) -> (b, t)``.

    Args:
        documents: ``(b, t)`` integer, the document of each token, non-decreasing along each row.

    Returns:
        ``(b, t)`` long: the index along the row minus the index of the document's first token.
    """
    b, t = documents.shape
    index = torch.arange(t, device=documents.device).expand(b, t)  # (b, t)
    first = torch.ones_like(documents, dtype=torch.bool)
    first[:, 1:] = documents[:, 1:] != documents[:, :-1]  # (b, t): a document starts here
    start = torch.where(first, index, torch.zeros_like(index)).cummax(dim=1).values  # its first token's index
    return index - start


def causal_mask(t: int, u: Optional[int] = None, *, device: Optional[torch.device] = None) -> Tensor:
    """``(t, u)`` bool, the explicit causal mask when the ``t`` queries are the last ``t`` of ``u`` positions.

    Written out for reading and for tests; attention builds the same matrix from positions.

    Args:
        t: number of queries.
        u: number of keys, ``>= t``; ``None``: ``t`` (queries and keys are the same positions).
        device: where to build the mask; ``None``: the default device.

    Returns:
        ``(t, u)`` bool, ``True`` where query ``i`` (at position ``u - t + i``) may see key ``j``: ``j <= u - t + i``.

    Raises:
        ValueError: ``u`` is less than ``t``.
    """
    u = t if u is None else u
    if u < t:  # the first queries would see no key at all
        raise ValueError(f"u (keys) must be at least t (queries), got t={t}, u={u}")
    return torch.ones(t, u, dtype=torch.bool, device=device).tril(diagonal=u - t)
