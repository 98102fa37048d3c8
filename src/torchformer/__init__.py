"""torchformer: small, composable transformer modules for PyTorch, written to be read.

The package is organised one concept per module:

* :mod:`torchformer.attention`: multi-head self- and cross-attention (narrow or wide heads, masks, KV cache)
* :mod:`torchformer.positions`: sinusoidal and learned position encodings
* :mod:`torchformer.blocks`: the transformer block (attention + feed-forward, residuals, layer norm)
* :mod:`torchformer.stacks`: encoder and decoder stacks
* :mod:`torchformer.heads`: classifier and generator heads
* :mod:`torchformer.models`: ``CTransformer``, ``GTransformer``, ``Seq2SeqTransformer``
* :mod:`torchformer.generation`: sampling, beam search, the KV cache in use; :mod:`torchformer.static_generation`:
  the same with preallocated caches and a compiled one-token step
* :mod:`torchformer.evaluation`: bits per byte
* :mod:`torchformer.data`: the real datasets (enwik8, IMDb), tokenizers, batching
"""

from torchformer.attention import CrossAttention, KVCache, MultiHeadAttention, SelfAttention, StaticKVCache
from torchformer.blocks import BlockCache, FeedForward, TransformerBlock
from torchformer import data
from torchformer.evaluation import bits_per_byte
from torchformer.heads import ClassifierHead, GeneratorHead
from torchformer.models import CTransformer, GTransformer, Seq2SeqTransformer, TokenEmbedding
from torchformer.positions import LearnedPositions, SinusoidalPositions
from torchformer.stacks import Decoder, Encoder

__version__ = "0.1.0"

__all__ = [
    "BlockCache",
    "ClassifierHead",
    "CrossAttention",
    "CTransformer",
    "Decoder",
    "Encoder",
    "FeedForward",
    "GeneratorHead",
    "GTransformer",
    "KVCache",
    "LearnedPositions",
    "MultiHeadAttention",
    "SelfAttention",
    "Seq2SeqTransformer",
    "SinusoidalPositions",
    "StaticKVCache",
    "TokenEmbedding",
    "TransformerBlock",
    "bits_per_byte",
]
