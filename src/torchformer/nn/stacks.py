"""Stacks of transformer blocks: the encoder and the decoder.

* :class:`Encoder`: ``depth`` non-causal blocks. Every position sees every (real) position. Used for
  classification and as the first half of an encoder-decoder model.
* :class:`Decoder`: ``depth`` causal blocks with cross-attention. Position ``i`` sees positions ``<= i`` of its own
  sequence and the whole ``context`` (the encoder's output).

A generator (GPT-style language model) is an encoder with causal blocks and no cross-attention; it is built in
:mod:`torchformer.models` from :class:`Encoder` with ``causal=True``.

With pre-norm blocks, the residual stream leaving the last block was never normalised, so the stack ends with a
final :class:`~torch.nn.LayerNorm` (as GPT-2 does). With post-norm blocks the last block already normalised it.

Shapes: b batch size, t sequence length, u context length, e embedding size.
"""

from __future__ import annotations

from torch import Tensor, nn

from torchformer._checks import check_positive_int
from torchformer.nn.blocks import BlockCache, TransformerBlock


def check_caches(caches: list[BlockCache] | None, depth: int) -> None:
    if caches is not None and len(caches) != depth:
        raise ValueError(f"caches must hold one BlockCache per block ({depth}), got {len(caches)}; use new_caches()")


class Encoder(nn.Module):
    """``depth`` transformer blocks. ``forward(x, mask=None)``: ``(b, t, e) -> (b, t, e)``.

    ``block_options`` are passed to every :class:`~torchformer.nn.blocks.TransformerBlock` (``wide``, ``dropout``,
    ``prenorm``, ``ff_mult``, ``activation``, ``kqnorm``, ``impl``, and ``causal``, which is False by default).
    """

    def __init__(self, emb: int, heads: int, depth: int, **block_options) -> None:
        super().__init__()
        check_positive_int(depth, "depth")
        if block_options.get("cross"):
            raise ValueError("Encoder blocks have no cross-attention; use Decoder for cross=True")
        block_options.pop("cross", None)
        self.blocks = nn.ModuleList(TransformerBlock(emb, heads, **block_options) for _ in range(depth))
        self.norm = nn.LayerNorm(emb) if block_options.get("prenorm") else nn.Identity()

    def forward(self, x: Tensor, mask: Tensor | None = None, *, caches: list[BlockCache] | None = None) -> Tensor:
        check_caches(caches, len(self.blocks))
        for i, block in enumerate(self.blocks):
            x = block(x, mask, cache=None if caches is None else caches[i])
        return self.norm(x)

    def new_caches(self) -> list[BlockCache]:
        """Fresh per-block caches for incremental decoding (only meaningful with ``causal=True``)."""
        return [BlockCache() for _ in self.blocks]


class Decoder(nn.Module):
    """``depth`` causal blocks with cross-attention.

    ``forward(x, context, mask=None, context_mask=None)``: ``x`` ``(b, t, e)``, ``context`` ``(b, u, e)``
    -> ``(b, t, e)``. ``mask`` ``(b, t)`` marks real target tokens, ``context_mask`` ``(b, u)`` real context tokens.
    """

    def __init__(self, emb: int, heads: int, depth: int, **block_options) -> None:
        super().__init__()
        check_positive_int(depth, "depth")
        for fixed in ("causal", "cross"):
            if fixed in block_options and not block_options[fixed]:
                raise ValueError(f"Decoder blocks are always built with {fixed}=True; got {fixed}=False")
            block_options.pop(fixed, None)
        self.blocks = nn.ModuleList(
            TransformerBlock(emb, heads, causal=True, cross=True, **block_options) for _ in range(depth)
        )
        self.norm = nn.LayerNorm(emb) if block_options.get("prenorm") else nn.Identity()

    def forward(
        self,
        x: Tensor,
        context: Tensor,
        mask: Tensor | None = None,
        context_mask: Tensor | None = None,
        *,
        caches: list[BlockCache] | None = None,
    ) -> Tensor:
        check_caches(caches, len(self.blocks))
        for i, block in enumerate(self.blocks):
            x = block(x, mask, context, context_mask, cache=None if caches is None else caches[i])
        return self.norm(x)

    def new_caches(self) -> list[BlockCache]:
        return [BlockCache() for _ in self.blocks]
