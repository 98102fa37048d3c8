"""torchformer: small, composable transformer modules for PyTorch, written to be read.

Where each concept lives:

* :mod:`torchformer.config`: :class:`TransformerConfig`, every architectural choice as plain data
* :mod:`torchformer.nn`: the transformer itself, one concept per module:
  :mod:`~torchformer.nn.attention` (self- and cross-attention, narrow or wide heads, fast and reference paths),
  :mod:`~torchformer.nn.cache` (the KV caches attention writes and reads while decoding),
  :mod:`~torchformer.nn.masks` (which keys a query may see: causal rule, padding, positions),
  :mod:`~torchformer.nn.positions`, :mod:`~torchformer.nn.embedding` (token ids or feature vectors),
  :mod:`~torchformer.nn.norms` (LayerNorm, RMSNorm), :mod:`~torchformer.nn.feedforward` (plain and gated
  feed-forward networks), :mod:`~torchformer.nn.moe` (a sparse mixture of experts), :mod:`~torchformer.nn.latent`
  (multi-head latent attention), :mod:`~torchformer.nn.qknorm` (RMSNorm on queries and keys, gated heads),
  :mod:`~torchformer.nn.auxiliary` (what parts add to the training loss), :mod:`~torchformer.nn.blocks`,
  :mod:`~torchformer.nn.stacks`, :mod:`~torchformer.nn.heads` (classifier, generator and masked-language-model output
  heads)
* :mod:`torchformer.models`: ``CTransformer``, ``GTransformer``, ``Seq2SeqTransformer``, ``MLMTransformer``, built
  from a config; :mod:`torchformer.families`: the 2024–25 generators (Qwen3, Mixtral, Qwen3-MoE, OLMoE, DeepSeek-V3)
* :mod:`torchformer.saving`: a model's own files: the record that rebuilds it, the exported folder (safetensors)
* :mod:`torchformer.pretrained`: pretrained models in the Hugging Face layout, in and out (``from_huggingface``,
  ``to_huggingface``; GPT-2 so far)
* :mod:`torchformer.baselines`: ``LSTMClassifier``, the recurrent baseline a classifier is compared against
* :mod:`torchformer.decoding`: the loops: :mod:`~torchformer.decoding.sampling`,
  :mod:`~torchformer.decoding.generation` (generate, beam search, encoder-decoder decoding),
  :mod:`~torchformer.decoding.compiled` (the compiled one-token step)
* :mod:`torchformer.train`: experiment support: a run's checkpoints, ``load_model``, schedules, logging, metrics,
  FLOPs, bits per byte, attention maps, masked-language-model pretraining
* :mod:`torchformer.data`: the real datasets (enwik8, IMDb), tokenizers, batching
* :mod:`torchformer.scripts`: what the example scripts share (flags, threads, one process or many)
"""

import importlib
from typing import Any

from torchformer._version import __version__
from torchformer.config import PartOptions, TransformerConfig
from torchformer.decoding.compiled import StaticCacheGenerator
from torchformer.decoding.generation import MemoryStep, beam_search, generate, seq2seq_generate
from torchformer.families import (
    DeepSeekTransformer, LatentTransformer, MoETransformer, OLMoETransformer, Qwen3MoETransformer, Qwen3Transformer,
)
from torchformer.models import CTransformer, GTransformer, MLMTransformer, Seq2SeqTransformer, TransformerModel
from torchformer.nn.attention import CrossAttention, MultiHeadAttention, SelfAttention
from torchformer.nn.blocks import DecoderBlock, TransformerBlock
from torchformer.nn.cache import BlockCache, ContextCache, KVCache, RingKVCache
from torchformer.nn.embedding import TokenEmbedding, VectorEmbedding
from torchformer.nn.feedforward import FeedForward, GatedFeedForward
from torchformer.nn.heads import ClassifierHead, GeneratorHead, MaskedLMHead
from torchformer.nn.masks import AttentionMask, FixedPattern, StridedPattern
from torchformer.nn.moe import MoEFeedForward, MoEOptions
from torchformer.nn.norms import RMSNorm
from torchformer.nn.positions import LearnedPositions, SinusoidalPositions
from torchformer.nn.stacks import Decoder, Encoder
from torchformer.pretrained import from_huggingface, to_huggingface
from torchformer.saving import export_model

# Experiment support is imported when first used (PEP 562), so that importing the transformer (``import
# torchformer``, ``torchformer.models``) loads no training or data code: ``torchformer.load_model`` and
# ``torchformer.bits_per_byte`` work as before, and ``torchformer.data`` too.
_EXPERIMENT_SUPPORT = {"load_model": "torchformer.train.loading", "bits_per_byte": "torchformer.train.evaluation"}


def __getattr__(name: str) -> Any:
    if name == "data":
        return importlib.import_module("torchformer.data")  # from then on an attribute of the package
    if name in _EXPERIMENT_SUPPORT:
        return getattr(importlib.import_module(_EXPERIMENT_SUPPORT[name]), name)
    raise AttributeError(f"module 'torchformer' has no attribute {name!r}")


__all__ = [
    "AttentionMask", "BlockCache", "ClassifierHead", "ContextCache", "CrossAttention", "CTransformer", "Decoder",
    "DecoderBlock", "DeepSeekTransformer", "Encoder", "FeedForward", "FixedPattern", "GatedFeedForward",
    "GeneratorHead", "GTransformer", "KVCache", "LatentTransformer", "LearnedPositions", "MaskedLMHead", "MemoryStep",
    "MLMTransformer", "MoEFeedForward", "MoEOptions", "MoETransformer", "MultiHeadAttention", "OLMoETransformer",
    "PartOptions", "Qwen3MoETransformer", "Qwen3Transformer", "RingKVCache", "RMSNorm", "SelfAttention",
    "Seq2SeqTransformer", "SinusoidalPositions", "StaticCacheGenerator", "StridedPattern", "TokenEmbedding",
    "TransformerBlock", "TransformerConfig", "TransformerModel", "VectorEmbedding", "beam_search", "bits_per_byte",
    "export_model", "from_huggingface", "generate", "load_model", "seq2seq_generate", "to_huggingface",
]
