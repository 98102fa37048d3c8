"""The transformer block: attention, then a position-wise feed-forward network, each wrapped in a residual
connection and layer normalisation.

Attention is the only place where positions exchange information; the feed-forward network then transforms each
position on its own. The residual connections (``x + f(x)``) let gradients flow straight through deep stacks, and
layer normalisation keeps the activations at a stable scale.

Two orderings are in use:

* **post-norm** (default; Vaswani et al. and ``former``): ``x = norm(x + f(x))``.
* **pre-norm** (``prenorm=True``; GPT-2 and most large models): ``x = x + f(norm(x))``. It trains more stably at
  depth, and the stack then needs one final normalisation after its last block (see :mod:`torchformer.nn.stacks`).

With ``cross=True`` a block has three sublayers: causal self-attention, cross-attention to a ``context`` (the
encoder's output), and the feed-forward network. That is the decoder block of an encoder-decoder model.

Shapes: b batch size, t sequence length, u context length, e embedding size.
"""

from __future__ import annotations

from torch import Tensor, nn

from torchformer._checks import check_choice, check_embeddings, check_positive_int, check_probability
from torchformer.nn.attention import CrossAttention, KVCache, SelfAttention

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU}


class FeedForward(nn.Module):
    """Two linear layers with a nonlinearity between: ``(b, t, e) -> (b, t, ff_mult * e) -> (b, t, e)``."""

    def __init__(self, emb: int, *, ff_mult: int = 4, activation: str = "relu", dropout: float = 0.0) -> None:
        super().__init__()
        check_positive_int(ff_mult, "ff_mult")
        check_choice(activation, "activation", tuple(ACTIVATIONS))
        self.net = nn.Sequential(
            nn.Linear(emb, ff_mult * emb),
            ACTIVATIONS[activation](),
            nn.Dropout(dropout),
            nn.Linear(ff_mult * emb, emb),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class BlockCache:
    """The per-block state kept during incremental decoding: one :class:`KVCache` per attention layer.

    Fresh, growing caches by default; pass others (e.g. a :class:`~torchformer.nn.attention.StaticKVCache`) to use them.
    """

    def __init__(self, self_attention: KVCache | None = None, cross_attention: KVCache | None = None) -> None:
        self.self_attention = KVCache() if self_attention is None else self_attention
        self.cross_attention = KVCache() if cross_attention is None else cross_attention

    def reorder(self, index) -> None:
        self.self_attention.reorder(index)
        self.cross_attention.reorder(index)


class TransformerBlock(nn.Module):
    """One transformer block. ``forward(x, mask=None, context=None, context_mask=None)``: ``(b, t, e) -> (b, t, e)``.

    Args:
        emb, heads: embedding size and number of attention heads.
        causal: self-attention only looks backwards (for generators and decoders).
        wide: wide attention heads (see :mod:`torchformer.nn.attention`).
        cross: add cross-attention to a ``context`` ``(b, u, e)`` between self-attention and feed-forward.
        ff_mult: hidden size of the feed-forward network, as a multiple of ``emb``.
        dropout: dropout on attention weights and after each sublayer.
        prenorm: pre-norm ordering instead of post-norm.
        activation: ``"relu"`` or ``"gelu"``.
        kqnorm, impl: passed to the attention layers.
    """

    def __init__(
        self,
        emb: int,
        heads: int,
        *,
        causal: bool = False,
        wide: bool = False,
        cross: bool = False,
        ff_mult: int = 4,
        dropout: float = 0.0,
        prenorm: bool = False,
        activation: str = "relu",
        kqnorm: bool = False,
        impl: str = "sdpa",
    ) -> None:
        super().__init__()
        check_probability(dropout, "dropout")
        attention = dict(wide=wide, dropout=dropout, kqnorm=kqnorm, impl=impl)
        self.prenorm, self.cross = bool(prenorm), bool(cross)
        self.attention = SelfAttention(emb, heads, causal=causal, **attention)
        self.norm1 = nn.LayerNorm(emb)
        if cross:
            self.cross_attention = CrossAttention(emb, heads, **attention)
            self.norm_cross = nn.LayerNorm(emb)
        self.ff = FeedForward(emb, ff_mult=ff_mult, activation=activation, dropout=dropout)
        self.norm2 = nn.LayerNorm(emb)
        self.drop = nn.Dropout(dropout)

    def sublayer(self, x: Tensor, norm: nn.Module, f) -> Tensor:
        """Residual connection around ``f``, with the normalisation before (pre-norm) or after (post-norm)."""
        if self.prenorm:
            return x + self.drop(f(norm(x)))
        return norm(x + self.drop(f(x)))

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        context: Tensor | None = None,
        context_mask: Tensor | None = None,
        *,
        cache: BlockCache | None = None,
    ) -> Tensor:
        check_embeddings(x, "x", self.attention.emb, like=self.norm1.weight)
        if self.cross and context is None:
            raise ValueError("context must be given to a block built with cross=True (it has cross-attention)")
        if not self.cross and context is not None:
            raise ValueError("context was given, but this block has no cross-attention; build it with cross=True")
        self_cache = cache.self_attention if cache is not None else None
        x = self.sublayer(x, self.norm1, lambda y: self.attention(y, mask, cache=self_cache))
        if self.cross:
            cross_cache = cache.cross_attention if cache is not None else None
            x = self.sublayer(
                x, self.norm_cross, lambda y: self.cross_attention(y, context, context_mask, cache=cross_cache)
            )
        return self.sublayer(x, self.norm2, self.ff)
