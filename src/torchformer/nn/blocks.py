"""The transformer block: attention, then a position-wise feed-forward network, each in a residual and a norm.

Post-norm or pre-norm: ``docs/blocks.md``; a variant is a subclass naming other parts: ``docs/extending.md``.
Shapes: b batch size, t sequence length, u context length, e embedding size.
"""

from __future__ import annotations

from typing import Any, Callable

from torch import Tensor, nn

from torchformer._checks import check_documents, check_sequence_inputs
from torchformer.config import TransformerConfig
from torchformer.nn.attention import CrossAttention, MultiHeadAttention, SelfAttention, check_cross_inputs
from torchformer.nn.cache import BlockCache
from torchformer.nn.feedforward import FeedForward, GatedFeedForward
from torchformer.nn.norms import make_norm
from torchformer.nn.relative import AttentionPositions


class TransformerBlock(nn.Module):
    """Self-attention and feed-forward: an encoder's block, or with ``causal`` a generator's.

    Args:
        config: the architecture (``emb``, ``prenorm``, ``norm``, ``dropout``, and what the parts read).
        causal: self-attention only looks backwards (generators).
        layer: the block's index in its stack, from 0 at the input; every part's ``from_config`` receives it.
        positions: the stack's shared scheme (T5's table, :meth:`stack_positions`); ``None``: the attention's own.

    Raises:
        TypeError: (at class creation) a subclass sets ``feedforward_class``, no longer read.

    Shapes:
        ``forward(x, mask=None, *, positions=None, cache=None, documents=None)``: ``x`` ``(b, t, e)`` -> ``(b, t, e)``;
        the other arguments as :meth:`self_attend` takes them.
    """

    attention_class: type[MultiHeadAttention] = SelfAttention
    # The feed-forward network for each config.activation, built with its from_config. A variant replaces one
    # entry ({**TransformerBlock.feedforward_classes, "swiglu": MyGLU}) or all (dict.fromkeys(ACTIVATIONS, MyFF)).
    feedforward_classes: dict[str, type[nn.Module]] = {
        "relu": FeedForward, "gelu": FeedForward, "gelu_tanh": FeedForward, "relu2": FeedForward,
        "swiglu": GatedFeedForward, "geglu": GatedFeedForward, "geglu_tanh": GatedFeedForward,
    }

    def __init__(self, config: TransformerConfig, *, causal: bool = False, layer: int = 0,
                 positions: AttentionPositions | None = None) -> None:
        super().__init__()
        self.emb, self.prenorm = config.emb, config.prenorm
        self.layer = layer  # which block of the stack this is, from 0: a variant may depend on its depth
        # A shared scheme is passed on only when there is one, so that an attention variant whose from_config
        # lacks the argument still builds every model that does not share.
        shared = {} if positions is None else {"positions": positions}
        self.attention = self.attention_class.from_config(config, causal=causal, layer=layer, **shared)
        self.norm1 = make_norm(config.norm, config.emb, eps=config.norm_eps)
        self.build_middle(config)
        self.ff = self.feedforward_for(config).from_config(config, layer=layer)  # type: ignore[attr-defined]
        self.norm2 = make_norm(config.norm, config.emb, eps=config.norm_eps)
        self.drop = nn.Dropout(config.dropout)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "feedforward_class" in vars(cls):  # an attribute no longer read would be silently ignored
            raise TypeError(f"{cls.__name__}.feedforward_class is no longer read: name the network per activation, "
                            f"e.g. feedforward_classes = dict.fromkeys(ACTIVATIONS, "
                            f"{vars(cls)['feedforward_class'].__name__}) (ACTIVATIONS from torchformer.config), or "
                            f"{{**TransformerBlock.feedforward_classes, 'relu': ...}}")

    @classmethod
    def stack_positions(cls, config: TransformerConfig, *, causal: bool) -> AttentionPositions | None:
        """The one scheme all blocks of a stack share, or ``None`` (each block's attention builds its own).

        Args:
            config: the architecture of the blocks.
            causal: whether the blocks' self-attention is causal.

        Returns:
            The scheme :attr:`attention_class` builds for ``config``, with ``config.relative_shared`` (T5's table)
            or when its class in ``position_classes`` is ``shareable`` (rotary, ALiBi: no parameters); else ``None``.
        """
        named = cls.attention_class.position_classes.get(config.positions)
        if not (config.relative_shared or (named is not None and named.shareable)):
            return None  # decided from the class, so a scheme with parameters is never built for nothing
        scheme = cls.attention_class.positions_from_config(config, causal=causal)
        return scheme if config.relative_shared or scheme.shareable else None

    def share_positions(self, scheme: AttentionPositions) -> None:
        """Use the stack's shareable ``scheme`` in the self-attention (:meth:`MultiHeadAttention.share_positions`)."""
        self.attention.share_positions(scheme)

    @classmethod
    def needs_final_norm(cls, config: TransformerConfig) -> bool:
        """Whether a stack of these blocks ends with a norm: ``config.prenorm`` here (pre-norm output is unnormalised).

        Args:
            config: the architecture of the blocks.
        """
        return config.prenorm

    def feedforward_for(self, config: TransformerConfig) -> type[nn.Module]:
        """The class of this block's feed-forward network, from :attr:`feedforward_classes`.

        Args:
            config: the architecture; ``config.activation`` picks the class (a variant may read ``self.layer`` too).

        Returns:
            A class with ``from_config(config, layer=...)``.

        Raises:
            ValueError: :attr:`feedforward_classes` has no class for ``config.activation``.
        """
        if config.activation not in self.feedforward_classes:
            raise ValueError(f"{type(self).__name__}.feedforward_classes has no network for activation "
                             f"{config.activation!r} (it has {', '.join(self.feedforward_classes)})")
        return self.feedforward_classes[config.activation]

    def build_middle(self, config: TransformerConfig) -> None:
        """Build the sublayers between self-attention and feed-forward (none here; see :class:`DecoderBlock`).

        Args:
            config: the architecture the block is built from.
        """

    @staticmethod
    def zero_padding(x: Tensor, mask: Tensor | None) -> Tensor:
        """``x`` with its padded rows zeroed, so padding (even NaN) never reaches real positions or gradients.

        Args:
            x: activations ``(b, t, e)``.
            mask: ``(b, t)``, True for real tokens; ``None``: all real.

        Returns:
            ``(b, t, e)``.
        """
        return x if mask is None else x.masked_fill(~mask[..., None], 0.0)

    def sublayer(self, x: Tensor, norm: nn.Module, f: Callable[[Tensor], Tensor]) -> Tensor:
        """``x + dropout(f(norm(x)))`` (pre-norm) or ``norm(x + dropout(f(x)))`` (post-norm).

        Args:
            x: the block's running activations ``(b, t, e)``.
            norm: this sublayer's normalisation (``norm1``, ``norm_cross`` or ``norm2``).
            f: the sublayer, ``(b, t, e) -> (b, t, e)``.

        Returns:
            The new activations ``(b, t, e)``.
        """
        if self.prenorm:
            return x + self.drop(f(norm(x)))
        return norm(x + self.drop(f(x)))

    def forward(self, x: Tensor, mask: Tensor | None = None, *, positions: Tensor | None = None,
                cache: BlockCache | None = None, documents: Tensor | None = None) -> Tensor:
        b, t = check_sequence_inputs(x, mask, positions, self.emb)
        # Packed rows' documents are passed on only when there are some, so that a variant's self_attend (or its
        # attention's forward) written without them still works for rows of one document.
        packed = {}
        if documents is not None:
            documents = check_documents(documents, b, t, x.device)
            packed = {"documents": documents}
        x = self.zero_padding(x, mask)
        x = self.sublayer(x, self.norm1, lambda y: self.self_attend(y, mask, positions, cache, **packed))
        return self.sublayer(x, self.norm2, lambda y: self.feed_forward(y, mask))

    def feed_forward(self, y: Tensor, mask: Tensor | None) -> Tensor:
        """The feed-forward sublayer alone: ``self.ff(y, mask)`` ``(b, t, e)``, before dropout and the residual.

        Args:
            y: the (normalised) activations ``(b, t, e)``.
            mask: ``(b, t)``, True for real tokens (a mixture of experts routes only those); ``None``: all real.
        """
        return self.ff(y, mask)

    def self_attend(self, y: Tensor, mask: Tensor | None, positions: Tensor | None, cache: BlockCache | None,
                    documents: Tensor | None = None) -> Tensor:
        """The self-attention sublayer alone, ``(b, t, e)`` before dropout and the residual, with its part of the cache.

        Args:
            y: the (normalised) activations ``(b, t, e)``.
            mask: ``(b, t)``, True for real tokens; ``None``: all real.
            positions: ``(t,)``, the absolute positions; ``None``: ``0 .. t-1``.
            cache: the block's :class:`~torchformer.nn.cache.BlockCache`, or ``None``.
            documents: ``(b, t)``, the document of each token of packed rows; ``None``: one per row.
        """
        packed = {} if documents is None else {"documents": documents}  # (see forward)
        return self.attention(y, mask, positions=positions, cache=None if cache is None else cache.self_attention,
                              **packed)


class DecoderBlock(TransformerBlock):
    """Causal self-attention, cross-attention to ``context``, feed-forward: the block of a decoder.

    Arguments: as :class:`TransformerBlock`'s, the self-attention always causal.

    Raises:
        ValueError: a context with a filled cache or none without, or a shape that does not fit.

    Shapes:
        ``forward(x, context=None, mask=None, context_mask=None, *, positions=None, cache=None, documents=None,
        context_documents=None)``: as :class:`TransformerBlock`; the context's as :meth:`cross_attend` takes them.
    """

    cross_attention_class: type[MultiHeadAttention] = CrossAttention

    def __init__(self, config: TransformerConfig, *, layer: int = 0,
                 positions: AttentionPositions | None = None) -> None:
        super().__init__(config, causal=True, layer=layer, positions=positions)

    def build_middle(self, config: TransformerConfig) -> None:
        """As :meth:`TransformerBlock.build_middle`: build the cross-attention and its norm (``norm_cross``)."""
        self.cross_attention = self.cross_attention_class.from_config(config, layer=self.layer)
        self.norm_cross = make_norm(config.norm, config.emb, eps=config.norm_eps)

    def fill_cache(self, cache: BlockCache, context: Tensor, context_mask: Tensor | None = None) -> None:
        """As :meth:`CrossAttention.fill_cache`, into ``cache.cross_attention`` (``cache``: the block's BlockCache)."""
        self.cross_attention.fill_cache(cache.cross_attention, context, context_mask)  # type: ignore[attr-defined]

    def forward(  # type: ignore[override]
            self, x: Tensor, context: Tensor | None = None, mask: Tensor | None = None,
            context_mask: Tensor | None = None, *, positions: Tensor | None = None,
            cache: BlockCache | None = None, documents: Tensor | None = None,
            context_documents: Tensor | None = None) -> Tensor:
        b, t = check_sequence_inputs(x, mask, positions, self.emb)
        # Before the self-attention writes into its cache: a call that cannot finish must change nothing.
        check_cross_inputs(context, context_mask, None if cache is None else cache.cross_attention, self.emb, b)
        # Passed on only when given (see TransformerBlock.forward); the cross-attention checks the pair.
        packed = {} if documents is None else {"documents": check_documents(documents, b, t, x.device)}
        crossed = ({} if documents is None and context_documents is None else
                   {"documents": packed.get("documents"), "context_documents": context_documents})
        x = self.zero_padding(x, mask)
        x = self.sublayer(x, self.norm1, lambda y: self.self_attend(y, mask, positions, cache, **packed))
        x = self.sublayer(x, self.norm_cross,
                          lambda y: self.cross_attend(y, context, context_mask, positions, cache, **crossed))
        return self.sublayer(x, self.norm2, lambda y: self.feed_forward(y, mask))

    def cross_attend(self, y: Tensor, context: Tensor | None, context_mask: Tensor | None, positions: Tensor | None,
                     cache: BlockCache | None, documents: Tensor | None = None,
                     context_documents: Tensor | None = None) -> Tensor:
        """The cross-attention sublayer alone, ``(b, t, e)`` before dropout and residual, with its part of the cache.

        Args:
            y: the (normalised) activations ``(b, t, e)``.
            context: the encoder's output ``(b, u, e)``; ``None`` with a filled cache.
            context_mask: ``(b, u)``, True for real context tokens; ``None``: all real (and with a cache).
            positions: ``(t,)``, the absolute positions of the queries; ``None``: ``0 .. t-1``.
            cache: the block's :class:`~torchformer.nn.cache.BlockCache`, or ``None``.
            documents: ``(b, t)``, each target token's document in packed rows; ``None``: one per row.
            context_documents: ``(b, u)``, each context token's document (with ``documents``).
        """
        kv = None if cache is None else cache.cross_attention
        packed = ({} if documents is None and context_documents is None else
                  {"documents": documents, "context_documents": context_documents})
        return self.cross_attention(y, context, context_mask, positions=positions, cache=kv, **packed)
