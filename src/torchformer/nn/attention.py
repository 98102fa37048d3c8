"""Multi-head attention: self-attention and cross-attention.

The formula and its paths: ``docs/attention.md``; heads: ``docs/heads.md``. Shapes: b batch, t queries, u keys (``t``,
or the context's length), e embedding, h heads, g key/value heads, s head size (``e // h`` narrow, ``e`` wide), c slots.
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
    """Plain scaled dot-product attention (matmul, softmax, matmul).

    Args:
        q: queries ``(b, h, t, s)``.
        k: keys ``(b, h, u, s)``.
        v: values ``(b, h, u, s)``.
        allowed: bool, broadcastable to ``(b, h, t, u)``, ``True`` where a query may see a key; ``None``: every key.
        dropout: probability of zeroing each weight before the values are mixed, applied whenever above 0.
        bias: floats added to the scores before the softmax, broadcastable to ``(b, h, t, u)``; ``None``: none.
        scale: the factor the dot products are multiplied by; ``None``: ``1 / sqrt(s)``.

    Returns:
        ``(output, weights)``: ``(b, h, t, s)``, and the weights before dropout ``(b, h, t, u)``, 0 where not allowed
        (a query with no allowed key: zero weights and a zero output).
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
    """The same function as :func:`attention_reference` by ``scaled_dot_product_attention``, without weights.

    Args:
        q: queries ``(b, h, t, s)``.
        k: keys ``(b, g, u, s)``, ``g`` dividing ``h``: each serves ``h / g`` consecutive query heads.
        v: values ``(b, g, u, s)``.
        allowed: bool, broadcastable to ``(b, h, t, u)``; ``None``: every key, or the causal rule with ``causal``.
        causal: the causal rule by SDPA's ``is_causal``; used only with ``allowed`` and ``bias`` ``None``, ``t == u``.
        dropout: probability of zeroing each weight, applied whenever above 0.
        every_row_has_key: promise that every query has an allowed key, skipping the guard against SDPA's NaN rows.
        bias: floats added to the scores, broadcastable to ``(b, h, t, u)``; ``None``: none.
        scale: the factor the dot products are multiplied by; ``None``: ``1 / sqrt(s)``.

    Returns:
        The output ``(b, h, t, s)``; exactly 0 for a query with no allowed key.
    """
    t, u = q.size(-2), k.size(-2)
    b, h, g = q.size(0), q.size(1), k.size(1)
    if g != h and t == 1 and allowed is None and bias is None and dropout == 0.0:
        # One query per head (a decoding step) seeing every key: the h / g query heads that share a key head are
        # h / g rows of one attention against it, (b, h, 1, s) -> (b, g, h/g, s). No keys repeated, and on the CPU
        # faster than SDPA's grouped kernel.
        out = F.scaled_dot_product_attention(q.reshape(b, g, h // g, q.size(-1)), k, v, scale=scale)
        return out.reshape(b, h, 1, v.size(-1))  # (b, g, h/g, s) -> (b, h, 1, s)
    groups = {}
    if g != h:  # g key/value heads for h query heads: SDPA shares them (torch 2.5+), else a copy
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
    """The same function as :func:`attention_reference` by ``flex_attention`` (``docs/long-context.md``); no dropout.

    Args:
        q: queries ``(b, h, t, s)``.
        k: keys ``(b, h, u, s)``.
        v: values ``(b, h, u, s)``.
        mask: the rule and the positions; the keys must have positions.
        bias: floats added to the scores, ``(h, t, u)``; ``None``: none.
        scale: the factor the dot products are multiplied by; ``None``: ``1 / sqrt(s)``.

    Returns:
        The output ``(b, h, t, s)``; exactly 0 for a query with no allowed key.

    Raises:
        ValueError: gradients are required on the CPU (flex attention has no CPU backward).
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
        wide: every head works on a full ``e``-dimensional projection; ``False``: on a chunk of ``e // h``.
        causal: query ``i`` attends only to keys ``<= i``.
        dropout: dropout on the attention weights (training only).
        kqnorm: layer normalisation of keys and queries per head, which keeps the logits bounded.
        impl: ``"sdpa"`` (default), ``"reference"`` (matmul-softmax-matmul) or ``"flex"`` (:func:`attention_flex`).
        positions: the scheme inside attention, ``"rotary"``, ``"rotary_interleaved"``, ``"alibi"``, ``"relative"``
            (:mod:`torchformer.nn.relative`) or a built :class:`AttentionPositions`; ``"none"``: they act elsewhere.
        kv_heads: ``g`` key/value heads (grouped-query attention), each serving ``h / g`` query heads; ``None``: ``h``.
        window: keys less than ``window`` positions away (causal: itself and ``window - 1`` before); ``None``: all.
        qkv_bias: a bias in the query, key and value projections (GPT-2, BERT).
        out_bias: a bias in the output projection ``unifyheads`` (``False`` as Llama).
        head_size: ``s`` (T5's ``d_kv``), the projections mapping ``e -> h * s``; ``None``: ``e // h``, or ``e`` wide.
        scale: the factor the scores ``q . k`` are multiplied by (T5: ``1.0``); ``None``: ``1 / sqrt(s)``.
        pattern: a sparse :class:`~torchformer.nn.masks.AttentionPattern` the positions must satisfy too.

    Raises:
        ValueError: a size, probability or choice out of range, ``head_size`` with ``wide``, an absolute
            ``positions`` scheme, or ``impl="flex"`` with dropout.
        TypeError: an argument of the wrong type (``pattern`` not an ``AttentionPattern``).

    Shapes:
        Queries ``(b, h, t, s)``, keys and values ``(b, g, u, s)``, outputs ``(b, t, e)``; ``forward``: the subclasses'.
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
        """The layer a block of ``config`` uses (how blocks build theirs, so a subclass plugs into every model).

        Args:
            config: the model's architecture (the fields :meth:`arguments_from_config` reads, ``emb`` and ``heads``).
            causal: query ``i`` attends only to keys ``<= i`` (a decoder's self-attention).
            layer: the block's index, from 0 at the input; unused here, read by variants that differ with depth.
            positions: a built scheme shared with other layers (``relative_shared``); ``None``: the layer's own.
        """
        arguments = cls.arguments_from_config(config, causal=causal, layer=layer, positions=positions)
        return cls(config.emb, config.heads, **arguments)._zero_init_output(config)

    @classmethod
    def arguments_from_config(cls, config: TransformerConfig, *, causal: bool, layer: int,
                              positions: AttentionPositions | None) -> dict[str, Any]:
        """The keyword arguments :meth:`from_config` builds ``cls(config.emb, config.heads, **arguments)`` with.

        Args:
            config: the model's architecture (:meth:`projection_arguments`, ``window``, ``sparse*``, ``positions``).
            causal: whether the layer is causal.
            layer: the block's index, from 0 at the input.
            positions: a shared position scheme, or ``None`` (:meth:`positions_from_config` builds one).
        """
        scheme = cls.positions_from_config(config, causal=causal) if positions is None else positions
        return {**cls.projection_arguments(config), "causal": causal, "positions": scheme, "window": config.window,
                "pattern": cls.pattern_from_config(config)}

    @classmethod
    def projection_arguments(cls, config: TransformerConfig) -> dict[str, Any]:
        """The keyword arguments self- and cross-attention share: heads, projections, norms, dropout.

        Args:
            config: the model's architecture.

        Returns:
            ``{name: value}`` for ``wide``, ``dropout``, ``kqnorm``, ``impl``, ``kv_heads``, ``qkv_bias``, ``out_bias``,
            ``head_size`` (``config.head_dim``) and ``scale`` (``config.attention_scale``).
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
        """The scheme :attr:`position_classes` names for ``config.positions``, a new one built by its ``from_config``.

        Args:
            config: the model's architecture; absolute ``positions`` get the base :class:`AttentionPositions` (a no-op).
            causal: whether the layer is causal.
        """
        scheme = cls.position_classes.get(config.positions, AttentionPositions)  # absolute schemes act elsewhere
        return scheme.from_config(config, causal=causal)

    def share_positions(self, scheme: AttentionPositions) -> None:
        """Use ``scheme``, built once for the whole stack, in place of this layer's own equal one.

        Args:
            scheme: a ``shareable`` scheme of the class and settings this layer built (its ``repr``).

        Raises:
            ValueError: ``scheme`` is not ``shareable``, or differs from this layer's own scheme.
        """
        own = self.relative
        if not scheme.shareable or type(scheme) is not type(own) or scheme.extra_repr() != own.extra_repr():
            raise ValueError(f"share_positions: the stack's scheme {scheme!r} (shareable={scheme.shareable}) must be "
                             f"a shareable scheme equal to this layer's own, {own!r}: a block whose layers differ "
                             f"returns None from stack_positions")
        self.relative = scheme

    @classmethod
    def pattern_from_config(cls, config: TransformerConfig) -> AttentionPattern | None:
        """The sparse pattern ``config.sparse`` names (:attr:`pattern_classes`), a new one, or ``None``.

        Args:
            config: the model's architecture: ``sparse``, ``sparse_stride``, ``sparse_summary``.
        """
        if config.sparse is None:
            return None
        pattern = cls.pattern_classes[config.sparse]
        if config.sparse == "fixed":
            return pattern(config.sparse_stride, config.sparse_summary)  # type: ignore[call-arg]
        return pattern(config.sparse_stride)  # type: ignore[call-arg]

    def score_value_widths(self) -> tuple[int, int]:
        """The widths a query meets the keys with, and the values' (for FLOP counts): ``(h * s, h * s)`` here."""
        return self.heads * self.head_size, self.heads * self.head_size

    def split_heads(self, x: Tensor) -> Tensor:
        """Split the last dimension into heads: ``(b, t, n * s) -> (b, n, t, s)``.

        Args:
            x: a projection ``(b, t, n * s)``, of queries (``n = h``) or of keys or values (``n = g``).

        Returns:
            ``(b, n, t, s)``, a view of ``x``.
        """
        b, t, _ = x.shape
        return x.view(b, t, -1, self.head_size).transpose(1, 2)

    def share_kv_heads(self, x: Tensor) -> Tensor:
        """Repeat each key/value head for its ``h / g`` query heads: ``(b, g, u, s) -> (b, h, u, s)``.

        Args:
            x: keys or values ``(b, g, u, s)``.

        Returns:
            ``(b, h, u, s)``: ``x`` itself when ``g = h``, else a copy.
        """
        return x if self.kv_heads == self.heads else x.repeat_interleave(self.heads // self.kv_heads, dim=1)

    def merge_heads(self, x: Tensor) -> Tensor:
        """Concatenate the heads again: ``(b, h, t, s) -> (b, t, h * s)``.

        Args:
            x: the heads' outputs ``(b, h, t, s)``.

        Returns:
            ``(b, t, h * s)``.
        """
        b, h, t, s = x.shape
        return x.transpose(1, 2).reshape(b, t, h * s)

    def project_queries(self, x: Tensor) -> Tensor:
        """The queries ``(b, h, t, s)`` of ``x``, split into heads (and normalised with ``kqnorm``).

        Args:
            x: the sequence whose positions ask, ``(b, t, e)``.
        """
        return self.qnorm(self.split_heads(self.toqueries(x)))  # (b, t, e) -> (b, h, t, s)

    def project_keys_values(self, y: Tensor) -> tuple[Tensor, Tensor]:
        """The keys (normalised with ``kqnorm``) and values of ``y``, split into the key/value heads ``(b, g, u, s)``.

        Args:
            y: the sequence looked at, ``(b, u, e)``: ``x`` for self-attention, the context for cross-attention.
        """
        k = self.knorm(self.split_heads(self.tokeys(y)))  # (b, u, e) -> (b, g, u, s)
        v = self.split_heads(self.tovalues(y))  # (b, u, e) -> (b, g, u, s)
        return k, v

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: AttentionMask, *,
               return_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """Attention proper; a subclass overrides it to try a variant, and masking and caching keep working.

        Args:
            q: queries ``(b, h, t, s)``.
            k: keys ``(b, g, u, s)``; a variant computing with them itself repeats them first (:meth:`share_kv_heads`).
            v: values ``(b, g, u, s)``.
            mask: which keys each query may see, and the absolute positions of queries and keys.
            return_weights: also return the attention weights (computed on the reference path).

        Returns:
            ``(output, weights)``: ``(b, h, t, s)``, and the weights before dropout ``(b, h, t, u)`` or ``None``.
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
        """Merge and mix the heads, zeroing the queries that saw no real key.

        Args:
            out: the output of :meth:`attend`, ``(b, h, t, s)``.
            mask: the mask :meth:`attend` used.
            x: the layer's input ``(b, t, e)``, unused here (a variant gating the heads reads it).

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
    """Multi-head self-attention: every position of ``x`` attends to the positions of ``x``.

    Arguments: as :class:`MultiHeadAttention` (``docs/attention.md``). ``forward(x, mask=None, *, positions=None,
    cache=None, documents=None, return_weights=False)``: ``mask`` ``(b, t)`` bool, ``True`` at real tokens (padding
    never changes the output at real positions); ``positions`` ``(t,)`` long, the tokens' absolute positions, default
    ``0 .. t-1``, required with a ``cache``, a :class:`~torchformer.nn.cache.KVCache` the new keys and values join
    (queries read it all); ``documents`` ``(b, t)`` int, each token's document in packed rows, non-decreasing, so a
    query sees its own (``docs/masks.md``); ``return_weights=True`` returns ``(out, weights)`` (the reference path).

    Raises:
        ValueError: a shape that does not fit (naming both), ``documents`` with a cache, a cache without positions.
        TypeError: an input of the wrong dtype.

    Shapes:
        ``x`` ``(b, t, e)`` -> ``(b, t, e)``; the weights ``(b, h, t, u)`` (``u = t``, or the cache slots read).
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
            # A dense read (every slot real, the last one this call's) needs no usable mask: the host knows.
            dense = cache.dense
            attention_mask = AttentionMask(positions, cache.key_positions, None if dense else usable,
                                           causal=self.causal, window=self.window, padded=cache.padded,
                                           pattern=self.pattern, ends_aligned=dense)
        k, v = self.keys_values(entries)  # (b, g, u, s) each: attend shares them between the query heads
        out, weights = self.attend(q, k, v, attention_mask, return_weights=return_weights)
        out = self.finish(out, attention_mask, x)
        return (out, weights) if return_weights else out  # type: ignore[return-value]

    def queries(self, x: Tensor, positions: Tensor) -> Tensor:
        """The queries ``(b, h, t, s)`` of ``x``, projected and rotated by their positions (``self.relative.rotate``).

        Args:
            x: the layer's input ``(b, t, e)``.
            positions: ``(t,)``, the absolute positions of ``x``'s tokens.
        """
        return self.relative.rotate(self.project_queries(x), positions)

    def entries(self, x: Tensor, positions: Tensor) -> tuple[Tensor, ...]:
        """What the layer keeps of each position: what a KV cache stores and :meth:`keys_values` reads.

        Args:
            x: the layer's input ``(b, t, e)``, padding zeroed.
            positions: ``(t,)``, the absolute positions of ``x``'s tokens.

        Returns:
            ``(keys, values)``, the keys rotated by their positions, each ``(b, g, t, s)``.
        """
        k, v = self.project_keys_values(x)  # (b, g, t, s) each
        return self.relative.rotate(k, positions), v

    def keys_values(self, entries: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
        """The keys and values ``(b, g, u, s)`` attention reads, from the entries of this call or every cache slot.

        Args:
            entries: what :meth:`entries` made, each ``(b, n, u, d)`` (``u``: the positions, or the cache's slots).
        """
        k, v = entries
        return k, v


def check_cross_inputs(context: object, context_mask: object, cache: ContextCache | None, emb: int, batch: int, *,
                       like: Tensor | None = None) -> None:
    """The door check of what a cross-attention reads, a ``context`` or a filled cache: shapes only (no device sync).

    Args:
        context: the sequence looked at, ``(b, u, emb)``: required without a cache, ``None`` with one.
        context_mask: ``(b, u)``, True at real context tokens; ``None``: all real (always with a cache).
        cache: the cross-attention's :class:`~torchformer.nn.cache.ContextCache`, or ``None``.
        emb: the embedding size ``e``.
        batch: the batch size ``b`` of the queries.
        like: a parameter of the layer, whose dtype the context must have (unless autocast is on).

    Raises:
        ValueError: no context without a cache or one with it, a wrong shape, an unfilled cache or another batch size.
        TypeError: the context or its mask of the wrong kind or dtype.
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
    """Multi-head cross-attention: queries from ``x``, keys and values from another sequence, ``context``.

    As :class:`SelfAttention` (``docs/encoder-decoder.md``), but never causal, with no window, position scheme or
    pattern: its arguments are :class:`MultiHeadAttention`'s others. ``forward(x, context, context_mask=None, *,
    positions=None, cache=None, return_weights=False, documents=None, context_documents=None)``: ``context_mask`` is
    ``True`` at real context tokens; ``documents`` and ``context_documents`` (both or neither, not with a cache) let
    query document ``d`` read only context document ``d``. With a cache filled by :meth:`fill_cache`, each step is
    ``forward(x, cache=cache, positions=...)``.

    Raises:
        ValueError: a context with a cache or none without, an unfilled cache, a shape that does not fit,
            ``documents`` without ``context_documents`` (or with a cache).

    Shapes:
        ``x`` ``(b, t, e)``, ``context`` ``(b, u, e)``, ``context_mask`` ``(b, u)``, ``documents`` ``(b, t)``,
        ``context_documents`` ``(b, u)`` -> ``(b, t, e)``.
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

        As :meth:`MultiHeadAttention.from_config`; ``causal`` is ignored, ``config`` read for its projections.

        Raises:
            ValueError: ``positions`` is given.
        """
        if positions is not None:
            raise ValueError("cross-attention takes no position scheme: the context's keys have no positions in the "
                             "queries' sequence")
        return super().from_config(config, causal=False, layer=layer)

    @classmethod
    def arguments_from_config(cls, config: TransformerConfig, *, causal: bool, layer: int,
                              positions: AttentionPositions | None) -> dict[str, Any]:
        """As :meth:`MultiHeadAttention.arguments_from_config`: the projection arguments alone."""
        return cls.projection_arguments(config)

    def project_context(self, context: Tensor, context_mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """The keys and values ``(b, g, u, s)`` of ``context``, its padding zeroed first.

        Args:
            context: the sequence the queries look at, ``(b, u, e)``.
            context_mask: ``(b, u)``, True at real context tokens; ``None``: all real.
        """
        if context_mask is not None:  # padding never reaches the output, even when it holds NaN or inf
            context = context.masked_fill(~context_mask[:, :, None], 0.0)
        return self.project_keys_values(context)  # (b, u, e) -> (b, g, u, s) each

    def fill_cache(self, cache: ContextCache, context: Tensor, context_mask: Tensor | None = None) -> None:
        """Compute the keys and values of ``context`` once, into ``cache``, before the first decoding step.

        Args:
            cache: an empty :class:`~torchformer.nn.cache.ContextCache` (a block's ``cache.cross_attention``).
            context: the sequence the queries will look at, ``(b, u, e)``.
            context_mask: ``(b, u)``, True at real context tokens, kept by the cache; ``None``: all real.

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
