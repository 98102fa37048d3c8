"""Loaders for the real datasets the examples use, and the tools to batch them.

* :mod:`torchformer.data.download`: verified, atomic downloads (temp file, checksum, rename), and
  :class:`DataFileError`, the package's error for a damaged or malformed data file.
* :mod:`torchformer.data.enwik8_dataset`: enwik8 bytes for character-level language modelling, random batches.
* :mod:`torchformer.data.imdb_dataset`: the IMDb Large Movie Review Dataset (Maas et al. 2011).
* :mod:`torchformer.data.imdb_unlabelled`: its 50,000 unlabelled reviews for pretraining, and de-duplication
  against the reviews a model is evaluated on.
* :mod:`torchformer.data.tokenizers`: word- and byte-level tokenizers with no heavy dependency.
* :mod:`torchformer.data.bpe`: byte-level BPE learned from the training texts (the optional ``tokenizers`` package).
* :mod:`torchformer.data.batching`: padding with masks and length bucketing.
* :mod:`torchformer.data.packing`: several whole documents per row (less padding), with each token's document.
* :mod:`torchformer.data.encoded`: a tokenized corpus kept on disk, keyed by the texts and the tokenizer.
"""

from torchformer.data.batching import ClassificationBatches, bucket_batches, bucketed_padding, pad_batch
from torchformer.data.packing import (
    PackedBatches, Piece, pack, pack_pairs, packed_batch, packed_labels, padding_fraction,
)
from torchformer.data.bpe import BPETokenizer
from torchformer.data.download import (
    ChecksumError, DataFileError, DataNotFoundError, default_root, download, file_digest, verify,
)
from torchformer.data.enwik8_dataset import enwik8, enwik8_sample, load_text_bytes, random_batches, sample_path
from torchformer.data.imdb_dataset import imdb, train_val_split
from torchformer.data.imdb_unlabelled import deduplicate, imdb_unlabelled
from torchformer.data.tokenizers import ByteTokenizer, WordTokenizer, tokenizer_from_state_dict

__all__ = [
    "BPETokenizer",
    "ByteTokenizer",
    "ChecksumError",
    "ClassificationBatches",
    "DataFileError",
    "DataNotFoundError",
    "PackedBatches",
    "Piece",
    "WordTokenizer",
    "bucket_batches",
    "bucketed_padding",
    "deduplicate",
    "default_root",
    "download",
    "enwik8",
    "enwik8_sample",
    "file_digest",
    "imdb",
    "imdb_unlabelled",
    "load_text_bytes",
    "pack",
    "pack_pairs",
    "packed_batch",
    "packed_labels",
    "pad_batch",
    "padding_fraction",
    "random_batches",
    "sample_path",
    "tokenizer_from_state_dict",
    "train_val_split",
    "verify",
]
