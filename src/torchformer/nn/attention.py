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

Which keys a query may see (the causal rule, padding, positions with a KV cache) arrives as one
:class:`~torchformer.nn.masks.AttentionMask`. The caches are part of a layer's contract
(:mod:`torchformer.nn.cache`): self-attention with a :class:`~torchformer.nn.cache.KVCache` writes its new keys
and values into the cache and attends over everything cached; cross-attention computes its context's keys and
values once, into a :class:`~torchformer.nn.cache.ContextCache` (:meth:`CrossAttention.fill_cache`), and each
cached step reads them there.

Shapes used in this module:
    b: batch size          t: number of queries (positions of ``x``)
    e: embedding size      u: number of keys/values (``t`` for self-attention, the context length for cross)
    h: number of heads     s: head size (``e // h`` for narrow heads, ``e`` for wide heads)
    c: slots of a KV cache
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from torchformer._checks import (
    check_bool, check_choice, check_context, check_heads, check_positive_float, check_positive_int, check_probability,
    check_documents, check_sequence_inputs,
)
from torchformer.config import IMPLEMENTATIONS, POSITIONS, RELATIVE_POSITIONS, TransformerConfig
from torchformer.nn.cache import ContextCache, KVCache
from torchformer.nn.masks import AttentionMask, AttentionPattern, FixedPattern, StridedPattern
from torchformer.nn.relative import ALiBi, AttentionPositions, InterleavedRotary, RelativeBias, Rotary


def attention_reference(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None = None, *, dropout: float = 0.0,
                        bias: Tensor | None = None, scale: float | None = None) -> tuple[Tensor, Tensor]:
    """Plain scaled dot-product attention; returns ``(output, weights)``.

    The weights have rows summing to 1 over the allowed keys and exactly 0 elsewhere. A query with no allowed key
    gets all-zero weights and hence a zero output. ``dropout`` is applied to the weights used for the output; the
    returned weights are the ones before dropout.

    Args:
        q: queries ``(b, h, t, s)``.
        k: keys ``(b, h, u, s)``.
        v: values ``(b, h, u, s)``.
        allowed: bool, broadcastable to ``(b, h, t, u)``: ``True`` where a query may see a key. ``None``: every
            query sees every key.
        dropout: probability of zeroing each weight before the values are mixed; applied whenever it is above 0,
            so pass 0 when not training.
        bias: floats added to the scores before the softmax (ALiBi's, a learned relative bias), broadcastable to
            ``(b, h, t, u)``; ``None``: no bias.
        scale: the factor the dot products are multiplied by; ``None``: ``1 / sqrt(s)``. T5's is ``1.0``.

    Returns:
        ``(output, weights)``: the output ``(b, h, t, s)`` and the weights ``(b, h, t, u)``.
    """
    scores = q @ k.transpose(-2, -1)  # (b, h, t, s) @ (b, h, s, u) -> (b, h, t, u)
    if scale is None:
        # Dividing by sqrt(s) keeps the dot products at unit variance, so the softmax does not saturate.
        scores = scores / math.sqrt(q.size(-1))
    elif scale != 1.0:  # T5's 1.0 multiplies by nothing: its query weights were trained with the factor in them
        scores = scores * scale
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    if allowed is not None:
        # The most negative finite value rather than -inf: a row with no allowed key then gives a uniform
        # softmax (not 0/0 = NaN), which the masked_fill below turns into exact zeros.
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    weights = F.softmax(scores, dim=-1)
    if allowed is not None:
        weights = weights.masked_fill(~allowed, 0.0)
    mixed = F.dropout(weights, p=dropout) if dropout > 0 else weights
    return mixed @ v, weights  # (b, h, t, u) @ (b, h, u, s) -> (b, h, t, s)


# SDPA's enable_gqa (torch 2.5+) lets g key/value heads serve h query heads without repeating them in memory.
SDPA_SHARES_HEADS = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5)


def attention_fast(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None = None, *, causal: bool = False,
                   dropout: float = 0.0, every_row_has_key: bool = False, bias: Tensor | None = None,
                   scale: float | None = None) -> Tensor:
    """The same function as :func:`attention_reference`, computed by ``scaled_dot_product_attention``.

    With neither ``allowed`` nor ``bias`` no mask tensor is passed, so PyTorch may pick the flash-attention kernel.
    A ``bias`` goes to SDPA as a float mask: the bias where allowed, ``-inf`` elsewhere. The weights are not returned
    (SDPA does not compute them where others can read them): use :func:`attention_reference` for those.

    Args:
        q: queries ``(b, h, t, s)``.
        k: keys ``(b, g, u, s)``: ``g`` key/value heads (``g`` divides ``h``), each serving ``h / g`` consecutive
            query heads; ``g = h`` without grouped-query attention.
        v: values ``(b, g, u, s)``.
        allowed: bool, broadcastable to ``(b, h, t, u)``: ``True`` where a query may see a key. ``None``: every
            key, or the causal rule with ``causal``.
        causal: apply the causal rule (query ``i`` sees keys ``<= i``) through SDPA's ``is_causal``; only used when
            ``allowed`` and ``bias`` are both ``None`` and ``t == u``, so otherwise ``allowed`` must hold the rule.
        dropout: probability of zeroing each weight; applied whenever it is above 0, so pass 0 when not training.
        every_row_has_key: promise that every query has at least one allowed key (no padding), which skips the
            guard against the NaN that SDPA returns for a query that may see nothing.
        bias: floats added to the scores before the softmax, broadcastable to ``(b, h, t, u)``; ``None``: no bias.
        scale: the factor the dot products are multiplied by; ``None``: ``1 / sqrt(s)`` (SDPA's own default).

    Returns:
        The output ``(b, h, t, s)``; exactly 0 for a query with no allowed key, as on the reference path.
    """
    t, u = q.size(-2), k.size(-2)
    groups = {}
    if k.size(1) != q.size(1):  # g key/value heads for h query heads: SDPA shares them (torch 2.5+), else a copy
        if SDPA_SHARES_HEADS:
            groups = {"enable_gqa": True}
        else:
            k, v = (x.repeat_interleave(q.size(1) // k.size(1), dim=1) for x in (k, v))
    if allowed is None and bias is None:
        # A branch, not the comparison itself: with symbolic sizes (torch.compile(dynamic=True)) the comparison is a
        # SymBool, which SDPA refuses, while a branch is decided when the graph is traced (a guard on the sizes).
        causal = True if causal and t == u and t > 1 else False  # noqa: SIM210
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=causal, scale=scale, **groups)
    # SDPA returns NaN for a query that may see no key at all. Let such rows see everything, then zero them:
    # that matches the reference path (zero weights, zero output, zero gradient).
    any_key = None if allowed is None or every_row_has_key else allowed.any(dim=-1, keepdim=True)  # (b, 1, t, 1)
    attn_mask = allowed if any_key is None else allowed | ~any_key  # type: ignore[operator]
    if bias is not None:
        bias = bias.to(q.dtype)
        attn_mask = bias if attn_mask is None else bias.masked_fill(~attn_mask, float("-inf"))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout, scale=scale, **groups)
    return out if any_key is None else out.masked_fill(~any_key, 0.0)


def attention_flex(q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask, *, bias: Tensor | None = None,
                   scale: float | None = None) -> Tensor:
    """The same function as :func:`attention_reference`, by ``torch.nn.attention.flex_attention`` with a block mask.

    The block mask records which blocks (128 x 128 by default) of the score matrix hold any allowed pair
    (:meth:`~torchformer.nn.masks.AttentionMask.mask_mod`); compiled, flex attention computes those blocks only,
    so a sparse pattern's cost follows its allowed pairs, not ``t * u``. Eager (and on the CPU) it computes the
    whole matrix, which is how the tests compare it with the other paths. No dropout.

    Args:
        q: queries ``(b, h, t, s)``.
        k: keys ``(b, h, u, s)``.
        v: values ``(b, h, u, s)``.
        mask: the rule (causal, window, pattern, padding) and the positions; the keys must have positions.
        bias: floats added to the scores, ``(h, t, u)``; ``None``: no bias.
        scale: the factor the dot products are multiplied by; ``None``: ``1 / sqrt(s)``.

    Returns:
        The output ``(b, h, t, s)``; exactly 0 for a query with no allowed key.
    """
    from torch.nn.attention.flex_attention import flex_attention

    if q.device.type == "cpu" and torch.is_grad_enabled() and (q.requires_grad or k.requires_grad):
        raise ValueError("impl='flex' cannot compute gradients on the CPU (PyTorch's flex attention has no CPU "
                         "backward): train there with impl='sdpa' (the same function), or evaluate under no_grad")
    block_mask = mask.block_mask(q.device)
    score_mod = None
    if bias is not None:
        table = bias.to(q.dtype)

        def score_mod(score: Tensor, b_: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            return score + table[h, q_idx, kv_idx]

    out = flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
    has_key = mask.query_has_key()  # (b, 1, t, 1) or None; flex leaves such rows at 0 already, made explicit here
    return out if has_key is None else out.masked_fill(~has_key, 0.0)


class MultiHeadAttention(nn.Module):
    """Projections and head bookkeeping shared by :class:`SelfAttention` and :class:`CrossAttention`.

    Args:
        emb: embedding size ``e`` of the inputs and outputs.
        heads: number of heads ``h``.
        wide: if True every head works on a full ``e``-dimensional projection, else on a chunk of ``e // h``.
        causal: if True, query ``i`` attends only to keys ``<= i``.
        dropout: dropout on the attention weights (training only).
        kqnorm: apply layer normalisation to keys and queries per head, which keeps the logits bounded.
        impl: ``"sdpa"`` (fast path, default), ``"reference"`` (plain matmul-softmax-matmul) or ``"flex"``
            (``torch.nn.attention.flex_attention`` with a block mask: a sparse ``pattern`` then skips the blocks of
            the score matrix it rules out, once compiled; no dropout).
        positions: a position scheme acting inside attention, ``"rotary"``, ``"alibi"`` or ``"relative"``
            (:mod:`torchformer.nn.relative`); ``"none"`` (default) when positions are added to the embeddings.
        kv_heads: ``g``, heads of keys and values (grouped-query attention): each group of ``h / g`` query heads
            shares one key/value head, and a KV cache stores only ``g`` heads. ``None``: ``h`` (every head its own).
        window: sliding-window attention: a query sees only keys less than ``window`` positions away (with
            ``causal``: itself and the ``window - 1`` positions before it). ``None``: no window.
        qkv_bias: a bias in the query, key and value projections (GPT-2, BERT); ``False``: none.
        out_bias: a bias in the output projection ``unifyheads`` (``True``; ``False`` as Llama).
        head_size: ``s``, when it is not ``e // h`` (T5's ``d_kv``: t5-3b's heads have 128 dimensions at
            ``e = 1024``, ``h = 32``); the projections then map ``e -> h * s``. ``None``: ``e // h`` (narrow) or
            ``e`` (wide, which refuses a head size).
        scale: the factor the scores ``q . k`` are multiplied by; ``None``: ``1 / sqrt(s)``. T5's is ``1.0``.
        pattern: a sparse attention pattern (:class:`~torchformer.nn.masks.StridedPattern`,
            :class:`~torchformer.nn.masks.FixedPattern`, or a variant's :class:`~torchformer.nn.masks.AttentionPattern`)
            that the positions of query and key must satisfy, besides ``causal`` and ``window``; ``None``: none.

    ``positions`` may also be a built :class:`~torchformer.nn.relative.AttentionPositions` (``Rotary(s,
    base=500000.0)``, say), used as it is. :meth:`from_config` builds a layer from a
    :class:`~torchformer.config.TransformerConfig`, and its scheme with the scheme's own ``from_config`` (which reads
    ``rotary_base``, ``rotary_scaling``); that is how blocks build theirs, so a subclass with the same keyword
    arguments plugs into every model.

    Shapes:
        Queries ``(b, h, t, s)``, keys and values ``(b, g, u, s)`` (``g = kv_heads``), outputs ``(b, t, e)``;
        :class:`SelfAttention` and :class:`CrossAttention` say what their ``forward`` takes.
    """

    # The scheme inside attention for each ``positions`` (:mod:`torchformer.nn.relative`); any other value (the
    # absolute schemes, "none") gives the base AttentionPositions, which does nothing. A variant replaces a scheme
    # here: position_classes = {**SelfAttention.position_classes, "rotary": MyRotary}.
    position_classes: dict[str, type[AttentionPositions]] = {
        "rotary": Rotary, "rotary_interleaved": InterleavedRotary, "alibi": ALiBi, "relative": RelativeBias,
    }
    # The sparse pattern for each config.sparse, built with (stride) or (stride, summary).
    pattern_classes: dict[str, type[AttentionPattern]] = {"strided": StridedPattern, "fixed": FixedPattern}

    def __init__(self, emb: int, heads: int = 8, *, wide: bool = False, causal: bool = False, dropout: float = 0.0,
                 kqnorm: bool = False, impl: str = "sdpa", positions: str | AttentionPositions = "none",
                 kv_heads: int | None = None, window: int | None = None, qkv_bias: bool = False, out_bias: bool = True,
                 head_size: int | None = None, scale: float | None = None,
                 pattern: AttentionPattern | None = None) -> None:
        super().__init__()
        self.emb = check_positive_int(emb, "emb")
        self.heads = check_positive_int(heads, "heads")
        self.kv_heads = heads if kv_heads is None else check_positive_int(kv_heads, "kv_heads")
        self.window = None if window is None else check_positive_int(window, "window")
        self.wide = check_bool(wide, "wide")
        if head_size is not None:
            check_positive_int(head_size, "head_size")
            if wide:
                raise ValueError(f"head_size={head_size} sets the size of narrow heads, but wide=True gives every head "
                                 f"all emb={emb} dimensions: use one or the other")
        # A head size of its own, like wide heads, does not cut emb into heads: no divisibility rule then.
        check_heads(emb, heads, self.kv_heads, wide or head_size is not None)
        self.causal = check_bool(causal, "causal")
        self.kqnorm = check_bool(kqnorm, "kqnorm")
        if not isinstance(positions, AttentionPositions):  # a name (a built scheme is used as it is, below)
            if positions in POSITIONS and positions not in (*RELATIVE_POSITIONS, "none"):
                raise ValueError(f"positions={positions!r} is added to the token embeddings, outside attention: give "
                                 f"it to the model (or TransformerConfig); attention itself takes one of "
                                 f"{(*RELATIVE_POSITIONS, 'none')}")
            check_choice(positions, "positions", POSITIONS)  # a typo would silently mean "no positions" below
        self.dropout = check_probability(dropout, "dropout")
        self.impl = check_choice(impl, "impl", IMPLEMENTATIONS)
        if impl == "flex" and self.dropout > 0:
            raise ValueError(f"impl='flex' has no dropout on the attention weights, but dropout={self.dropout}: use "
                             f"impl='sdpa' (or 'reference') for dropout")
        if pattern is not None and not isinstance(pattern, AttentionPattern):
            raise TypeError(f"pattern must be an AttentionPattern (StridedPattern, FixedPattern, ...) or None, got "
                            f"{type(pattern).__name__}")
        self.pattern = pattern
        self.head_size = head_size if head_size is not None else emb if wide else emb // heads
        self.scale = None if scale is None else check_positive_float(scale, "scale")
        inner = heads * self.head_size  # e (narrow), h * e (wide) or h * s (a head size of its own)

        # No biases by default (former's choice); GPT-2 and BERT have them (qkv_bias). A key bias adds the same
        # number to every score of a query, which the softmax ignores, but GPT-2's weights were trained with it.
        self.qkv_bias = check_bool(qkv_bias, "qkv_bias")
        self.toqueries = nn.Linear(emb, inner, bias=qkv_bias)
        self.tokeys = nn.Linear(emb, self.kv_heads * self.head_size, bias=qkv_bias)  # g * s: fewer heads, fewer weights
        self.tovalues = nn.Linear(emb, self.kv_heads * self.head_size, bias=qkv_bias)
        self.unifyheads = nn.Linear(inner, emb, bias=check_bool(out_bias, "out_bias"))
        self.qnorm = nn.LayerNorm(self.head_size) if kqnorm else nn.Identity()
        self.knorm = nn.LayerNorm(self.head_size) if kqnorm else nn.Identity()
        if isinstance(positions, AttentionPositions):
            self.relative = positions
        else:
            scheme = self.position_classes.get(positions, AttentionPositions)  # absolute schemes act elsewhere
            self.relative = scheme.from_sizes(heads=heads, head_size=self.head_size, causal=self.causal)

    @classmethod
    def from_config(cls, config: TransformerConfig, *, causal: bool = False, layer: int = 0,
                    positions: AttentionPositions | None = None) -> MultiHeadAttention:
        """The self-attention layer a block of ``config`` uses.

        Args:
            config: the model's architecture: ``emb``, ``heads``, ``wide``, ``dropout``, ``kqnorm``, ``impl``,
                ``kv_heads``, ``window``, ``qkv_bias``, ``out_bias``, ``head_dim``, ``attention_scale`` and, when it
                acts inside attention, ``positions`` (whose scheme reads what it needs: rotary ``rotary_base`` and
                ``rotary_scaling``, the relative bias ``relative_buckets`` and ``relative_max_distance``).
            causal: if True, query ``i`` attends only to keys ``<= i`` (a decoder's self-attention).
            layer: the index of the block the layer is built for, from 0 at the input: unused here; a variant whose
                layers differ with depth reads it (differential attention's lambda_init, depth-scaled initialisation).
            positions: a built position scheme to use, shared with other layers (a stack's one relative bias, with
                ``relative_shared``); ``None``: the layer builds its own (:meth:`positions_from_config`).

        Returns:
            A layer of the class this is called on (``SelfAttention.from_config(config)`` builds a
            :class:`SelfAttention`).
        """
        arguments = cls.arguments_from_config(config, causal=causal, layer=layer, positions=positions)
        return cls(config.emb, config.heads, **arguments)._zero_init_output(config)

    @classmethod
    def arguments_from_config(cls, config: TransformerConfig, *, causal: bool, layer: int,
                              positions: AttentionPositions | None) -> dict[str, Any]:
        """The keyword arguments :meth:`from_config` builds ``cls(config.emb, config.heads, **arguments)`` with.

        A subclass with an argument of its own adds it, reading it from the config (a typed option, say)::

            @classmethod
            def arguments_from_config(cls, config, **where):
                return {**super().arguments_from_config(config, **where),
                        "gate_init": config.options_of(GateOptions).init}

        Args:
            config: the model's architecture (the fields :meth:`from_config` lists).
            causal: whether the layer is causal.
            layer: the block's index, from 0 at the input.
            positions: a shared position scheme, or ``None`` (:meth:`positions_from_config` builds one).

        Returns:
            ``{name: value}`` for every keyword argument of :class:`MultiHeadAttention`'s constructor.
        """
        scheme = cls.positions_from_config(config, causal=causal) if positions is None else positions
        return {**cls.projection_arguments(config), "causal": causal, "positions": scheme, "window": config.window,
                "pattern": cls.pattern_from_config(config)}

    @classmethod
    def projection_arguments(cls, config: TransformerConfig) -> dict[str, Any]:
        """The keyword arguments self- and cross-attention share: the heads, projections, norms and dropout.

        Args:
            config: the model's architecture.

        Returns:
            ``{name: value}`` for ``wide``, ``dropout``, ``kqnorm``, ``impl``, ``kv_heads``, ``qkv_bias``,
            ``out_bias``, ``head_size`` (``config.head_dim``) and ``scale`` (``config.attention_scale``).
        """
        return {"wide": config.wide, "dropout": config.dropout, "kqnorm": config.kqnorm, "impl": config.impl,
                "kv_heads": config.kv_heads, "qkv_bias": config.qkv_bias, "out_bias": config.out_bias,
                "head_size": config.head_dim, "scale": config.attention_scale}

    def _zero_init_output(self, config: TransformerConfig) -> MultiHeadAttention:
        if config.zero_init_residual:  # the block starts as the identity (TransformerConfig.zero_init_residual)
            for parameter in self.unifyheads.parameters():
                nn.init.zeros_(parameter)
        return self

    @classmethod
    def positions_from_config(cls, config: TransformerConfig, *, causal: bool) -> AttentionPositions:
        """The position scheme a layer of this class and ``config`` uses inside attention.

        The class ``position_classes`` names for ``config.positions`` (the base :class:`AttentionPositions`, which
        does nothing, for the absolute schemes), built with its ``from_config``. A stack calls it once when its
        layers share one scheme (``relative_shared``), and hands the result to every layer's :meth:`from_config`.

        Args:
            config: the model's architecture.
            causal: whether the layer is causal (a causal relative bias has buckets for past keys only).

        Returns:
            The scheme, a new module.
        """
        scheme = cls.position_classes.get(config.positions, AttentionPositions)  # absolute schemes act elsewhere
        return scheme.from_config(config, causal=causal)

    @classmethod
    def pattern_from_config(cls, config: TransformerConfig) -> AttentionPattern | None:
        """The sparse pattern ``config.sparse`` names (the class :attr:`pattern_classes` gives it), or ``None``.

        Args:
            config: the model's architecture: ``sparse``, ``sparse_stride`` and, for ``"fixed"``,
                ``sparse_summary``.

        Returns:
            A new pattern, or ``None`` when ``config.sparse`` is ``None``.
        """
        if config.sparse is None:
            return None
        pattern = cls.pattern_classes[config.sparse]
        if config.sparse == "fixed":
            return pattern(config.sparse_stride, config.sparse_summary)  # type: ignore[call-arg]
        return pattern(config.sparse_stride)  # type: ignore[call-arg]

    def score_value_widths(self) -> tuple[int, int]:
        """``(h d_qk, h d_v)``: the widths a query meets the keys with, and the values' (for FLOP counts).

        Returns:
            Both ``heads * head_size`` here; a variant with other sizes says its own.
        """
        return self.heads * self.head_size, self.heads * self.head_size

    def split_heads(self, x: Tensor) -> Tensor:
        """Split the last dimension into heads: ``(b, t, n * s) -> (b, n, t, s)``.

        Each head becomes its own batch of sequences, so one batched matmul serves all heads.

        Args:
            x: a projection ``(b, t, n * s)``: of queries (``n = h``), or of keys or values (``n = g``, the
                key/value heads).

        Returns:
            ``(b, n, t, s)``, a view of ``x`` (no copy).
        """
        b, t, _ = x.shape
        return x.view(b, t, -1, self.head_size).transpose(1, 2)

    def share_kv_heads(self, x: Tensor) -> Tensor:
        """Repeat each key/value head for the query heads it serves: ``(b, g, u, s) -> (b, h, u, s)``.

        Key/value head ``i`` serves query heads ``i * h/g .. (i + 1) * h/g - 1`` (grouped-query attention).

        Args:
            x: keys or values ``(b, g, u, s)``.

        Returns:
            ``(b, h, u, s)``: ``x`` itself when ``g = h``, else a copy with each head repeated ``h / g`` times.
        """
        return x if self.kv_heads == self.heads else x.repeat_interleave(self.heads // self.kv_heads, dim=1)

    def merge_heads(self, x: Tensor) -> Tensor:
        """Concatenate the heads again: ``(b, h, t, s) -> (b, t, h * s)``.

        Args:
            x: the heads' outputs ``(b, h, t, s)``.

        Returns:
            ``(b, t, h * s)``: ``(b, t, e)`` for narrow heads, ``(b, t, h * e)`` for wide ones.
        """
        b, h, t, s = x.shape
        return x.transpose(1, 2).reshape(b, t, h * s)

    def project_queries(self, x: Tensor) -> Tensor:
        """The queries of ``x``, split into heads: ``(b, t, e) -> (b, h, t, s)``.

        With ``kqnorm`` each head's query is layer-normalised.

        Args:
            x: the sequence whose positions ask, ``(b, t, e)``.

        Returns:
            The queries ``(b, h, t, s)``.
        """
        return self.qnorm(self.split_heads(self.toqueries(x)))  # (b, t, e) -> (b, h, t, s)

    def project_keys_values(self, y: Tensor) -> tuple[Tensor, Tensor]:
        """The keys and values of ``y``, split into the key/value heads: ``(b, u, e) -> (b, g, u, s)`` twice.

        ``g = kv_heads``, which is ``h`` without grouped-query attention. With ``kqnorm`` each head's key is
        layer-normalised (the values are not).

        Args:
            y: the sequence looked at, ``(b, u, e)``: ``x`` itself for self-attention, the context for
                cross-attention.

        Returns:
            ``(keys, values)``, each ``(b, g, u, s)``.
        """
        k = self.knorm(self.split_heads(self.tokeys(y)))  # (b, u, e) -> (b, g, u, s)
        v = self.split_heads(self.tovalues(y))  # (b, u, e) -> (b, g, u, s)
        return k, v

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask, *,
               return_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """Attention proper: ``q`` ``(b, h, t, s)``, ``k, v`` ``(b, g, u, s)`` -> ``(b, h, t, s)``, weights or None.

        ``mask`` says which keys each query may see (:meth:`AttentionMask.allowed`) and where queries and keys
        sit (``mask.query_positions``, ``mask.key_positions``, absolute positions, also with a KV cache). Override
        this in a subclass to try a new attention variant: masking, caching and compiled decoding keep working.

        Args:
            q: queries ``(b, h, t, s)``.
            k: keys ``(b, g, u, s)``, the ``g`` key/value heads (grouped-query attention; ``g = h`` without it). The
                fast path lets each serve its query heads without a copy; a variant that computes with them itself
                repeats them to ``h`` heads first, ``self.share_kv_heads(k)``.
            v: values ``(b, g, u, s)``, likewise.
            mask: which keys each query may see, and the positions (for ALiBi's or a learned relative bias).
            return_weights: also return the attention weights; computes on the reference path.

        Returns:
            ``(output, weights)``: the output ``(b, h, t, s)``, and the weights ``(b, h, t, u)`` (before dropout)
            with ``return_weights``, else ``None``.
        """
        p = self.dropout if self.training else 0.0
        bias = self.relative.bias(mask)  # (h, t, u) or None: ALiBi, relative bias
        if return_weights or self.impl != "sdpa":  # the reference and flex paths take every head's keys and values
            k, v = self.share_kv_heads(k), self.share_kv_heads(v)  # (b, g, u, s) -> (b, h, u, s)
        if self.impl == "flex" and not return_weights and mask.key_positions is not None:
            return attention_flex(q, k, v, mask, bias=bias, scale=self.scale), None
        if return_weights or self.impl == "reference":
            out, weights = attention_reference(q, k, v, mask.allowed(), dropout=p, bias=bias, scale=self.scale)
            return out, (weights if return_weights else None)
        if not mask.needs_tensor and bias is None:  # everything, or plain causal: SDPA masks by itself (flash)
            return attention_fast(q, k, v, None, causal=mask.causal, dropout=p, scale=self.scale), None
        allowed = mask.allowed()  # plain causal with a bias included: allowed() is then the explicit triangle
        return attention_fast(q, k, v, allowed, dropout=p, every_row_has_key=not mask.padded, bias=bias,
                              scale=self.scale), None

    def finish(self, out: Tensor, mask: AttentionMask, x: Tensor) -> Tensor:
        """Merge the heads, mix them, and zero the queries that saw no real key: ``(b, h, t, s) -> (b, t, e)``.

        The output step: a variant that gates the heads' outputs by the layer's input (a sigmoid gate per head)
        overrides it, and reads ``x``.

        Args:
            out: the output of :meth:`attend`, ``(b, h, t, s)``.
            mask: the mask :meth:`attend` used; its :meth:`~torchformer.nn.masks.AttentionMask.query_has_key`
                says which queries to zero.
            x: the layer's input ``(b, t, e)`` (padding zeroed), unused here.

        Returns:
            The layer's output ``(b, t, e)``.
        """
        out = self.unifyheads(self.merge_heads(out))  # (b, h, t, s) -> (b, t, h * s) -> (b, t, e)
        has_key = mask.query_has_key()  # (b, 1, t, 1) or None
        if has_key is not None:  # a query that sees no real key carries no information: make it exactly zero
            out = out.masked_fill(~has_key[:, 0], 0.0)
        return out

    def extra_repr(self) -> str:
        return (
            f"emb={self.emb}, heads={self.heads}, wide={self.wide}, causal={self.causal}, "
            f"dropout={self.dropout}, kqnorm={self.kqnorm}, impl={self.impl!r}"
            + (f", kv_heads={self.kv_heads}" if self.kv_heads != self.heads else "")
            + (f", window={self.window}" if self.window is not None else "")
            + (", qkv_bias=True" if self.qkv_bias else "")
            + (f", head_size={self.head_size}" if self.head_size * self.heads != self.emb and not self.wide else "")
            + (f", scale={self.scale}" if self.scale is not None else "")
            + (f", pattern={self.pattern!r}" if self.pattern is not None else "")
        )


class SelfAttention(MultiHeadAttention):
    r"""Multi-head self-attention: every position of ``x`` attends to the positions of ``x``.

    For one sequence ``x`` ``(t, e)``, one row per position, and ``h`` heads of size ``s``:

    $$
    \begin{aligned}
    Q &= x W_q, \qquad K = x W_k, \qquad V = x W_v \\
    \operatorname{head}_n &= \operatorname{softmax}\left(\frac{Q_n K_n^\top}{\sqrt{s}} + M\right) V_n,
    \qquad n = 1, \ldots, h \\
    y &= \left[\operatorname{head}_1, \ldots, \operatorname{head}_h\right] W_o + b_o
    \end{aligned}
    $$

    $W_q$, $W_k$, $W_v$ are ``toqueries``, ``tokeys``, ``tovalues`` (no bias unless ``qkv_bias``, which adds one to
    each of $Q$, $K$, $V$; ``toqueries(x)`` is $x W_q$, so $W_q$ is ``toqueries.weight.T``), and $W_o$, $b_o$ are
    ``unifyheads`` (``unifyheads.weight.T``, ``unifyheads.bias``).
    :meth:`~MultiHeadAttention.split_heads` cuts $Q$, $K$, $V$ into the heads $Q_n$, $K_n$, $V_n$ ``(t, s)``
    (consecutive blocks of ``s`` columns), :meth:`~MultiHeadAttention.merge_heads` puts them side by side again.
    $M$ ``(t, u)`` (``u = t``, or the cache's slots) is 0 where query ``i`` may see key ``j`` and $-\infty$ where
    ``causal``, ``window``, ``mask`` or the cache forbids it. With ``kv_heads=g``, $K$ and $V$ have ``g`` heads,
    each shared by ``h / g`` consecutive query heads. ``kqnorm`` layer-normalises each $Q_n$ and $K_n$;
    ``positions="rotary"`` then rotates them, ``"alibi"`` and ``"relative"`` add their bias to the scores,
    beside $M$ (:mod:`torchformer.nn.relative`). ``dropout`` acts on the softmax's weights. ``scale`` replaces
    $1/\sqrt{s}$ (T5 multiplies by 1: the factor is in its $W_q$).

    ``forward(x, mask=None, *, positions=None, cache=None, documents=None, return_weights=False)``:

    * ``mask``: optional bool ``(b, t)``, ``True`` for real tokens. Padding keys (``False``) get zero weight, so
      padding never changes the output at real positions. A query whose keys are all masked gets a zero vector.
    * ``positions``: ``(t,)`` long, the absolute positions of ``x``'s tokens; default ``0 .. t-1``.
    * ``cache``: a :class:`~torchformer.nn.cache.KVCache` for incremental decoding. ``x`` then holds only
      the new positions (``positions`` must be given); their keys and values are written into the cache and the
      queries attend over everything cached. ``mask`` still covers only ``x``; the cache remembers earlier padding.
    * ``documents``: optional integer ``(b, t)``, for rows that pack several documents
      (:mod:`torchformer.data.packing`): the document of each token, non-decreasing along a row. A query then sees
      only its own document's keys, and each document's output is what it gets alone (up to rounding), whatever
      the position scheme, window or pattern (:class:`~torchformer.nn.masks.AttentionMask`). Not with a cache.
      Only its shape, dtype and device are checked here; its values (in ``[0, t)``, non-decreasing) by the models
      (``check_values``): a layer given decreasing documents masks by equality and may join separated tokens.
    * ``return_weights=True`` returns ``(out, weights)`` (the reference path).

    The shapes and dtypes of ``x``, ``mask`` and ``positions`` are checked at the door (Python integers, no device
    sync): a wrong width or a mask of another length is a ``ValueError`` naming both. Values (positions beyond a
    cache) are the models' to check, at their boundary.

    Args:
        emb: embedding size ``e`` of the inputs and outputs.
        heads: number of heads ``h``.
        wide: if True every head works on a full ``e``-dimensional projection, else on a chunk of ``e // h``.
        causal: if True, query ``i`` attends only to keys ``<= i`` (a decoder, a generator).
        dropout: dropout on the attention weights (training only).
        kqnorm: layer normalisation of keys and queries per head, which keeps the logits bounded.
        impl: ``"sdpa"`` (fast path, default) or ``"reference"`` (plain matmul-softmax-matmul).
        positions: ``"rotary"``, ``"alibi"``, ``"relative"`` (positions inside attention) or ``"none"``.
        kv_heads: heads of keys and values ``g`` (grouped-query attention); ``None``: ``h``.
        window: sliding-window attention: a query sees only keys less than ``window`` positions away.
        qkv_bias: a bias in the query, key and value projections (GPT-2, BERT); ``False``: none.
        out_bias: a bias in the output projection (``True``; ``False`` as Llama).
        head_size: ``s``, when it is not ``e // h`` (T5's ``d_kv``); ``None``: ``e // h`` (narrow) or ``e`` (wide).
        scale: the factor the scores are multiplied by; ``None``: $1/\sqrt{s}$. T5's is ``1.0``.
        pattern: a sparse :class:`~torchformer.nn.masks.AttentionPattern` the positions must satisfy; ``None``: dense.

    Shapes:
        ``x`` ``(b, t, e)`` -> ``(b, t, e)``; with ``return_weights``, also the weights ``(b, h, t, u)`` (``u = t``,
        or the cache's slots up to the horizon).
    """

    def forward(self, x: Tensor, mask: Tensor | None = None, *, positions: Tensor | None = None,
                cache: KVCache | None = None, documents: Tensor | None = None,
                return_weights: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        # The dtype is compared with unifyheads' (finish() uses it), not the projections': a variant may replace those.
        b, t = check_sequence_inputs(x, mask, positions, self.emb, like=self.unifyheads.weight)
        if documents is not None:
            documents = check_documents(documents, b, t, x.device)
            if cache is not None:
                raise ValueError("documents (packed rows) are for whole sequences: give no cache with them")
        if positions is None:
            if cache is not None:  # the default 0 .. t-1 would overwrite the first slots of a filled cache
                raise ValueError("positions must be given with a cache: the absolute positions of x's tokens, (t,)")
            positions = torch.arange(x.size(1), device=x.device)  # (t,)
        if mask is not None:  # padding never reaches real positions, even when it holds NaN or inf (0 * NaN = NaN)
            x = x.masked_fill(~mask[:, :, None], 0.0)
        q = self.queries(x, positions)  # (b, h, t, s), rotated
        entries = self.entries(x, positions)  # what the layer keeps of each position: (b, g, t, s) keys, values
        if cache is None or cache.empty:
            if cache is not None:  # the first call (the prompt): store, then attend to these entries alone, since
                cache.write(entries, positions, mask)  # nothing else is cached (and plain causal stays fused)
            attention_mask = AttentionMask(positions, positions, mask, causal=self.causal, window=self.window,
                                           aligned=True, pattern=self.pattern, documents=documents)
        else:
            # Every slot's entries up to the horizon: (b, g, c, s); which are usable, (b or 1, c).
            entries, usable = cache.write(entries, positions, mask)
            # Slot p holds position p, so the keys' positions are the slots; those not written yet are not usable.
            attention_mask = AttentionMask(positions, cache.key_positions, usable, causal=self.causal,
                                           window=self.window, padded=cache.padded, pattern=self.pattern)
        k, v = self.keys_values(entries)  # (b, g, u, s) each: attend shares them between the query heads
        out, weights = self.attend(q, k, v, attention_mask, return_weights=return_weights)
        out = self.finish(out, attention_mask, x)
        return (out, weights) if return_weights else out  # type: ignore[return-value]

    def queries(self, x: Tensor, positions: Tensor) -> Tensor:
        """The queries of ``x``, projected and rotated by their positions: ``(b, t, e) -> (b, h, t, s)``.

        The position scheme acts here (``self.relative.rotate``: rotary positions rotate, the others pass the
        queries on), between the projection and attention.

        Args:
            x: the layer's input ``(b, t, e)``.
            positions: ``(t,)``, the absolute positions of ``x``'s tokens.

        Returns:
            The queries ``(b, h, t, s)``.
        """
        return self.relative.rotate(self.project_queries(x), positions)

    def entries(self, x: Tensor, positions: Tensor) -> tuple[Tensor, ...]:
        """What the layer keeps of each position of ``x``: what a KV cache stores, and :meth:`keys_values` reads.

        Here the keys, rotated by their positions (a cached key keeps its position's angle), and the values, each
        ``(b, g, t, s)``. A variant keeps something else (latent attention: a compressed latent and a rotary key),
        any tensors ``(b, n, t, d)`` (the cache's slots run along the third dimension), and overrides
        :meth:`keys_values` to read them back.

        Args:
            x: the layer's input ``(b, t, e)``, padding zeroed.
            positions: ``(t,)``, the absolute positions of ``x``'s tokens.

        Returns:
            ``(keys, values)``, each ``(b, g, t, s)``.
        """
        k, v = self.project_keys_values(x)  # (b, g, t, s) each
        return self.relative.rotate(k, positions), v

    def keys_values(self, entries: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
        """The keys and values attention reads, from the entries of every position it sees.

        Those of this call (without a cache, or for the prompt) or every slot of the cache; here the entries are the
        keys and values themselves.

        Args:
            entries: what :meth:`entries` made, each ``(b, n, u, d)`` (``u``: the positions, or the cache's slots).

        Returns:
            ``(keys, values)``, each ``(b, g, u, s)``.
        """
        k, v = entries
        return k, v


def check_cross_inputs(context: object, context_mask: object, cache: ContextCache | None, emb: int, batch: int, *,
                       like: Tensor | None = None) -> None:
    """The door check of what a cross-attention reads: a ``context`` or a filled cache, never both.

    With a cache, the context's keys, values and padding are in it (filled once by :meth:`CrossAttention.fill_cache`),
    so neither ``context`` nor ``context_mask`` may be given: a second source of the same facts could only disagree
    with the first. Shapes only, as Python ints: no device sync. A block and a stack call it at their doors too,
    before their self-attention writes into its cache.

    Args:
        context: the sequence the queries look at, ``(b, u, emb)``: required without a cache, ``None`` with one.
        context_mask: ``(b, u)``, True at real context tokens; ``None``: all real (and always with a cache).
        cache: the cross-attention's :class:`~torchformer.nn.cache.ContextCache`, or ``None``.
        emb: the embedding size ``e``.
        batch: the batch size ``b`` of the queries, which the context (or the cache) must have.
        like: a parameter of the layer, whose dtype the context must have (unless autocast is on).

    Raises:
        ValueError: the context is missing without a cache, given with one, or of a wrong shape; the cache was
            never filled, or holds another batch size.
        TypeError: the context or its mask is of the wrong kind or dtype.
    """
    if cache is None:
        if context is None:
            raise ValueError("context must be given without a cache: the sequence the queries look at, (b, u, e) "
                             "(the encoder's output)")
        check_context(context, context_mask, emb, batch, like=like)
        return
    if context is not None or context_mask is not None:
        raise ValueError("context and context_mask must be None with a cache: the cache holds the context's keys, "
                         "values and padding, computed once by fill_cache(cache, context, context_mask)")
    cache.check_batch(batch)


class CrossAttention(MultiHeadAttention):
    r"""Multi-head cross-attention: queries from ``x``, keys and values from another sequence, ``context``.

    For one sequence ``x`` ``(t, e)`` and its context $z$ ``(u, e)``, one row per position, and ``h`` heads of size
    ``s``:

    $$
    \begin{aligned}
    Q &= x W_q, \qquad K = z W_k, \qquad V = z W_v \\
    \operatorname{head}_n &= \operatorname{softmax}\left(\frac{Q_n K_n^\top}{\sqrt{s}} + M\right) V_n,
    \qquad n = 1, \ldots, h \\
    y &= \left[\operatorname{head}_1, \ldots, \operatorname{head}_h\right] W_o + b_o
    \end{aligned}
    $$

    As in :class:`SelfAttention`: $W_q$, $W_k$, $W_v$ are ``toqueries``, ``tokeys``, ``tovalues`` (no bias unless
    ``qkv_bias``; ``toqueries(x)`` is $x W_q$), $W_o$, $b_o$ are ``unifyheads``, and the heads $Q_n$ ``(t, s)``,
    $K_n$, $V_n$ ``(u, s)`` are consecutive blocks of ``s`` columns. $M$ ``(t, u)`` is 0 for real context tokens and
    $-\infty$ where ``context_mask`` marks padding; there is no causal rule, no window and no position scheme.

    This is how a decoder reads the encoder's output: ``forward(x, context, context_mask=None, *, positions=None,
    cache=None, return_weights=False, documents=None, context_documents=None)``, never causal (``causal`` is not an
    argument). Packed rows: ``documents`` ``(b, t)`` and ``context_documents`` ``(b, u)`` number the documents of
    the queries' and of the context's rows (the same documents in the same order: a target row and its source
    row), and query document ``d`` reads only context document ``d``; both or neither, not with a cache.

    The context does not change while a decoder generates, so incremental decoding computes its keys and values
    once: :meth:`fill_cache` stores them, with the context's padding, in a :class:`~torchformer.nn.cache.ContextCache`,
    and each step is then ``forward(x, cache=cache, positions=...)``, with no context (giving one as well is an
    error, as is a cache that was never filled).

    Args:
        emb: embedding size ``e`` of the inputs, the context and the outputs.
        heads: number of heads ``h``.
        wide: if True every head works on a full ``e``-dimensional projection, else on a chunk of ``e // h``.
        dropout: dropout on the attention weights (training only).
        kqnorm: layer normalisation of keys and queries per head, which keeps the logits bounded.
        impl: ``"sdpa"`` (fast path, default) or ``"reference"`` (plain matmul-softmax-matmul).
        kv_heads: heads of keys and values ``g`` (grouped-query attention); ``None``: ``h``.
        qkv_bias: a bias in the query, key and value projections; ``False``: none.
        out_bias: a bias in the output projection (``True``; ``False`` as Llama).
        head_size: ``s``, when it is not ``e // h`` (T5's ``d_kv``); ``None``: ``e // h`` (narrow) or ``e`` (wide).
        scale: the factor the scores are multiplied by; ``None``: ``1 / sqrt(s)``. T5's is ``1.0``.

    Shapes:
        ``x`` ``(b, t, e)``, ``context`` ``(b, u, e)``, ``context_mask`` ``(b, u)`` -> ``(b, t, e)``.
    """

    def __init__(self, emb: int, heads: int = 8, *, wide: bool = False, dropout: float = 0.0, kqnorm: bool = False,
                 impl: str = "sdpa", kv_heads: int | None = None, qkv_bias: bool = False,
                 out_bias: bool = True, head_size: int | None = None, scale: float | None = None) -> None:
        super().__init__(emb, heads, wide=wide, dropout=dropout, kqnorm=kqnorm, impl=impl, kv_heads=kv_heads,
                         qkv_bias=qkv_bias, out_bias=out_bias, head_size=head_size, scale=scale)

    @classmethod
    def from_config(cls, config: TransformerConfig, *, causal: bool = False, layer: int = 0,
                    positions: AttentionPositions | None = None) -> MultiHeadAttention:
        """The cross-attention layer of a decoder block of ``config``: never causal, no window, no positions.

        Args:
            config: the model's architecture: ``emb``, ``heads``, ``wide``, ``dropout``, ``kqnorm``, ``impl``,
                ``kv_heads``, ``qkv_bias``, ``out_bias``, ``head_dim`` and ``attention_scale`` are used.
            causal: accepted for the same signature as :meth:`MultiHeadAttention.from_config`, and ignored.
            layer: the block's index, from 0 at the input: unused here, as in :meth:`MultiHeadAttention.from_config`.
            positions: accepted for the same signature, and refused unless ``None``: the context's keys have no
                positions in the queries' sequence.

        Returns:
            A layer of the class this is called on (a :class:`CrossAttention`).
        """
        if positions is not None:
            raise ValueError("cross-attention takes no position scheme: the context's keys have no positions in the "
                             "queries' sequence")
        return super().from_config(config, causal=False, layer=layer)

    @classmethod
    def arguments_from_config(cls, config: TransformerConfig, *, causal: bool, layer: int,
                              positions: AttentionPositions | None) -> dict[str, Any]:
        """The keyword arguments of a cross-attention: :meth:`MultiHeadAttention.projection_arguments` alone.

        Args:
            config: the model's architecture.
            causal: unused (never causal).
            layer: the block's index, from 0 at the input.
            positions: unused (no position scheme).

        Returns:
            ``{name: value}`` for every keyword argument of :class:`CrossAttention`'s constructor.
        """
        return cls.projection_arguments(config)

    def project_context(self, context: Tensor, context_mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """The keys and values of ``context``, its padding zeroed first: ``(b, u, e) -> (b, g, u, s)`` twice.

        Args:
            context: the sequence the queries look at, ``(b, u, e)``.
            context_mask: ``(b, u)``, True at real context tokens; ``None``: all real.

        Returns:
            ``(keys, values)``, each ``(b, g, u, s)`` (``g = kv_heads``).
        """
        if context_mask is not None:  # padding never reaches the output, even when it holds NaN or inf
            context = context.masked_fill(~context_mask[:, :, None], 0.0)
        return self.project_keys_values(context)  # (b, u, e) -> (b, g, u, s) each

    def fill_cache(self, cache: ContextCache, context: Tensor, context_mask: Tensor | None = None) -> None:
        """Compute the keys and values of ``context`` once, into ``cache``, for every later decoding step.

        Call it once per context, before the first step; the steps then take no context (see the class docstring).

        Args:
            cache: an empty :class:`~torchformer.nn.cache.ContextCache` (a block's ``cache.cross_attention``).
            context: the sequence the queries will look at, ``(b, u, e)`` (the encoder's output).
            context_mask: ``(b, u)``, True at real context tokens; ``None``: all real. The cache keeps it.

        Raises:
            ValueError: ``context`` or ``context_mask`` has a wrong shape, or ``cache`` is already filled.
            TypeError: ``context`` or ``context_mask`` is of the wrong kind or dtype.
        """
        check_context(context, context_mask, self.emb, like=self.unifyheads.weight)
        cache.fill(*self.project_context(context, context_mask), context_mask)

    def forward(self, x: Tensor, context: Tensor | None = None, context_mask: Tensor | None = None, *,
                positions: Tensor | None = None, cache: ContextCache | None = None, return_weights: bool = False,
                documents: Tensor | None = None,
                context_documents: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        b, t = check_sequence_inputs(x, None, positions, self.emb, like=self.unifyheads.weight)
        check_cross_inputs(context, context_mask, cache, self.emb, b, like=self.unifyheads.weight)
        if (documents is None) != (context_documents is None):
            raise ValueError("documents and context_documents go together (packed target and source rows, query "
                             "document d reading context document d): give both or neither")
        if documents is not None:
            if cache is not None:
                raise ValueError("documents (packed rows) are for whole sequences: give no cache with them")
            documents = check_documents(documents, b, t, x.device)
            context_documents = check_documents(context_documents, b, context.size(1), x.device,  # type: ignore
                                                "context_documents", "(b, u)")
        if positions is None:
            positions = torch.arange(x.size(1), device=x.device)  # (t,)
        q = self.project_queries(x)  # (b, h, t, s)
        if cache is None:
            k, v = self.project_context(context, context_mask)  # type: ignore[arg-type]  # (b, g, u, s) each
        else:  # computed once, by fill_cache: (b, g, u, s) each, and the context's padding (b, u) or None
            k, v, context_mask = cache.keys, cache.values, cache.mask
        attention_mask = AttentionMask(positions, None, context_mask, documents=documents,  # k, v: (b, g, u, s)
                                       key_documents=context_documents)
        out, weights = self.attend(q, k, v, attention_mask, return_weights=return_weights)
        out = self.finish(out, attention_mask, x)
        return (out, weights) if return_weights else out  # type: ignore[return-value]
