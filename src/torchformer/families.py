"""The generators of the 2024–25 families, each a :class:`~torchformer.models.GTransformer` whose blocks name parts.

A family is a choice of parts, not a new kind of model: each class here is a ``GTransformer`` whose
``block_class`` names an attention and a feed-forward network, and whose options (the mixture's
:class:`~torchformer.nn.moe.MoEOptions`, latent attention's :class:`~torchformer.nn.latent.LatentOptions`) are
typed data in ``config.options``, saved with the weights.

* :class:`Qwen3Transformer`: RMSNorm per head on queries and keys; dense gated networks.
* :class:`MoETransformer` (Mixtral): grouped-query attention; mixtures of experts.
* :class:`Qwen3MoETransformer`: RMSNorm per head on queries and keys; mixtures of experts.
* :class:`OLMoETransformer`: RMSNorm over the query and key projections; mixtures of experts.
* :class:`LatentTransformer`: latent attention (DeepSeek's); dense gated networks.
* :class:`DeepSeekTransformer` (V3): latent attention; mixtures of experts with shared experts.

Every one takes :class:`~torchformer.models.GTransformer`'s arguments, ``GTransformer(emb, heads, depth,
seq_length, num_tokens, **fields)``, and ``options=(MoEOptions(...), LatentOptions(...))``; ``from_huggingface``
builds them from the families' folders (:mod:`torchformer.pretrained`).

Shapes: as :class:`~torchformer.models.GTransformer`'s.
"""

from __future__ import annotations

from torchformer.models import GTransformer
from torchformer.nn.blocks import TransformerBlock
from torchformer.nn.latent import LatentAttention
from torchformer.nn.moe import MoEBlock
from torchformer.nn.qknorm import HeadRMSNormAttention, ProjectionRMSNormAttention


class HeadNormBlock(TransformerBlock):
    """A :class:`~torchformer.nn.blocks.TransformerBlock` with per-head RMSNorm on queries and keys (Qwen3).

    Args:
        config: the architecture (as :class:`~torchformer.nn.blocks.TransformerBlock`'s).
        causal: causal self-attention.
        layer: the block's index in its stack.
        positions: a position scheme shared by the stack's blocks, or ``None``.

    Shapes:
        As :class:`~torchformer.nn.blocks.TransformerBlock`.
    """

    attention_class = HeadRMSNormAttention


class HeadNormMoEBlock(MoEBlock):
    """A :class:`~torchformer.nn.moe.MoEBlock` with per-head RMSNorm on queries and keys (Qwen3-MoE).

    Args:
        config: the architecture (as :class:`~torchformer.nn.blocks.TransformerBlock`'s).
        causal: causal self-attention.
        layer: the block's index in its stack.
        positions: a position scheme shared by the stack's blocks, or ``None``.

    Shapes:
        As :class:`~torchformer.nn.blocks.TransformerBlock`.
    """

    attention_class = HeadRMSNormAttention


class ProjectionNormMoEBlock(MoEBlock):
    """A :class:`~torchformer.nn.moe.MoEBlock` with RMSNorm over the query and key projections (OLMoE).

    Args:
        config: the architecture (as :class:`~torchformer.nn.blocks.TransformerBlock`'s).
        causal: causal self-attention.
        layer: the block's index in its stack.
        positions: a position scheme shared by the stack's blocks, or ``None``.

    Shapes:
        As :class:`~torchformer.nn.blocks.TransformerBlock`.
    """

    attention_class = ProjectionRMSNormAttention


class LatentBlock(TransformerBlock):
    """A :class:`~torchformer.nn.blocks.TransformerBlock` with latent attention.

    Args:
        config: the architecture (as :class:`~torchformer.nn.blocks.TransformerBlock`'s).
        causal: causal self-attention.
        layer: the block's index in its stack.
        positions: a position scheme shared by the stack's blocks, or ``None``.

    Shapes:
        As :class:`~torchformer.nn.blocks.TransformerBlock`.
    """

    attention_class = LatentAttention


class LatentMoEBlock(MoEBlock):
    """A :class:`~torchformer.nn.moe.MoEBlock` with latent attention (DeepSeek-V2, V3).

    Args:
        config: the architecture (as :class:`~torchformer.nn.blocks.TransformerBlock`'s).
        causal: causal self-attention.
        layer: the block's index in its stack.
        positions: a position scheme shared by the stack's blocks, or ``None``.

    Shapes:
        As :class:`~torchformer.nn.blocks.TransformerBlock`.
    """

    attention_class = LatentAttention


class Qwen3Transformer(GTransformer):
    """Qwen3: a Llama-shaped generator whose queries and keys are RMS-normalised per head (``kqnorm`` of RMSNorm).

    Args:
        emb: embedding size ``e``.
        heads: attention heads ``h``.
        depth: blocks.
        seq_length: the longest sequence.
        num_tokens: vocabulary size ``v``.
        config: a whole config instead.
        **options: the other fields of :class:`~torchformer.config.TransformerConfig`.

    Shapes:
        As :class:`~torchformer.models.GTransformer`.
    """

    block_class = HeadNormBlock


class MoETransformer(GTransformer):
    """A generator whose feed-forward networks are sparse mixtures of experts (Mixtral).

    Each block's network is a :class:`~torchformer.nn.moe.MoEFeedForward` (after ``dense_layers`` dense ones), as
    the :class:`~torchformer.nn.moe.MoEOptions` in ``config.options`` say (their defaults without them: 8 experts,
    2 per token, a balance loss of weight 0.01 for the training loop to add, :mod:`torchformer.nn.auxiliary`).

    Args:
        emb: embedding size ``e``.
        heads: attention heads ``h``.
        depth: blocks.
        seq_length: the longest sequence.
        num_tokens: vocabulary size ``v``.
        config: a whole config instead.
        **options: the other fields, the experts' as ``options=(MoEOptions(experts=16),)``.

    Shapes:
        As :class:`~torchformer.models.GTransformer`.
    """

    block_class = MoEBlock


class Qwen3MoETransformer(GTransformer):
    """Qwen3-MoE: per-head RMSNorm on queries and keys, and mixtures of experts (see :class:`MoETransformer`).

    Args:
        emb: embedding size ``e``.
        heads: attention heads ``h``.
        depth: blocks.
        seq_length: the longest sequence.
        num_tokens: vocabulary size ``v``.
        config: a whole config instead.
        **options: the other fields and the :class:`~torchformer.nn.moe.MoEOptions`.

    Shapes:
        As :class:`~torchformer.models.GTransformer`.
    """

    block_class = HeadNormMoEBlock


class OLMoETransformer(GTransformer):
    """OLMoE: RMSNorm over the whole query and key projections, and mixtures of experts.

    Args:
        emb: embedding size ``e``.
        heads: attention heads ``h``.
        depth: blocks.
        seq_length: the longest sequence.
        num_tokens: vocabulary size ``v``.
        config: a whole config instead.
        **options: the other fields and the :class:`~torchformer.nn.moe.MoEOptions`.

    Shapes:
        As :class:`~torchformer.models.GTransformer`.
    """

    block_class = ProjectionNormMoEBlock


class LatentTransformer(GTransformer):
    """A generator with latent attention and dense feed-forward networks: its KV cache holds a small latent.

    Args:
        emb: embedding size ``e``.
        heads: attention heads ``h``.
        depth: blocks.
        seq_length: the longest sequence.
        num_tokens: vocabulary size ``v``.
        config: a whole config instead.
        **options: the other fields and the :class:`~torchformer.nn.latent.LatentOptions`.

    Shapes:
        As :class:`~torchformer.models.GTransformer`.
    """

    block_class = LatentBlock


class DeepSeekTransformer(GTransformer):
    """DeepSeek-V3 (and V2): latent attention and mixtures of experts, with shared experts and dense first blocks.

    Args:
        emb: embedding size ``e``.
        heads: attention heads ``h``.
        depth: blocks.
        seq_length: the longest sequence.
        num_tokens: vocabulary size ``v``.
        config: a whole config instead.
        **options: the other fields, the :class:`~torchformer.nn.moe.MoEOptions` and the
            :class:`~torchformer.nn.latent.LatentOptions`.

    Shapes:
        As :class:`~torchformer.models.GTransformer`.
    """

    block_class = LatentMoEBlock
