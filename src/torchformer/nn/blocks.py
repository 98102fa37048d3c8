"""The transformer block: attention, then a position-wise feed-forward network.

Each of the two is wrapped in a residual connection and a normalisation. Attention is the only place where positions
exchange information; the feed-forward network then transforms each position on its own. The residual connections
(``x + f(x)``) let gradients flow straight through deep stacks, and normalisation keeps the activations at a stable
scale. ``config.norm`` picks LayerNorm or RMSNorm (:mod:`torchformer.nn.norms`) and ``config.activation`` the
feed-forward network (:mod:`torchformer.nn.feedforward`).

Two orderings are in use:

* **post-norm** (default; Vaswani et al. and ``former``): ``x = norm(x + f(x))``.
* **pre-norm** (``prenorm=True``; GPT-2 and most large models): ``x = x + f(norm(x))``. It trains more stably at
  depth, and the stack then needs one final normalisation after its last block (see :mod:`torchformer.nn.stacks`).

Two kinds of block:

* :class:`TransformerBlock`: self-attention and feed-forward. Bidirectional in a classifier's encoder, causal
  (``causal=True``) in a generator: a GPT-style "decoder-only" model is a stack of causal ``TransformerBlock``\\ s.
* :class:`DecoderBlock`: causal self-attention, cross-attention to a ``context`` (the encoder's output), and the
  feed-forward network: the decoder block of an encoder-decoder model.

Both are built from a :class:`~torchformer.config.TransformerConfig` and their index in the stack (``layer``, from 0),
which reaches every part's ``from_config``. The classes of their parts are class attributes (``attention_class``,
``cross_attention_class``, and ``feedforward_classes`` by ``activation``, per block through ``feedforward_for``), so a
variant is a subclass that names another class; the sublayers are methods (``self_attend``, ``cross_attend``,
``feed_forward``, ``sublayer``), so a block wired another way overrides only ``forward``, and ``needs_final_norm``
tells the stack whether to end with a norm. The feed-forward network gets the padding mask (a mixture of experts
routes only real tokens). See ``docs/extending.md``.

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
    """Self-attention and feed-forward.

    ``forward(x, mask=None, *, positions=None, cache=None, documents=None)``: ``mask`` marks real tokens,
    ``positions`` their absolute positions, ``cache`` a :class:`~torchformer.nn.cache.BlockCache` for incremental
    decoding (:class:`SelfAttention`), ``documents`` ``(b, t)`` the document of each token of packed rows.

    Args:
        config: the architecture (``emb``, ``heads``, ``wide``, ``dropout``, ``prenorm``, ``norm``, ``ff_mult``,
            ``activation``, and what the attention reads: ``kqnorm``, ``impl``, ``positions``, ``kv_heads``,
            ``window``).
        causal: self-attention only looks backwards (generators).
        layer: the block's index in its stack, from 0 at the input; every part's ``from_config`` receives it.
        positions: a position scheme the self-attention shares with the other blocks of its stack (T5's one
            relative bias, ``relative_shared``: :meth:`stack_positions` builds it, the stack hands it to every
            block); ``None``: the attention builds its own.

    Shapes:
        ``x`` ``(b, t, e)``, ``mask`` ``(b, t)``, ``positions`` ``(t,)`` -> ``(b, t, e)``.
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
        # predates the argument still builds every model that does not share.
        shared = {} if positions is None else {"positions": positions}
        self.attention = self.attention_class.from_config(config, causal=causal, layer=layer, **shared)
        self.norm1 = make_norm(config.norm, config.emb, eps=config.norm_eps)
        self.build_middle(config)
        self.ff = self.feedforward_for(config).from_config(config, layer=layer)  # type: ignore[attr-defined]
        self.norm2 = make_norm(config.norm, config.emb, eps=config.norm_eps)
        self.drop = nn.Dropout(config.dropout)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "feedforward_class" in vars(cls):  # the attribute of torchformer < 0.5 would now be silently ignored
            raise TypeError(f"{cls.__name__}.feedforward_class is no longer read: name the network per activation, "
                            f"e.g. feedforward_classes = dict.fromkeys(ACTIVATIONS, "
                            f"{vars(cls)['feedforward_class'].__name__}) (ACTIVATIONS from torchformer.config), or "
                            f"{{**TransformerBlock.feedforward_classes, 'relu': ...}}")

    @classmethod
    def stack_positions(cls, config: TransformerConfig, *, causal: bool) -> AttentionPositions | None:
        """The one position scheme all blocks of a stack share, or ``None`` when each attention builds its own.

        T5 learns one relative-position table per stack (``relative_shared``): the stack calls this once and
        passes the result to every block as ``positions``, so each self-attention adds the bias of the same table.

        Args:
            config: the architecture of the blocks.
            causal: whether the blocks' self-attention is causal (a decoder's: one-sided buckets).

        Returns:
            The scheme :attr:`attention_class` builds for ``config``, with ``config.relative_shared``; else
            ``None``.
        """
        if not config.relative_shared:
            return None
        return cls.attention_class.positions_from_config(config, causal=causal)

    @classmethod
    def needs_final_norm(cls, config: TransformerConfig) -> bool:
        """Whether a stack of these blocks ends with a norm.

        With pre-norm, a block leaves its output unnormalised (the residual stream), so the stack normalises it once
        at the end.

        Args:
            config: the architecture of the blocks.

        Returns:
            ``config.prenorm`` here; a variant whose output is unnormalised in another way (a parallel block)
            says so by overriding this.
        """
        return config.prenorm

    def feedforward_for(self, config: TransformerConfig) -> type[nn.Module]:
        """The class of this block's feed-forward network: the one :attr:`feedforward_classes` names.

        ``self.layer`` is set, so a variant whose networks differ with depth (a mixture of experts after some
        dense blocks) overrides this.

        Args:
            config: the architecture; ``config.activation`` picks the class.

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
        """Build the sublayers between self-attention and feed-forward: none here.

        The constructor calls it after the self-attention and before the feed-forward network, so the parameters are
        created (and listed) in the order they run; ``self.layer`` is already set. A :class:`DecoderBlock` adds its
        cross-attention here.

        Args:
            config: the architecture the block is built from.
        """

    @staticmethod
    def zero_padding(x: Tensor, mask: Tensor | None) -> Tensor:
        """``x`` with its padded rows set to zero, so that padding never reaches real positions, not even backwards.

        Attention already gives padded keys no weight, so real outputs never read padded rows. But the norms and
        the feed-forward network still run on them, and their weight gradients sum over every row: a padded row
        holding NaN or inf (what a caller's embeddings may leave there) would make ``0 * NaN = NaN`` gradients.

        Args:
            x: activations ``(b, t, e)``.
            mask: ``(b, t)``, True for real tokens; ``None``: every position is real.

        Returns:
            ``(b, t, e)``: ``x`` where ``mask`` is True, zero elsewhere.
        """
        return x if mask is None else x.masked_fill(~mask[..., None], 0.0)

    def sublayer(self, x: Tensor, norm: nn.Module, f: Callable[[Tensor], Tensor]) -> Tensor:
        """Residual connection around ``f``, with the normalisation before (pre-norm) or after (post-norm).

        Pre-norm: ``x + dropout(f(norm(x)))``; post-norm: ``norm(x + dropout(f(x)))``.

        Args:
            x: the block's running activations ``(b, t, e)``.
            norm: this sublayer's normalisation (``norm1``, ``norm_cross`` or ``norm2``).
            f: the sublayer, ``(b, t, e) -> (b, t, e)``: attention or the feed-forward network.

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
        """The feed-forward sublayer alone, ``(b, t, e) -> (b, t, e)``: ``self.ff(y, mask)``.

        The network sees the padding mask, so that a mixture of experts routes, and counts, only real tokens.

        Args:
            y: the (normalised) activations ``(b, t, e)``.
            mask: ``(b, t)``, True for real tokens; ``None``: all real.

        Returns:
            The network's output ``(b, t, e)`` (before dropout and the residual).
        """
        return self.ff(y, mask)

    def self_attend(self, y: Tensor, mask: Tensor | None, positions: Tensor | None, cache: BlockCache | None,
                    documents: Tensor | None = None) -> Tensor:
        """The self-attention sublayer alone, ``(b, t, e) -> (b, t, e)``, with its part of the block's cache.

        A block wired another way (a parallel block: ``x + attention(norm(x)) + ff(norm(x))``) reuses it.

        Args:
            y: the (normalised) activations ``(b, t, e)``.
            mask: ``(b, t)``, True for real tokens; ``None``: all real.
            positions: ``(t,)``, the absolute positions; ``None``: ``0 .. t-1``.
            cache: the block's :class:`~torchformer.nn.cache.BlockCache`, or ``None``.
            documents: ``(b, t)``, the document of each token of packed rows (attention stays within each);
                ``None``: one document per row.

        Returns:
            Self-attention's output ``(b, t, e)`` (before dropout and the residual).
        """
        packed = {} if documents is None else {"documents": documents}  # (see forward)
        return self.attention(y, mask, positions=positions, cache=None if cache is None else cache.self_attention,
                              **packed)


class DecoderBlock(TransformerBlock):
    """Causal self-attention, cross-attention to ``context``, feed-forward: the block of a decoder.

    ``forward(x, context, mask=None, context_mask=None, *, positions=None, cache=None, documents=None,
    context_documents=None)``: ``mask`` and ``context_mask`` mark real target and context tokens; ``cache`` is a
    :class:`~torchformer.nn.cache.BlockCache` for incremental decoding, whose cross-attention part
    :meth:`fill_cache` fills once from the context: the cached steps then take no ``context`` (``None``).
    ``documents`` ``(b, t)`` and ``context_documents`` ``(b, u)``: packed target and source rows (both or neither;
    :class:`~torchformer.nn.attention.CrossAttention`): self-attention stays within each target document, which
    reads only its own source document.

    Args:
        config: the architecture, as for :class:`TransformerBlock` (the self-attention is always causal).
        layer: the block's index in its stack, from 0 at the input; every part's ``from_config`` receives it.
        positions: the self-attention's position scheme, shared with the stack's other blocks (as for
            :class:`TransformerBlock`); the cross-attention has none. ``None``: the attention builds its own.

    Shapes:
        ``x`` ``(b, t, e)``, ``context`` ``(b, u, e)``, ``mask`` ``(b, t)``, ``context_mask`` ``(b, u)``,
        ``positions`` ``(t,)`` -> ``(b, t, e)``.
    """

    cross_attention_class: type[MultiHeadAttention] = CrossAttention

    def __init__(self, config: TransformerConfig, *, layer: int = 0,
                 positions: AttentionPositions | None = None) -> None:
        super().__init__(config, causal=True, layer=layer, positions=positions)

    def build_middle(self, config: TransformerConfig) -> None:
        """Build the cross-attention and its norm, between self-attention and feed-forward.

        Args:
            config: the architecture; ``cross_attention_class.from_config(config)`` builds the cross-attention.
        """
        self.cross_attention = self.cross_attention_class.from_config(config, layer=self.layer)
        self.norm_cross = make_norm(config.norm, config.emb, eps=config.norm_eps)

    def fill_cache(self, cache: BlockCache, context: Tensor, context_mask: Tensor | None = None) -> None:
        """Compute the cross-attention's keys and values of ``context`` once, into ``cache.cross_attention``.

        Call it once per context, before the first cached step (see
        :meth:`~torchformer.nn.attention.CrossAttention.fill_cache`).

        Args:
            cache: the block's :class:`~torchformer.nn.cache.BlockCache`, its cross-attention part empty.
            context: the encoder's output ``(b, u, e)``.
            context_mask: ``(b, u)``, True for real context tokens; ``None``: all real. The cache keeps it.

        Raises:
            ValueError: the cache's cross-attention part is already filled, or a shape is wrong.
        """
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
        """The cross-attention sublayer alone, ``(b, t, e) -> (b, t, e)``, with its part of the block's cache.

        Args:
            y: the (normalised) activations ``(b, t, e)``.
            context: the encoder's output ``(b, u, e)``; ``None`` with a cache (filled by :meth:`fill_cache`).
            context_mask: ``(b, u)``, True for real context tokens; ``None``: all real (and with a cache).
            positions: ``(t,)``, the absolute positions of the queries; ``None``: ``0 .. t-1``.
            cache: the block's :class:`~torchformer.nn.cache.BlockCache`, or ``None``.
            documents: ``(b, t)``, each target token's document in packed rows; ``None``: one per row.
            context_documents: ``(b, u)``, each context token's document (with ``documents``).

        Returns:
            Cross-attention's output ``(b, t, e)`` (before dropout and the residual).
        """
        kv = None if cache is None else cache.cross_attention
        packed = ({} if documents is None and context_documents is None else
                  {"documents": documents, "context_documents": context_documents})
        return self.cross_attention(y, context, context_mask, positions=positions, cache=kv, **packed)
