"""A Hugging Face folder's ``tokenizer.json``, behind torchformer's tokenizer interface (``encode``/``decode``).

A released model's folder holds its tokenizer as one ``tokenizer.json`` (GPT-2's byte-level BPE, Llama's
SentencePiece-style BPE, BERT's WordPiece): the whole pipeline, normalisation, pre-tokenisation, the vocabulary and
merges, and the special tokens a model expects around a text (BERT's ``[CLS] ... [SEP]``). The ``tokenizers``
package (Rust, the ``bpe`` extra: ``pip install "torchformer[bpe]"``) runs that file exactly as ``transformers``
does; :class:`HuggingFaceTokenizer` gives it the interface of torchformer's own tokenizers, so the example scripts
and the data helpers take either.

The package is imported when a tokenizer is loaded, not before: the rest of :mod:`torchformer.pretrained` needs only
torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Optional

from torch import Tensor

from torchformer._checks import check_bool
from torchformer.pretrained.folders import PathLike

TOKENIZER_FILE = "tokenizer.json"


class HuggingFaceTokenizer:
    """The tokenizer of a Hugging Face folder: ``encode(text) -> ids``, ``decode(ids) -> text``.

    Build it with :meth:`from_folder`. ``len(tokenizer)`` is the vocabulary size, added tokens included (a model's
    ``num_tokens`` may be larger: vocabularies are often padded to a multiple of 64).

    Args:
        tokenizer: a ``tokenizers.Tokenizer``.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def from_folder(cls, folder: PathLike) -> HuggingFaceTokenizer:
        """The tokenizer in ``folder/tokenizer.json``.

        Args:
            folder: a model's folder (or the ``tokenizer.json`` file itself).

        Returns:
            The tokenizer.

        Raises:
            FileNotFoundError: there is no ``tokenizer.json`` (older folders hold ``vocab.json`` and
                ``merges.txt`` instead; ``transformers`` converts them, and ``save_pretrained`` writes the file).
            ImportError: the ``tokenizers`` package is missing.
            ValueError: the file is not a tokenizer ``tokenizers`` can read.
        """
        path = Path(folder)
        file = path if path.is_file() else path / TOKENIZER_FILE
        if not file.is_file():
            raise FileNotFoundError(f"{path} holds no {TOKENIZER_FILE}; a folder saved by transformers' "
                                    f"tokenizer.save_pretrained has one (older folders have vocab.json and "
                                    f"merges.txt, which transformers converts)")
        try:
            import tokenizers
        except ImportError as e:
            raise ImportError(f'reading {TOKENIZER_FILE} needs the tokenizers package: pip install '
                              f'"torchformer[bpe]"') from e
        try:
            return cls(tokenizers.Tokenizer.from_file(str(file)))
        except Exception as e:  # tokenizers raises its own Exception for a file it cannot parse
            raise ValueError(f"{file} is not a tokenizer the tokenizers package can read: {e}") from e

    def encode(self, text: str, *, max_length: Optional[int] = None, special_tokens: bool = True) -> list[int]:
        """The token ids of ``text``, with the special tokens the model expects around it (``special_tokens``).

        Args:
            text: the text.
            max_length: keep at most the first ``max_length`` ids; ``None``: all.
            special_tokens: add the tokens ``tokenizer.json``'s post-processor puts around a text (BERT's
                ``[CLS]`` and ``[SEP]``; none for GPT-2).

        Returns:
            The ids, a list of ints.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids = self.tokenizer.encode(text, add_special_tokens=check_bool(special_tokens, "special_tokens")).ids
        return ids if max_length is None else ids[:max_length]

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        """The text of ``ids`` (a list, or a 1-D tensor), without the special tokens unless asked.

        Args:
            ids: token ids.
            skip_special_tokens: leave out special tokens (``[CLS]``, ``<|endoftext|>``, ...).

        Returns:
            The text.
        """
        ids = ids.tolist() if isinstance(ids, Tensor) else list(ids)
        return self.tokenizer.decode(ids, skip_special_tokens=check_bool(skip_special_tokens, "skip_special_tokens"))

    def tokenize(self, text: str) -> list[str]:
        """The tokens of ``text`` as strings (for labels, say), without special tokens.

        Args:
            text: the text.

        Returns:
            One string per token, as the vocabulary writes it (GPT-2's ``Ġ`` marks a leading space).
        """
        return self.tokenizer.encode(text, add_special_tokens=False).tokens

    def token_id(self, token: str) -> Optional[int]:
        """The id of ``token`` (``"<|endoftext|>"``, ``"[MASK]"``), or ``None`` if the vocabulary has none.

        Args:
            token: the token's string.

        Returns:
            Its id, or ``None``.
        """
        return self.tokenizer.token_to_id(token)

    def token(self, id: int) -> Optional[str]:
        """The token of ``id``, as the vocabulary writes it, or ``None`` if the vocabulary has no such id.

        A model's vocabulary is often padded beyond its tokenizer's, and added tokens need not follow the others'
        ids: this, not ``len(tokenizer)``, says whether an id has a token.

        Args:
            id: a token id.

        Returns:
            Its token, or ``None``.
        """
        return self.tokenizer.id_to_token(id)

    def __len__(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def __repr__(self) -> str:
        return f"HuggingFaceTokenizer({len(self)} tokens)"

