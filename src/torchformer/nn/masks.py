"""Which keys each query may attend to: positions, the causal rule, windows, patterns, documents and padding.

:class:`AttentionMask` holds them for one call, composed by "and" on absolute positions (``docs/masks.md``;
patterns: ``docs/long-context.md``). Shapes: b batch size, t queries, u keys.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import Tensor

from torchformer._checks import check_positive_int, is_int


class AttentionPattern:
    """A rule on positions alone, whether query ``i`` may see key ``j``; a subclass writes :meth:`rule`."""

    def rule(self, i: Tensor, j: Tensor) -> Tensor:
        """Whether query position ``i`` may see key position ``j``, element-wise (on a matrix, or flex's pairs).

        Args:
            i: query positions, a long tensor.
            j: key positions, a long tensor broadcastable with ``i``.
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

    Args:
        stride: ``l``, the window and the distance between columns, ``>= 1``.
    """

    def __init__(self, stride: int) -> None:
        self.stride = check_positive_int(stride, "stride")

    def rule(self, i: Tensor, j: Tensor) -> Tensor:
        """As :meth:`AttentionPattern.rule`: ``|i - j| < stride`` or ``i - j`` a multiple of ``stride``."""
        d = i - j
        return (d.abs() < self.stride) | (d.remainder(self.stride) == 0)

    def __repr__(self) -> str:
        return f"StridedPattern(stride={self.stride})"


class FixedPattern(AttentionPattern):
    """The sparse transformer's fixed pattern: the query's own block, and the last ``summary`` positions of each.

    Args:
        stride: ``l``, the block length, ``>= 1``.
        summary: ``c``, the summary positions at the end of each block, in ``[1, stride]``.
    """

    def __init__(self, stride: int, summary: int = 1) -> None:
        self.stride, self.summary = check_positive_int(stride, "stride"), check_positive_int(summary, "summary")
        if summary > stride:
            raise ValueError(f"summary must be an int in [1, stride={stride}], got {summary!r}")

    def rule(self, i: Tensor, j: Tensor) -> Tensor:
        """As :meth:`AttentionPattern.rule`: ``i // stride == j // stride`` or ``j mod stride >= stride - summary``."""
        same_block = i.div(self.stride, rounding_mode="floor") == j.div(self.stride, rounding_mode="floor")
        return same_block | (j.remainder(self.stride) >= self.stride - self.summary)

    def __repr__(self) -> str:
        return f"FixedPattern(stride={self.stride}, summary={self.summary})"


class AttentionMask:
    """The positions of queries and keys, and the rules on them, for one attention call (``docs/masks.md``).

    Args:
        query_positions: ``(t,)`` long, absolute positions of the queries.
        key_positions: ``(u,)`` long, absolute positions of the keys (a cache's slots); ``None`` in cross-attention.
        key_mask: ``(b, u)`` bool, True for real keys (and written slots); ``None`` when every key is real.
        causal: queries see only keys at or before their own position.
        window: queries see only keys less than ``window`` positions away (``|i - j| < window``); ``None``: no window.
        pattern: an :class:`AttentionPattern` the positions must satisfy too; ``None``: none.
        padded: whether ``key_mask`` can leave a query without a key; ``None``: if ``key_mask`` or ``key_documents``.
        aligned: the keys are the queries, in order (self-attention over one call's tokens; no mask tensor needed).
        ends_aligned: the queries are the last keys, in order (a cache read up to the call's last position).
        documents: ``(b, t)`` long, the document of each token of packed rows (non-decreasing), for aligned
            self-attention; ``None``: one document per row.
        key_documents: ``(b, u)`` long, each key's document, for cross-attention (query document ``d`` reads key
            document ``d``); ``None``: ``documents``.

    Raises:
        ValueError: a ``window`` that is not a positive int, a ``pattern`` without key positions, ``key_documents``
            without ``documents``, or ``documents`` neither ``aligned`` nor with ``key_documents``.
        TypeError: a ``key_mask`` that is not bool.
    """

    def __init__(self, query_positions: Tensor, key_positions: Optional[Tensor], key_mask: Optional[Tensor] = None, *,
                 causal: bool = False, window: Optional[int] = None, padded: Optional[bool] = None,
                 aligned: bool = False, pattern: Optional[AttentionPattern] = None,
                 documents: Optional[Tensor] = None, key_documents: Optional[Tensor] = None,
                 ends_aligned: bool = False) -> None:
        # Cheap checks of the Python arguments (tensors are checked at the models' boundary): a window of 0 or a
        # non-bool mask would silently hide every key.
        if window is not None and (not is_int(window) or window <= 0):
            raise ValueError(f"window must be a positive int or None, got {window!r}")
        if key_mask is not None and key_mask.dtype != torch.bool:
            raise TypeError(f"key_mask must have dtype torch.bool (True = real key), got {key_mask.dtype}")
        self.query_positions, self.key_positions, self.key_mask = query_positions, key_positions, key_mask
        self.causal, self.window, self.aligned, self.ends_aligned = causal, window, aligned, ends_aligned
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
        """False for "everything", "plain causal, keys = queries" or one query at the last key: SDPA needs no tensor."""
        if (self.window is not None or self.pattern is not None) and self.key_positions is not None:
            return True
        if self.documents is not None:
            return True
        if self.ends_aligned and self.key_mask is None and self.query_positions.size(0) == 1:
            return False  # one query at the last key: causal or not, it sees every key
        return self.key_mask is not None or (self.key_positions is not None and not self.aligned)

    @property
    def rows(self) -> Optional[int]:
        """``b`` when the rule differs between rows (padding, documents): a block mask per row; else ``None``."""
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
        """Bool, broadcastable to ``(b, 1, t, u)``: may query ``i`` see key ``j``? Built once per call and kept.

        Returns:
            ``(t, u)`` from the positions' rules alone, ``(b, 1, t, u)`` with a ``key_mask`` or documents; ``None``
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
        """The same rule as :meth:`allowed` in flex attention's form, ``mask_mod(b, h, q_idx, kv_idx) -> bool tensor``.

        Raises:
            ValueError: the keys have no positions (cross-attention).
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
        """This rule as flex attention's ``BlockMask``, one per row when :attr:`rows` says so, else one for all.

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

        Returns:
            ``(b, 1, t, 1)`` bool, or ``None`` when the mask is not ``padded`` (every query then sees a key).
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
