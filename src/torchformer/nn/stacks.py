"""Stacks of transformer blocks: the encoder (bidirectional, or causal for a generator) and the decoder.

The final norm of pre-norm stacks: ``docs/blocks.md``; checkpointing (``checkpoint_blocks``): ``docs/going-big.md``.
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
    """Call ``block(*args, cache=cache, **kwargs)``, checkpointed when asked, training, with gradients and no cache.

    Args:
        block: the transformer block to run.
        checkpointed: whether the stack checkpoints its blocks (``config.checkpoint_blocks``).
        *args: ``x`` ``(b, t, e)``, then ``mask`` (a decoder block: ``context``, ``mask``, ``context_mask``).
        cache: the block's :class:`~torchformer.nn.cache.BlockCache`, or ``None``.
        **kwargs: the block's keyword arguments (``positions``).

    Returns:
        The block's output ``(b, t, e)``.
    """
    if checkpointed and cache is None and block.training and torch.is_grad_enabled():
        return checkpoint(block, *args, cache=None, use_reentrant=False, **kwargs)
    return block(*args, cache=cache, **kwargs)


def build_blocks(block_class: type[TransformerBlock], config: TransformerConfig, depth: int, *, causal: bool,
                 options: dict[str, Any] | None = None) -> nn.ModuleList:
    """``depth`` blocks of ``block_class``, sharing the scheme its :meth:`~TransformerBlock.stack_positions` gives.

    A scheme with parameters goes to every block's constructor as ``positions``; a ``shareable`` one replaces each
    built block's own (:meth:`~torchformer.nn.blocks.TransformerBlock.share_positions`; ``docs/relative-positions.md``).

    Args:
        block_class: the block to stack.
        config: the architecture.
        depth: the number of blocks.
        causal: whether the blocks' self-attention is causal (passed to ``stack_positions``).
        options: the blocks' keyword arguments besides ``layer`` and ``positions`` (the encoder's ``causal``).

    Returns:
        The blocks, ``layer`` 0 first.
    """
    scheme = block_class.stack_positions(config, causal=causal)
    after = scheme is not None and scheme.shareable
    at_init = {} if scheme is None or after else {"positions": scheme}
    blocks = nn.ModuleList(block_class(config, layer=i, **(options or {}), **at_init) for i in range(depth))
    if after:
        for block in blocks:
            block.share_positions(scheme)
    return blocks


class Encoder(nn.Module):
    """``depth`` transformer blocks, then a final norm with pre-norm blocks.

    Args:
        config: the architecture; ``config.depth`` blocks.
        causal: causal self-attention (a generator's stack).
        block_class: the block to stack (default :class:`~torchformer.nn.blocks.TransformerBlock`).

    Shapes:
        ``forward(x, mask=None, *, positions=None, caches=None, documents=None)``: as
        :class:`~torchformer.nn.blocks.TransformerBlock`, with ``caches`` one ``BlockCache`` per block.
    """

    def __init__(self, config: TransformerConfig, *, causal: bool = False,
                 block_class: type[TransformerBlock] = TransformerBlock) -> None:
        super().__init__()
        self.emb = config.emb
        self.blocks = build_blocks(block_class, config, config.depth, causal=causal, options={"causal": causal})
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
    """``depth`` decoder blocks (causal self-attention and cross-attention), then a final norm with pre-norm blocks.

    Args:
        config: the architecture; ``config.decoder_depth`` blocks (``config.depth`` if that is None).
        block_class: the block to stack (default :class:`~torchformer.nn.blocks.DecoderBlock`).

    Shapes:
        ``forward(x, context=None, mask=None, context_mask=None, *, positions=None, caches=None, documents=None,
        context_documents=None)``: as :class:`~torchformer.nn.blocks.DecoderBlock`, with ``caches`` one per block.
    """

    def __init__(self, config: TransformerConfig, *, block_class: type[DecoderBlock] = DecoderBlock) -> None:
        super().__init__()
        depth = config.depth if config.decoder_depth is None else config.decoder_depth
        self.emb = config.emb
        # causal=True: the decoder's own scheme (T5's table with one-sided buckets); its blocks are always causal
        self.blocks = build_blocks(block_class, config, depth, causal=True)
        self.norm = (make_norm(config.norm, config.emb, eps=config.norm_eps) if block_class.needs_final_norm(config)
                     else nn.Identity())
        self.checkpoint_blocks = config.checkpoint_blocks

    def fill_caches(self, caches: list[BlockCache], context: Tensor, context_mask: Tensor | None = None) -> None:
        """Compute every block's cross-attention keys and values of ``context`` once, before the first cached step.

        Args:
            caches: one :class:`~torchformer.nn.cache.BlockCache` per block, their cross-attention parts empty.
            context: the encoder's output ``(b, u, e)``.
            context_mask: ``(b, u)``, True for real context tokens (the caches keep it); ``None``: all real.

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
