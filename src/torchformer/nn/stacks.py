"""Stacks of transformer blocks: the encoder and the decoder.

* :class:`Encoder`: ``depth`` :class:`~torchformer.nn.blocks.TransformerBlock`\\ s. Bidirectional by default (every
  position sees every real position): a classifier, or the first half of an encoder-decoder model. With
  ``causal=True`` it is the stack of a GPT-style generator, which the literature calls "decoder-only"; torchformer
  keeps the name :class:`Decoder` for the stack that also reads an encoder's output.
* :class:`Decoder`: ``depth`` :class:`~torchformer.nn.blocks.DecoderBlock`\\ s: causal self-attention and
  cross-attention to the ``context`` (the encoder's output).

With ``config.relative_shared`` (T5), a stack builds one relative-position table and every block's self-attention
adds its bias (:func:`shared_positions`); otherwise each attention layer has its own.

With pre-norm blocks, the residual stream leaving the last block was never normalised, so the stack ends with a
final normalisation (as GPT-2 does), of the blocks' kind (``config.norm``: LayerNorm or RMSNorm). With post-norm
blocks the last block already normalised it.

Both are built from a :class:`~torchformer.config.TransformerConfig`; ``block_class`` picks the block (a subclass
for a variant, see ``docs/extending.md``).

With ``config.checkpoint_blocks`` (activation checkpointing) each block's call goes through
``torch.utils.checkpoint`` while training: the forward pass keeps only the block's inputs, and the backward pass runs
the block again to get the activations it needs. Non-reentrant checkpointing replays the random number generator, so
dropout draws the same masks both times and the gradients are those of the plain model. It is skipped when nothing
needs gradients (evaluation, ``torch.no_grad``) and with KV caches: decoding writes the caches, and a recomputation
would write them twice.

Shapes: b batch size, t sequence length, u context length, e embedding size.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from torchformer._checks import check_documents, check_sequence_inputs
from torchformer.config import TransformerConfig
from torchformer.nn.attention import check_cross_inputs
from torchformer.nn.blocks import DecoderBlock, TransformerBlock
from torchformer.nn.cache import BlockCache, check_caches
from torchformer.nn.norms import make_norm


def run_block(block: nn.Module, checkpointed: bool, *args: Any, cache: BlockCache | None, **kwargs: Any) -> Tensor:
    """Call ``block(*args, cache=cache, **kwargs)``, through activation checkpointing when asked and allowed.

    Only in a training step without a KV cache, as the module docstring says; otherwise the block is called directly.

    Args:
        block: the transformer block to run.
        checkpointed: whether the stack checkpoints its blocks (``config.checkpoint_blocks``).
        *args: the block's positional arguments: ``x`` ``(b, t, e)``, and then what the block takes (``mask``, or
            ``context``, ``mask``, ``context_mask`` for a decoder block).
        cache: the block's :class:`~torchformer.nn.cache.BlockCache`, or ``None``.
        **kwargs: the block's keyword arguments (``positions``).

    Returns:
        The block's output ``(b, t, e)``.
    """
    if checkpointed and cache is None and block.training and torch.is_grad_enabled():
        return checkpoint(block, *args, cache=None, use_reentrant=False, **kwargs)
    return block(*args, cache=cache, **kwargs)


def shared_positions(block_class: type[TransformerBlock], config: TransformerConfig, *, causal: bool) -> dict:
    """The keyword argument that hands every block of a stack the same position scheme, or none.

    With ``config.relative_shared`` (T5), the stack builds one relative-position table
    (:meth:`~torchformer.nn.blocks.TransformerBlock.stack_positions`) and every block's self-attention uses it;
    the parameters then appear once, under the first block's name. Otherwise each attention builds its own, and the
    blocks are built as always (a block variant without the argument still works).

    Args:
        block_class: the stack's block class.
        config: the architecture.
        causal: whether the blocks' self-attention is causal.

    Returns:
        ``{"positions": scheme}``, or ``{}``.
    """
    scheme = block_class.stack_positions(config, causal=causal)
    return {} if scheme is None else {"positions": scheme}


class Encoder(nn.Module):
    """``depth`` transformer blocks, then a final norm with pre-norm blocks.

    ``forward(x, mask=None, *, positions=None, caches=None, documents=None)``: ``mask`` marks real tokens,
    ``positions`` their absolute positions, ``documents`` ``(b, t)`` the document of each token of packed rows
    (attention stays within each; see :class:`~torchformer.nn.attention.SelfAttention`).

    Args:
        config: the architecture; ``config.depth`` blocks.
        causal: causal self-attention (a generator's stack).
        block_class: the block to stack (default :class:`~torchformer.nn.blocks.TransformerBlock`).

    Shapes:
        ``x`` ``(b, t, e)``, ``mask`` ``(b, t)``, ``positions`` ``(t,)`` -> ``(b, t, e)``; ``caches`` holds one
        :class:`~torchformer.nn.cache.BlockCache` per block.
    """

    def __init__(self, config: TransformerConfig, *, causal: bool = False,
                 block_class: type[TransformerBlock] = TransformerBlock) -> None:
        super().__init__()
        self.emb = config.emb
        shared = shared_positions(block_class, config, causal=causal)
        self.blocks = nn.ModuleList(block_class(config, causal=causal, layer=i, **shared) for i in range(config.depth))
        self.norm = (make_norm(config.norm, config.emb, eps=config.norm_eps) if block_class.needs_final_norm(config)
                     else nn.Identity())
        self.checkpoint_blocks = config.checkpoint_blocks

    def forward(self, x: Tensor, mask: Tensor | None = None, *, positions: Tensor | None = None,
                caches: list[BlockCache] | None = None, documents: Tensor | None = None) -> Tensor:
        b, t = check_sequence_inputs(x, mask, positions, self.emb)
        # Packed rows' documents go to the blocks only when there are some: a block variant written without them
        # still works for rows of one document.
        packed = {}
        if documents is not None:
            documents = check_documents(documents, b, t, x.device)
            packed = {"documents": documents}
        for i, block in enumerate(self.blocks):
            x = run_block(block, self.checkpoint_blocks, x, mask, positions=positions,
                          cache=None if caches is None else caches[i], **packed)
        return self.norm(x)


class Decoder(nn.Module):
    """``depth`` decoder blocks (causal self-attention and cross-attention).

    ``forward(x, context, mask=None, context_mask=None, *, positions=None, caches=None, documents=None,
    context_documents=None)``: ``mask`` marks real target tokens, ``context_mask`` real context tokens;
    ``documents`` ``(b, t)`` and ``context_documents`` ``(b, u)`` number the documents of packed target and source
    rows (both or neither, :class:`~torchformer.nn.blocks.DecoderBlock`). With ``caches`` (one
    :class:`~torchformer.nn.cache.BlockCache` per block), :meth:`fill_caches` computes every block's cross-attention
    keys and values of the context once, and the cached steps then take no ``context`` (``None``).

    Args:
        config: the architecture; ``config.decoder_depth`` blocks (``config.depth`` if that is None).
        block_class: the block to stack (default :class:`~torchformer.nn.blocks.DecoderBlock`).

    Shapes:
        ``x`` ``(b, t, e)``, ``context`` ``(b, u, e)``, ``mask`` ``(b, t)``, ``context_mask`` ``(b, u)`` ->
        ``(b, t, e)``.
    """

    def __init__(self, config: TransformerConfig, *, block_class: type[DecoderBlock] = DecoderBlock) -> None:
        super().__init__()
        depth = config.depth if config.decoder_depth is None else config.decoder_depth
        self.emb = config.emb
        shared = shared_positions(block_class, config, causal=True)  # the decoder's own table: one-sided buckets
        self.blocks = nn.ModuleList(block_class(config, layer=i, **shared) for i in range(depth))
        self.norm = (make_norm(config.norm, config.emb, eps=config.norm_eps) if block_class.needs_final_norm(config)
                     else nn.Identity())
        self.checkpoint_blocks = config.checkpoint_blocks

    def fill_caches(self, caches: list[BlockCache], context: Tensor, context_mask: Tensor | None = None) -> None:
        """Compute every block's cross-attention keys and values of ``context`` once, into ``caches``.

        Call it once per context, before the first cached step (see
        :meth:`~torchformer.nn.blocks.DecoderBlock.fill_cache`).

        Args:
            caches: one :class:`~torchformer.nn.cache.BlockCache` per block, their cross-attention parts empty.
            context: the encoder's output ``(b, u, e)``.
            context_mask: ``(b, u)``, True for real context tokens; ``None``: all real. The caches keep it.

        Raises:
            ValueError: ``caches`` is not one BlockCache per block, one is already filled, or a shape is wrong.
        """
        check_caches(caches, len(self.blocks))
        for block, cache in zip(self.blocks, caches):
            block.fill_cache(cache, context, context_mask)

    def forward(self, x: Tensor, context: Tensor | None = None, mask: Tensor | None = None,
                context_mask: Tensor | None = None, *, positions: Tensor | None = None,
                caches: list[BlockCache] | None = None, documents: Tensor | None = None,
                context_documents: Tensor | None = None) -> Tensor:
        b, _ = check_sequence_inputs(x, mask, positions, self.emb)
        # Every block's part, before the first block writes into its self-attention cache.
        for part in [None] if caches is None else (cache.cross_attention for cache in caches):
            check_cross_inputs(context, context_mask, part, self.emb, b)
        # Passed on only when given, as Encoder.forward passes documents (the cross-attention checks the pair).
        packed = ({} if documents is None and context_documents is None else
                  {"documents": documents, "context_documents": context_documents})
        for i, block in enumerate(self.blocks):
            x = run_block(block, self.checkpoint_blocks, x, context, mask, context_mask, positions=positions,
                          cache=None if caches is None else caches[i], **packed)
        return self.norm(x)
