"""Byte-level BPE: subword tokens learned from the training texts, through HuggingFace's ``tokenizers``.

*Byte-pair encoding* (Sennrich et al. 2016) starts from single symbols and, again and again, merges the most
frequent pair of neighbouring tokens of the training texts into a new token, until the vocabulary is full. Frequent
words end up as one token (``" great"``), rarer ones as a few pieces (``" un" "believ" "able"``). *Byte-level* BPE
(GPT-2, Radford et al. 2019) starts from the 256 byte values of UTF-8 instead of characters, so every text can be
encoded, nothing is ever unknown, and decoding gives the text back exactly. Against
:class:`~torchformer.data.tokenizers.ByteTokenizer` that means sequences several times shorter (attention costs
grow with the square of the length); against :class:`~torchformer.data.tokenizers.WordTokenizer`, no ``<unk>``.
Like the word vocabulary, the merges are learned from the texts given to :meth:`BPETokenizer.build`: the training
split only (``docs/data.md`` compares the three tokenizers).

Text is normalised the way :class:`~torchformer.data.tokenizers.WordTokenizer` does it: IMDb's ``<br />`` line
breaks become a space (they would otherwise be learned as frequent tokens), and the text is lower-cased. Lower-casing
is the default because it spends the vocabulary on more words rather than on ``"Great"``, ``"great"`` and
``"GREAT"``, and keeps the comparison with the word tokenizer fair; ``build(..., lowercase=False)`` keeps case. So
``decode(encode(text)) == normalize(text)``, exactly, for any text.

The training runs in the optional ``tokenizers`` package (Rust; ``pip install "torchformer[bpe]"``), imported only
when a :class:`BPETokenizer` is built or loaded. It is deterministic: the same texts give the same vocabulary and
merges, in this process or another, with one thread (``RAYON_NUM_THREADS=1``) or many (``tests/test_bpe.py``). With
tokenizers 0.23.3 the order of the texts made no difference either (measured on 3,000 random texts with many equally
frequent pairs; not a documented promise of the package, so not relied on).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from torchformer._checks import check_bool, is_int
from torchformer.data._tokenizing import BREAK, check_ids, check_max_length, check_state, check_text, check_texts

if TYPE_CHECKING:  # only for the annotations: the package is imported when it is needed, not before
    import tokenizers

__all__ = ["BPETokenizer"]

INSTALL = 'pip install "torchformer[bpe]"'
# The 256 byte values, each a token of its own, plus <pad>: the smallest vocabulary, with no merge learned yet.
MIN_VOCAB_SIZE = 257
# The largest vocabulary build() accepts. The trainer reserves memory for the requested size up front (about 70
# bytes per entry: 70 GB for a billion, which aborts the process instead of raising); 2**20 is four times the largest
# vocabularies in use today (about 256k) and costs tens of MB.
MAX_VOCAB_SIZE = 2**20


def _tokenizers() -> Any:
    """The ``tokenizers`` package, imported on first use: the core of torchformer does not need it."""
    try:
        import tokenizers
    except ImportError as err:
        raise ImportError(f"BPETokenizer needs the tokenizers package (HuggingFace): {INSTALL}") from err
    # encode_special_tokens (0.15.1) lets a text that literally says "<pad>" be text instead of id 0.
    if not hasattr(tokenizers.Tokenizer, "encode_special_tokens"):
        raise ImportError(
            f"BPETokenizer needs tokenizers >= 0.15.1, found {tokenizers.__version__}: pip install -U "
            f'"torchformer[bpe]"'
        )
    return tokenizers


def _normalize(text: str, lowercase: bool) -> str:
    text = BREAK.sub(" ", text)
    return text.lower() if lowercase else text


def _check_unicode(text: str, name: str) -> str:
    """``text``, if it is valid Unicode; a lone surrogate (no UTF-8 bytes) is an error naming where it is, which the
    one tokenizers raises would not say."""
    if not text.isascii():  # a flag CPython keeps on every str: free to read
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:
            raise ValueError(
                f"{name} is not valid Unicode: lone surrogate {text[err.start]!r} at index {err.start} has no UTF-8 "
                f"bytes (clean the text first)"
            ) from None
    return text


class BPETokenizer:
    """Byte-level byte-pair encoding, trained on your texts: id 0 is ``<pad>``, ids 1-256 the bytes, then the merges.

    Build one with :meth:`build` (from the training texts) or :meth:`from_state_dict`; it has the interface of
    :class:`~torchformer.data.tokenizers.WordTokenizer` (``encode``, ``decode``, ``len()``, ``state_dict()``), so
    the two are interchangeable. Needs the ``tokenizers`` package: ``pip install "torchformer[bpe]"``.

    Args:
        tokenizer: a trained ``tokenizers.Tokenizer`` with a BPE model, the ByteLevel pre-tokenizer and decoder, and
            ``<pad>`` at id 0 (what :meth:`build` trains). A copy is kept (the caller's object is not changed), set
            to read ``"<pad>"`` in a text as text (``encode_special_tokens``), so that ``encode`` never returns id 0.
        lowercase: whether texts are lower-cased before encoding (say what the tokenizer was trained on).

    Example:
        >>> tok = BPETokenizer.build(["a great film", "a great cast"] * 10, vocab_size=300)
        >>> tok.tokenize("A GREAT<br />filmmaker")
        ['a', ' great', ' film', 'm', 'a', 'k', 'e', 'r']
        >>> tok.decode(tok.encode("A GREAT<br />filmmaker"))
        'a great filmmaker'
    """

    PAD = 0
    PAD_TOKEN = "<pad>"

    def __init__(self, tokenizer: tokenizers.Tokenizer, *, lowercase: bool = True) -> None:
        tk = _tokenizers()
        if not isinstance(tokenizer, tk.Tokenizer):
            raise TypeError(f"tokenizer must be a tokenizers.Tokenizer, got {type(tokenizer).__name__}")
        parts = {
            "model": (tokenizer.model, tk.models.BPE),
            "pre_tokenizer": (tokenizer.pre_tokenizer, tk.pre_tokenizers.ByteLevel),
            "decoder": (tokenizer.decoder, tk.decoders.ByteLevel),
        }
        for part, (value, expected) in parts.items():
            if not isinstance(value, expected):
                raise ValueError(
                    f"tokenizer must be a byte-level BPE (its {part} a {expected.__name__}), got {part} "
                    f"{type(value).__name__}; build one with BPETokenizer.build"
                )
        if tokenizer.token_to_id(self.PAD_TOKEN) != self.PAD:
            raise ValueError(
                f"tokenizer must have {self.PAD_TOKEN} at id {self.PAD}, got id "
                f"{tokenizer.token_to_id(self.PAD_TOKEN)}; build one with BPETokenizer.build"
            )
        tokenizer = tk.Tokenizer.from_str(tokenizer.to_str())  # a copy: the caller's tokenizer stays as it was
        # Without this a review that literally says "<pad>" would get id 0, and its words would count as padding.
        tokenizer.encode_special_tokens = True
        self._tokenizer = tokenizer
        self.lowercase = check_bool(lowercase, "lowercase")

    @classmethod
    def build(cls, texts: Iterable[str], vocab_size: int, *, lowercase: bool = True) -> BPETokenizer:
        """Learn the merges from ``texts`` (give it the training texts only).

        ``vocab_size`` is the *total* size: ``<pad>``, the 256 bytes and at most ``vocab_size - 257`` merges. A
        merge needs a pair seen at least twice, so small texts give a smaller vocabulary; ``len(tokenizer)`` is the
        real size. Training is deterministic (see the module's docstring).

        Args:
            texts: the training texts (an iterable of ``str``, read once).
            vocab_size: the largest vocabulary, ``<pad>`` and the 256 bytes included (from 257 to ``2**20``).
            lowercase: lower-case every text before training and encoding (the default; see the module's
                docstring).

        Returns:
            The trained tokenizer.
        """
        tk = _tokenizers()
        if not is_int(vocab_size) or not MIN_VOCAB_SIZE <= vocab_size <= MAX_VOCAB_SIZE:
            raise ValueError(
                f"vocab_size must be an int from {MIN_VOCAB_SIZE} (it counts <pad> and the 256 bytes) to "
                f"{MAX_VOCAB_SIZE:,} (2**20), got {vocab_size!r}"
            )
        check_bool(lowercase, "lowercase")
        normalized = [_normalize(_check_unicode(text, f"texts[{i}]"), lowercase) for i, text in check_texts(texts)]

        tokenizer = tk.Tokenizer(tk.models.BPE())
        # ByteLevel: a text becomes bytes, each shown as a printable character, after a GPT-2 style split into words
        # (a word keeps the space before it, so " great" and "great" are different tokens and no merge crosses a
        # word boundary). No prefix space: it would come back as an extra space in front of every decoded text.
        tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = tk.decoders.ByteLevel()
        trainer = tk.trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=2,  # a pair seen once is not a pattern worth a token
            special_tokens=[cls.PAD_TOKEN],  # first, so it gets id 0
            initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),  # every byte, even those the texts lack
            show_progress=False,  # a library does not draw on the terminal
        )
        tokenizer.train_from_iterator(normalized, trainer=trainer)
        return cls(tokenizer, lowercase=lowercase)

    def normalize(self, text: str) -> str:
        """``text`` as it is encoded: ``<br />`` a space, lower-cased unless built with ``lowercase=False``.

        Args:
            text: one text.

        Returns:
            The normalised text: ``decode(encode(text)) == normalize(text)``.
        """
        return _normalize(check_text(text), self.lowercase)

    def encode(self, text: str, *, max_length: int | None = None) -> list[int]:
        """Token ids of ``text``, never 0 (``<pad>``), cut to ``max_length``.

        An empty text gives ``[]``. A cut can fall inside a character of several bytes: that partial character then
        decodes as U+FFFD.

        Args:
            text: one text.
            max_length: keep the first ``max_length`` ids; ``None`` keeps them all.

        Returns:
            The ids, each in ``[1, len(self))``.
        """
        normalized = _normalize(_check_unicode(check_text(text), "text"), self.lowercase)
        check_max_length(max_length)
        return self._tokenizer.encode(normalized).ids[:max_length]  # [:None] keeps them all

    def decode(self, ids: Iterable[int]) -> str:
        """Ids back to text; ``<pad>`` ids are dropped.

        Args:
            ids: a sequence of ints (a list, a 1-D integer tensor or array), each in ``[0, len(self))``.

        Returns:
            The text, ``normalize(text)`` for the ids of ``encode(text)``.
        """
        return self._tokenizer.decode(check_ids(ids, len(self)), skip_special_tokens=True)

    def tokenize(self, text: str) -> list[str]:
        """The pieces ``text`` is cut into, each decoded on its own: see what the merges learned.

        A piece holding only some of the bytes of a character reads U+FFFD; joined, the pieces of a text whose
        characters are all whole pieces give ``normalize(text)``.

        Args:
            text: one text.

        Returns:
            One string per id of ``encode(text)``.
        """
        return [self._tokenizer.decode([i]) for i in self.encode(text)]

    def __len__(self) -> int:
        return self._tokenizer.get_vocab_size()  # <pad> included

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={len(self)}, lowercase={self.lowercase})"

    def state_dict(self) -> dict:
        """Everything needed to rebuild this tokenizer, as plain Python values.

        Returns:
            ``{"kind": "bpe", "lowercase": bool, "tokenizer": str}``: the trained tokenizer as the JSON string of
            ``tokenizers.Tokenizer.to_str()``, so it survives ``json.dump`` and
            ``torch.load(weights_only=True)``.
        """
        return {"kind": "bpe", "lowercase": self.lowercase, "tokenizer": self._tokenizer.to_str()}

    @classmethod
    def from_state_dict(cls, state: dict) -> BPETokenizer:
        """Rebuild a tokenizer from what :meth:`state_dict` returned (a clear error for another kind's state).

        Args:
            state: what :meth:`state_dict` returned.

        Returns:
            The tokenizer, encoding exactly as the one that wrote ``state``.
        """
        check_state(state, "bpe")
        if missing := sorted({"lowercase", "tokenizer"} - set(state)):
            raise ValueError(f"state has no {', '.join(map(repr, missing))} (keys: {sorted(state)}); pass what "
                             f"state_dict() returned")
        if not isinstance(state["tokenizer"], str):
            raise TypeError(f"state['tokenizer'] must be a str (the tokenizer's JSON), got "
                            f"{type(state['tokenizer']).__name__}")
        tk = _tokenizers()
        try:
            tokenizer = tk.Tokenizer.from_str(state["tokenizer"])
        except Exception as err:  # tokenizers raises a plain Exception for JSON it cannot read
            raise ValueError(f"state['tokenizer'] is not a tokenizer's JSON: {err}") from err
        return cls(tokenizer, lowercase=state["lowercase"])
