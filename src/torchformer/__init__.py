"""torchformer: small, composable transformer modules for PyTorch, written to be read.

The package is organised one concept per module:

* :mod:`torchformer.nn.attention`: multi-head self- and cross-attention (narrow or wide heads, masks, KV cache)
* :mod:`torchformer.nn.positions`: sinusoidal and learned position encodings
* :mod:`torchformer.nn.blocks`: the transformer block (attention + feed-forward, residuals, layer norm)
* :mod:`torchformer.nn.stacks`: encoder and decoder stacks
* :mod:`torchformer.nn.heads`: classifier and generator heads
* :mod:`torchformer.models`: ``CTransformer``, ``GTransformer``, ``Seq2SeqTransformer``
* :mod:`torchformer.decoding.generation`: sampling, beam search, the KV cache in use; :mod:`torchformer.decoding.compiled`:
  the same with preallocated caches and a compiled one-token step
* :mod:`torchformer.train.evaluation`: bits per byte
* :mod:`torchformer.data`: the real datasets (enwik8, IMDb), tokenizers, batching
"""

from torchformer.nn.attention import CrossAttention, KVCache, MultiHeadAttention, SelfAttention, StaticKVCache
from torchformer.nn.blocks import BlockCache, FeedForward, TransformerBlock
from torchformer import data
from torchformer.train.evaluation import bits_per_byte
from torchformer.nn.heads import ClassifierHead, GeneratorHead
from torchformer.models import CTransformer, GTransformer, Seq2SeqTransformer, TokenEmbedding
from torchformer.nn.positions import LearnedPositions, SinusoidalPositions
from torchformer.nn.stacks import Decoder, Encoder

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
