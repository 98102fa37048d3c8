"""Multi-head attention: self-attention and cross-attention.

Attention is a soft lookup table. Every position emits a *query*; every position it may look at offers a
*key* and a *value*. The output for a query is the average of the values, weighted by how well the query
matches each key (a softmax over the scaled dot products):

    attention(Q, K, V) = softmax(Q K^T / sqrt(s)) V

With several *heads*, this is done ``h`` times in parallel with different projections, and the results are
concatenated and mixed back to the embedding size by one linear layer (``unifyheads``).

* **Narrow heads** (the default, as in Vaswani et al.): the projected embedding is cut into ``h`` chunks of
  ``s = e // h`` dimensions, one per head, so multi-head attention costs about as much as a single head.
* **Wide heads** (``wide=True``): every head sees a full ``e``-dimensional projection (``s = e``), so queries,
  keys and values map ``e -> h * e``. More parameters, no divisibility constraint.

Two implementations compute the same function:

* the fast path calls :func:`torch.nn.functional.scaled_dot_product_attention`, which dispatches to fused
  kernels (flash attention, memory-efficient attention) when the hardware allows;
* the reference path (:func:`attention_reference`) is the formula above as plain matmul-softmax-matmul. It is
  slower, but it is the readable explanation and it can return the attention weights. The tests prove both
  paths equal, forwards and backwards.

Shapes used in this module:
    b: batch size          t: number of queries (positions of ``x``)
    e: embedding size      u: number of keys/values (``t`` for self-attention, the context length for cross)
    h: number of heads     s: head size (``e // h`` for narrow heads, ``e`` for wide heads)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from torchformer._checks import (
    check_choice,
    check_embeddings,
    check_mask,
    check_positive_int,
    check_probability,
)

IMPLEMENTATIONS = ("sdpa", "reference")
NO_MASK_WITH_STATIC_CACHE = (
    "mask cannot be used with a StaticKVCache: it decodes one token at a time, without padding"
)


class KVCache:
    """The keys and values one attention layer has computed so far, for incremental decoding.

    During generation each new token only needs its own query; the keys and values of earlier positions do not
    change (attention is causal), so we keep them instead of recomputing them. ``update`` appends the new
    positions and returns everything cached: ``(b, h, u_old, s) + (b, h, t, s) -> (b, h, u_old + t, s)``.

    A subclass of :class:`MultiHeadAttention` gets caching for free as long as it keeps the
    project -> cache -> attend -> unify order of :meth:`SelfAttention.forward` (override
    :meth:`~MultiHeadAttention.attend` or the projections, not ``forward``). :meth:`key_mask` tells attention which
    of the returned keys are real: here all of them (or those the padding mask marks); a :class:`StaticKVCache` also
    returns slots that are not filled yet, so an ``attend`` override must honour its ``key_mask`` argument.
    """

    def __init__(self) -> None:
        self.keys: Tensor | None = None
        self.values: Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.keys is None else self.keys.size(2)

    def update(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        if self.keys is None:
            self.keys, self.values = keys, values
        else:
            self.keys = torch.cat([self.keys, keys], dim=2)
            self.values = torch.cat([self.values, values], dim=2)  # type: ignore[list-item]
        return self.keys, self.values  # type: ignore[return-value]

    def key_mask(self, mask: Tensor | None) -> Tensor | None:
        """The padding mask over all keys that :meth:`update` returned: here simply ``mask``, ``(b, u)`` or None."""
        return mask

    def reorder(self, index: Tensor) -> None:
        """Select batch rows, e.g. to follow the surviving hypotheses of a beam search."""
        if self.keys is not None:
            self.keys = self.keys.index_select(0, index)
            self.values = self.values.index_select(0, index)  # type: ignore[union-attr]


class StaticKVCache(KVCache):
    """A KV cache in buffers allocated once, for decoding steps whose shapes never change.

    A growing :class:`KVCache` hands attention ``u + 1`` keys at step ``u``: a new shape every step, so
    ``torch.compile`` would compile every position anew and a CUDA graph (one recorded sequence of kernels, replayed
    with a single launch) could not be recorded at all. Here the keys and values live in preallocated buffers
    ``(b, h, capacity, s)``, and the step's position is ``position``, a 0-dim integer tensor on the device that the
    caller sets before each step. ``update`` writes the one new key and value at that position, in place, and
    returns the *whole* buffers; :meth:`key_mask` marks the filled slots, ``0 .. position``, as the keys attention
    may use. With one query per step this is exactly the causal mask: the new token sees itself and everything before.

    Only one position per step (``t = 1``): fill the prompt into a growing :class:`KVCache` first and copy it over
    with :meth:`from_cache`. Padding masks are not supported (generation needs none). Every step attends over all
    ``capacity`` slots (the unfilled ones masked), so it costs as much at position 3 as at the end of the window.
    :class:`~torchformer.decoding.compiled.StaticCacheGenerator` drives it.
    """

    def __init__(self, keys: Tensor, values: Tensor, position: Tensor) -> None:
        if keys.dim() != 4 or keys.shape[:3] != values.shape[:3]:
            raise ValueError(
                f"keys and values must be buffers of shape (b, h, capacity, s) with the same b, h and capacity, "
                f"got {tuple(keys.shape)} and {tuple(values.shape)}"
            )
        if position.dim() != 0 or position.dtype != torch.long or position.device != keys.device:
            raise ValueError(
                f"position must be a 0-dim torch.long tensor on the buffers' device ({keys.device}), "
                f"got dtype {position.dtype}, shape {tuple(position.shape)} on {position.device}"
            )
        self.keys, self.values, self.position = keys, values, position
        self.slots = torch.arange(keys.size(2), device=keys.device)  # (capacity,)
        mark_static_address(self.keys, self.values, self.slots, self.position)

    @classmethod
    def from_cache(cls, cache: KVCache, capacity: int, position: Tensor) -> StaticKVCache:
        """Buffers of ``capacity`` positions with a filled :class:`KVCache`'s keys and values in slots ``0 .. u-1``."""
        if cache.keys is None:
            raise ValueError("cache is empty: run the prompt through the model with it first")
        b, h, _, s = cache.keys.shape
        # Keys and values may differ in dtype (with kqnorm under autocast, layer norm gives float32 keys).
        keys = cache.keys.new_zeros(b, h, capacity, s)
        values = cache.values.new_zeros(b, h, capacity, cache.values.size(3))  # type: ignore[union-attr]
        static = cls(keys, values, position)
        static.load(cache)
        return static

    def load(self, cache: KVCache) -> None:
        """Copy a filled :class:`KVCache` into slots ``0 .. u-1``, in place, and clear the others."""
        if cache.keys is None or cache.values is None:
            raise ValueError("cache is empty: run the prompt through the model with it first")
        u, capacity = cache.keys.size(2), self.keys.size(2)
        for name, filled, buffer in (("keys", cache.keys, self.keys), ("values", cache.values, self.values)):
            if filled.shape[:2] + filled.shape[3:] != buffer.shape[:2] + buffer.shape[3:] or u > capacity:
                raise ValueError(
                    f"cache holds {name} of shape {tuple(filled.shape)}, which do not fit buffers of shape "
                    f"{tuple(buffer.shape)} (b, h, capacity, s)"
                )
        for buffer, filled in ((self.keys, cache.keys), (self.values, cache.values)):
            buffer[:, :, :u].copy_(filled)
            buffer[:, :, u:].zero_()  # never attended to (masked), but stale numbers should not linger

    def __bool__(self) -> bool:  # without this, `if cache:` would call __len__ and fail
        return True

    def __len__(self) -> int:
        raise TypeError(
            "a StaticKVCache does not know its length on the host: the fill level is its position tensor, on the "
            "device; pass offset=<that position> to the model instead of relying on len(cache)"
        )

    def update(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        if keys.size(2) != 1:
            raise ValueError(
                f"a StaticKVCache takes one new position per step (keys of shape (b, h, 1, s)), got "
                f"{tuple(keys.shape)}; run the prompt with a KVCache and convert it with StaticKVCache.from_cache"
            )
        for name, new, held in (("keys", keys, self.keys), ("values", values, self.values)):
            if new.dtype != held.dtype:
                raise TypeError(
                    f"new {name} have dtype {new.dtype} but the cache holds {held.dtype}; run the prompt and the "
                    f"decoding steps under the same autocast setting"
                )
        # (b, h, 1, s) into slot `position` of (b, h, capacity, s). The slot is data (a tensor), not a Python int,
        # so the same compiled step serves every position.
        index = self.position.view(1)
        self.keys.index_copy_(2, index, keys)
        self.values.index_copy_(2, index, values)
        return self.keys, self.values

    def key_mask(self, mask: Tensor | None) -> Tensor:
        """``(b, capacity)``: True at the slots filled so far, ``0 .. position``; the rest hold no keys yet."""
        if mask is not None:
            raise ValueError(NO_MASK_WITH_STATIC_CACHE)
        return (self.slots <= self.position).expand(self.keys.size(0), -1)

    def reorder(self, index: Tensor) -> None:
        """Select batch rows in place (the buffers keep their memory); ``index`` must keep the batch size."""
        if index.numel() != self.keys.size(0):
            raise ValueError(
                f"a StaticKVCache keeps its batch size ({self.keys.size(0)}): index must have that many entries, "
                f"got {index.numel()}"
            )
        self.keys.copy_(self.keys.index_select(0, index))
        self.values.copy_(self.values.index_select(0, index))


def mark_static_address(*tensors: Tensor) -> None:
    """Tell ``torch.compile`` that these tensors keep their memory across calls: a CUDA graph then reads and writes
    them where they are, instead of copying them in (and mutated ones out) at every replay."""
    mark = getattr(getattr(torch, "_dynamo", None), "mark_static_address", None)
    if mark is not None:
        for tensor in tensors:
            mark(tensor)


def build_allowed(
    key_mask: Tensor | None, *, causal: bool, t: int, u: int, device: torch.device
) -> Tensor | None:
    """Which keys each query may attend to, as a bool tensor broadcastable to ``(b, h, t, u)``.

    ``key_mask`` ``(b, u)`` marks real (non-padding) keys. With ``causal``, query ``i`` sits at absolute position
    ``u - t + i`` (the last ``t`` of ``u`` positions: with a cache, earlier positions are already there), and may
    only see keys at or before that position. Returns ``None`` when every key is allowed.
    """
    allowed = None
    if causal and t > 1:
        allowed = torch.ones(t, u, dtype=torch.bool, device=device).tril(diagonal=u - t)  # (t, u)
    if key_mask is not None:
        keys = key_mask[:, None, None, :]  # (b, u) -> (b, 1, 1, u)
        allowed = keys if allowed is None else allowed & keys  # (b, 1, t, u)
    return allowed


def queries_with_keys(key_mask: Tensor, *, causal: bool, t: int) -> Tensor:
    """``(b, u) -> (b, t, 1)``: True for the queries that may attend to at least one real key."""
    if causal:  # query i sits at position u - t + i and sees the keys up to there
        return (key_mask.cumsum(dim=-1)[:, -t:] > 0)[:, :, None]
    return key_mask.any(dim=-1, keepdim=True)[:, :, None].expand(-1, t, -1)


def attention_reference(
    q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None = None, *, dropout: float = 0.0
) -> tuple[Tensor, Tensor]:
    """Plain scaled dot-product attention; returns ``(output, weights)``.

    ``q`` ``(b, h, t, s)``, ``k`` and ``v`` ``(b, h, u, s)``, ``allowed`` broadcastable to ``(b, h, t, u)``.
    Output ``(b, h, t, s)``; weights ``(b, h, t, u)`` with rows summing to 1 over the allowed keys and exactly 0
    elsewhere. A query with no allowed key gets all-zero weights and hence a zero output.
    ``dropout`` is applied to the weights used for the output; the returned weights are the ones before dropout.
    """
    s = q.size(-1)
    # Dividing by sqrt(s) keeps the dot products at unit variance, so the softmax does not saturate.
    scores = q @ k.transpose(-2, -1) / math.sqrt(s)  # (b, h, t, s) @ (b, h, s, u) -> (b, h, t, u)
    if allowed is not None:
        # The most negative finite value rather than -inf: a row with no allowed key then gives a uniform
        # softmax (not 0/0 = NaN), which the masked_fill below turns into exact zeros.
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    weights = F.softmax(scores, dim=-1)
    if allowed is not None:
        weights = weights.masked_fill(~allowed, 0.0)
    mixed = F.dropout(weights, p=dropout) if dropout > 0 else weights
    return mixed @ v, weights  # (b, h, t, u) @ (b, h, u, s) -> (b, h, t, s)


def attention_fast(
    q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None = None, *, causal: bool = False, dropout: float = 0.0
) -> Tensor:
    """The same function as :func:`attention_reference`, computed by ``scaled_dot_product_attention``.

    When the mask is exactly "causal, no padding, as many queries as keys", we pass ``is_causal=True`` instead of
    a mask tensor, which lets PyTorch pick the flash-attention kernel.
    """
    t, u = q.size(-2), k.size(-2)
    if allowed is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=causal and t == u and t > 1)
    # SDPA returns NaN for a query that may see no key at all. Let such rows see everything, then zero them:
    # that matches the reference path (zero weights, zero output, zero gradient).
    any_key = allowed.any(dim=-1, keepdim=True)  # (b, 1, t, 1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed | ~any_key, dropout_p=dropout)
    return out.masked_fill(~any_key, 0.0)


class MultiHeadAttention(nn.Module):
    """Projections and head bookkeeping shared by :class:`SelfAttention` and :class:`CrossAttention`.

    Args:
        emb: embedding size ``e`` of the inputs and outputs.
        heads: number of heads ``h``.
        wide: if True every head works on a full ``e``-dimensional projection, else on a chunk of ``e // h``.
        causal: if True, query ``i`` attends only to keys ``<= i``.
        dropout: dropout on the attention weights (training only).
        kqnorm: apply layer normalisation to keys and queries per head, which keeps the logits bounded.
        impl: ``"sdpa"`` (fast path, default) or ``"reference"`` (plain matmul-softmax-matmul).
    """

    def __init__(
        self,
        emb: int,
        heads: int = 8,
        *,
        wide: bool = False,
        causal: bool = False,
        dropout: float = 0.0,
        kqnorm: bool = False,
        impl: str = "sdpa",
    ) -> None:
        super().__init__()
        self.emb = check_positive_int(emb, "emb")
        self.heads = check_positive_int(heads, "heads")
        if not wide and emb % heads != 0:
            raise ValueError(
                f"emb ({emb}) must be divisible by heads ({heads}) for narrow heads "
                f"(each head gets emb // heads dimensions); choose another heads or use wide=True"
            )
        self.wide, self.causal, self.kqnorm = bool(wide), bool(causal), bool(kqnorm)
        self.dropout = check_probability(dropout, "dropout")
        self.impl = check_choice(impl, "impl", IMPLEMENTATIONS)
        self.head_size = emb if wide else emb // heads
        inner = heads * self.head_size  # e (narrow) or h * e (wide)

        self.toqueries = nn.Linear(emb, inner, bias=False)
        self.tokeys = nn.Linear(emb, inner, bias=False)
        self.tovalues = nn.Linear(emb, inner, bias=False)
        self.unifyheads = nn.Linear(inner, emb)
        self.qnorm = nn.LayerNorm(self.head_size) if kqnorm else nn.Identity()
        self.knorm = nn.LayerNorm(self.head_size) if kqnorm else nn.Identity()

    def split_heads(self, x: Tensor) -> Tensor:
        """``(b, t, h * s) -> (b, h, t, s)``: each head becomes its own batch of sequences."""
        b, t, _ = x.shape
        return x.view(b, t, self.heads, self.head_size).transpose(1, 2)

    def merge_heads(self, x: Tensor) -> Tensor:
        """``(b, h, t, s) -> (b, t, h * s)``: concatenate the heads again."""
        b, h, t, s = x.shape
        return x.transpose(1, 2).reshape(b, t, h * s)

    def project_queries(self, x: Tensor) -> Tensor:
        return self.qnorm(self.split_heads(self.toqueries(x)))  # (b, t, e) -> (b, h, t, s)

    def project_keys_values(self, y: Tensor) -> tuple[Tensor, Tensor]:
        k = self.knorm(self.split_heads(self.tokeys(y)))  # (b, u, e) -> (b, h, u, s)
        v = self.split_heads(self.tovalues(y))  # (b, u, e) -> (b, h, u, s)
        return k, v

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, *, return_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """Attention proper: ``q`` ``(b, h, t, s)``, ``k, v`` ``(b, h, u, s)`` -> ``(b, h, t, s)``, weights or None.

        Override this in a subclass to try a new attention variant; caching and masking keep working.
        """
        t, u = q.size(-2), k.size(-2)
        p = self.dropout if self.training else 0.0
        if return_weights or self.impl == "reference":
            allowed = build_allowed(key_mask, causal=self.causal, t=t, u=u, device=q.device)
            out, weights = attention_reference(q, k, v, allowed, dropout=p)
            return out, (weights if return_weights else None)
        if key_mask is None and (not self.causal or t == u or t == 1):
            # No mask tensor needed: SDPA handles plain causal masking itself (and a single new query may see
            # every cached key). This keeps the flash-attention kernels available.
            return attention_fast(q, k, v, None, causal=self.causal, dropout=p), None
        allowed = build_allowed(key_mask, causal=self.causal, t=t, u=u, device=q.device)
        return attention_fast(q, k, v, allowed, dropout=p), None

    def extra_repr(self) -> str:
        return (
            f"emb={self.emb}, heads={self.heads}, wide={self.wide}, causal={self.causal}, "
            f"dropout={self.dropout}, kqnorm={self.kqnorm}, impl={self.impl!r}"
        )


class SelfAttention(MultiHeadAttention):
    """Multi-head self-attention: every position of ``x`` attends to the positions of ``x``.

    ``forward(x, mask=None, *, return_weights=False)`` maps ``x`` ``(b, t, e)`` to ``(b, t, e)``.

    * ``mask``: optional bool ``(b, t)``, ``True`` for real tokens. Padding keys (``False``) get zero weight, so
      padding never changes the output at real positions. A query whose keys are all masked gets a zero vector.
    * ``return_weights=True`` returns ``(out, weights)`` with ``weights`` ``(b, h, t, t)`` (computed by the
      reference path).
    * ``cache``: a :class:`KVCache` for incremental decoding. ``x`` then holds only the new positions, which are
      appended to the cache; ``mask``, if given, covers all cached positions, shape ``(b, len(cache) + t)``.
      A :class:`StaticKVCache` takes one position at a time (``t = 1``) and no ``mask``.
    """

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        return_weights: bool = False,
        cache: KVCache | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        b, t, _ = check_embeddings(x, "x", self.emb, like=self.toqueries.weight)
        if mask is not None:  # checked before the cache is touched: a failed call must not change it
            if isinstance(cache, StaticKVCache):
                raise ValueError(NO_MASK_WITH_STATIC_CACHE)
            cached = 0 if cache is None else len(cache)
            check_mask(mask, "mask", (b, cached + t), "(b, len(cache) + t)" if cache is not None else "(b, t)")
        q = self.project_queries(x)  # (b, h, t, s)
        k, v = self.project_keys_values(x)  # (b, h, t, s) each
        key_mask = mask
        if cache is not None:
            k, v = cache.update(k, v)  # (b, h, u, s) with u = cached + t (or the capacity of a static cache)
            key_mask = cache.key_mask(mask)  # (b, u) or None: which of those keys hold real tokens
        out, weights = self.attend(q, k, v, key_mask, return_weights=return_weights)
        out = self.unifyheads(self.merge_heads(out))  # (b, h, t, s) -> (b, t, h * s) -> (b, t, e)
        if mask is not None:  # a query that sees no real key carries no information: make it exactly zero
            out = out.masked_fill(~queries_with_keys(mask, causal=self.causal, t=t), 0.0)
        return (out, weights) if return_weights else out  # type: ignore[return-value]


class CrossAttention(MultiHeadAttention):
    """Multi-head cross-attention: queries from ``x``, keys and values from another sequence, ``context``.

    This is how a decoder reads the encoder's output. ``forward(x, context, context_mask=None)`` maps
    ``x`` ``(b, t, e)`` and ``context`` ``(b, u, e)`` to ``(b, t, e)``; ``context_mask`` ``(b, u)`` marks real
    context tokens. Cross-attention is never causal: every query may see the whole context.

    With a ``cache`` (a :class:`KVCache`), the keys and values of ``context`` are computed on the first call and
    reused afterwards, since the context does not change while the decoder generates.
    """

    def __init__(self, emb: int, heads: int = 8, *, wide: bool = False, dropout: float = 0.0, **kwargs) -> None:
        if kwargs.get("causal"):
            raise ValueError("CrossAttention cannot be causal: every query may see the whole context")
        kwargs.pop("causal", None)
        super().__init__(emb, heads, wide=wide, dropout=dropout, **kwargs)

    def forward(
        self,
        x: Tensor,
        context: Tensor,
        context_mask: Tensor | None = None,
        *,
        return_weights: bool = False,
        cache: KVCache | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        b, _, _ = check_embeddings(x, "x", self.emb, like=self.toqueries.weight)
        bc, u, _ = check_embeddings(context, "context", self.emb, like=self.tokeys.weight)
        if bc != b:
            raise ValueError(f"context must have the same batch size as x ({b}), got {bc}")
        if context_mask is not None:
            check_mask(context_mask, "context_mask", (b, u), "(b, u)")
        q = self.project_queries(x)  # (b, h, t, s)
        if cache is not None and len(cache) > 0:
            k, v = cache.keys, cache.values  # computed from the same context on the first step
        else:
            k, v = self.project_keys_values(context)  # (b, h, u, s) each
            if cache is not None:
                cache.update(k, v)
        out, weights = self.attend(q, k, v, context_mask, return_weights=return_weights)  # type: ignore[arg-type]
        out = self.unifyheads(self.merge_heads(out))  # (b, h, t, s) -> (b, t, e)
        if context_mask is not None:
            out = out.masked_fill(~queries_with_keys(context_mask, causal=False, t=q.size(2)), 0.0)
        return (out, weights) if return_weights else out  # type: ignore[return-value]
