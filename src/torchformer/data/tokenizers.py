"""Tokenizers: turning text into the integer ids a model embeds.

Two deliberately simple schemes, both with id 0 reserved for padding:

* :class:`WordTokenizer` - lower-cased words and punctuation marks. The vocabulary is the ``vocab_size - 2`` most
  frequent tokens of the *training* texts; anything else becomes ``<unk>``. Building it on training texts only
  matters: a vocabulary that has seen the test set leaks information about it.
* :class:`ByteTokenizer` - the UTF-8 bytes of the text, shifted by one so that byte ``b`` gets id ``b + 1``. No
  vocabulary to build and nothing is ever unknown, at the price of sequences several times longer.

A third, :class:`~torchformer.data.bpe.BPETokenizer` (byte-level BPE, subwords learned from the training texts),
lives in :mod:`torchformer.data.bpe`: it needs the optional ``tokenizers`` package.

All three save to a ``state_dict()`` of plain lists, strings and ints, which survives ``json.dump`` and
``torch.save``/``torch.load(weights_only=True)``; use :func:`tokenizer_from_state_dict` to get the right class back.

Wrong types fail at the door with a TypeError that names the argument: ``encode`` takes one text (a ``str``; the
byte tokenizer also takes ``bytes``, which already are its tokens), ``decode`` takes a sequence of ints (a list, a
1-D integer tensor or array). Wrong values (an id out of range, a ``max_length`` below 1) are a ValueError that
names them; building and restoring say what they raise.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Iterable, Sequence, Union

from torchformer._checks import is_int
from torchformer.data._tokenizing import BREAK, check_ids, check_max_length, check_state, check_text, check_texts
# No cycle: bpe.py imports the shared checks from _tokenizing, not this module, and it imports the optional
# tokenizers package only when a BPETokenizer is built or loaded.
from torchformer.data.bpe import BPETokenizer

__all__ = ["WordTokenizer", "ByteTokenizer", "build_tokenizer", "tokenizer_from_state_dict"]

# A word is a run of letters/digits, optionally with inner apostrophes ("don't",
# "it's"); every other non-space character is a token of its own ("!!" -> "!", "!").
_TOKEN = re.compile(r"\w+(?:'\w+)*|[^\w\s]")


def _words(text: str) -> list[str]:
    return _TOKEN.findall(BREAK.sub(" ", text.lower()))


class WordTokenizer:
    """Lower-cased word/punctuation tokens with a frequency-ranked vocabulary.

    Id 0 is ``<pad>``, id 1 is ``<unk>``, then the vocabulary words from most to
    least frequent (ties in alphabetical order, so a build is reproducible).

    Args:
        vocab: every token, in id order, ``<pad>`` and ``<unk>`` first (what :meth:`build` makes from texts).

    Example:
        >>> tok = WordTokenizer.build(["A fine film.", "A dull film!"], vocab_size=6)
        >>> tok.tokenize("A FINE<br />film!")
        ['a', 'fine', 'film', '!']
        >>> tok.decode(tok.encode("a great film"))
        'a <unk> film'
    """

    PAD, UNK = 0, 1
    PAD_TOKEN, UNK_TOKEN = "<pad>", "<unk>"

    def __init__(self, vocab: Sequence[str]):
        if isinstance(vocab, str):
            raise TypeError("vocab must be a sequence of str, got a single str")
        # A sequence: its order gives the ids. A dict or a set has an order too, but not the ids (a {token: id}
        # dict would be numbered by key order, whatever ids it says).
        if not isinstance(vocab, Sequence):
            raise TypeError(f"vocab must be a sequence of str in id order (a list), got {type(vocab).__name__}")
        vocab = list(vocab)
        if vocab[:2] != [self.PAD_TOKEN, self.UNK_TOKEN]:
            raise ValueError(f"vocab must start with {[self.PAD_TOKEN, self.UNK_TOKEN]}, got {vocab[:2]}")
        if not all(isinstance(token, str) for token in vocab):
            raise TypeError("vocab must contain only strings")
        if len(set(vocab)) != len(vocab):
            raise ValueError("vocab must not contain duplicate tokens")
        self._id_to_token = vocab
        self._token_to_id = {token: i for i, token in enumerate(vocab)}

    @classmethod
    def build(cls, texts: Iterable[str], vocab_size: int) -> WordTokenizer:
        """Build the vocabulary from ``texts`` (give it the training texts only).

        ``vocab_size`` is the *total* size, ``<pad>`` and ``<unk>`` included, so at most ``vocab_size - 2`` words
        are kept. Fewer distinct words than that give a smaller vocabulary; ``len(tokenizer)`` is the real size.

        Args:
            texts: the training texts (an iterable of ``str``, read once).
            vocab_size: the largest vocabulary, ``<pad>`` and ``<unk>`` included (at least 2).

        Returns:
            The tokenizer, its words ranked by frequency in ``texts`` (ties alphabetically).

        Raises:
            TypeError: ``texts`` is a single string, or holds something other than strings.
            ValueError: ``vocab_size`` is not an int of at least 2.
        """
        if not is_int(vocab_size) or vocab_size < 2:
            raise ValueError(f"vocab_size must be an int >= 2 (it counts <pad> and <unk>), got {vocab_size!r}")
        counts: Counter[str] = Counter()
        for _, text in check_texts(texts):
            counts.update(_words(text))
        # Specials are never counted as words (a review could literally say "<unk>",
        # but the tokenizer splits that into "<", "unk", ">").
        ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
        words = [word for word, _ in ranked[: vocab_size - 2]]
        return cls([cls.PAD_TOKEN, cls.UNK_TOKEN, *words])

    def tokenize(self, text: str) -> list[str]:
        """Lower-case, turn ``<br />`` into a space, split off punctuation.

        Args:
            text: one text.

        Returns:
            The tokens in order: words (runs of letters and digits, with inner apostrophes as in ``"don't"``) and
            single punctuation marks, in the vocabulary or not (:meth:`encode` maps those it lacks to ``<unk>``).
        """
        return _words(check_text(text))

    def encode(self, text: str, *, max_length: int | None = None) -> list[int]:
        """Token ids of ``text``, unknown words as ``UNK`` (id 1), cut to ``max_length``.

        An empty (or all-whitespace) text gives ``[]``; the batching code refuses
        empty sequences, so decide upstream what such a text should be.

        Args:
            text: one text.
            max_length: keep the first ``max_length`` ids; ``None`` keeps them all.

        Returns:
            The ids, one per token of :meth:`tokenize`, each in ``[1, len(self))``.
        """
        check_text(text)
        check_max_length(max_length)
        lookup, unk = self._token_to_id.get, self.UNK
        return [lookup(token, unk) for token in _words(text)[:max_length]]  # [:None] keeps them all

    def decode(self, ids: Iterable[int]) -> str:
        """Tokens joined by single spaces; ``<pad>`` ids are dropped, unknowns read ``<unk>``.

        For text made of in-vocabulary words, ``decode(encode(t)) == " ".join(tokenize(t))``.

        Args:
            ids: a sequence of ints (a list, a 1-D integer tensor or array), each in ``[0, len(self))``.

        Returns:
            The text.
        """
        return " ".join(self._id_to_token[i] for i in check_ids(ids, len(self)) if i != self.PAD)

    def __len__(self) -> int:
        return len(self._id_to_token)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={len(self)})"

    def state_dict(self) -> dict:
        """Everything needed to rebuild this tokenizer, as plain Python values.

        Returns:
            ``{"kind": "word", "vocab": [...]}``, every token in id order; it survives ``json.dump`` and
            ``torch.load(weights_only=True)``.
        """
        return {"kind": "word", "vocab": list(self._id_to_token)}

    @classmethod
    def from_state_dict(cls, state: dict) -> WordTokenizer:
        """Rebuild a tokenizer from what :meth:`state_dict` returned (a clear error for another kind's state).

        Args:
            state: what :meth:`state_dict` returned.

        Returns:
            The tokenizer, encoding exactly as the one that wrote ``state``.

        Raises:
            TypeError: ``state`` is not a dict, or its ``"vocab"`` is not a sequence of strings.
            ValueError: ``state`` is another kind's, has no ``"vocab"``, or a vocabulary that does not start with
                ``<pad>``, ``<unk>`` or repeats a token.
        """
        check_state(state, "word")
        if "vocab" not in state:
            raise ValueError(f"state has no 'vocab' (keys: {sorted(state)}); pass what state_dict() returned")
        return cls(state["vocab"])


class ByteTokenizer:
    """UTF-8 bytes as tokens: byte ``b`` is id ``b + 1``, id 0 is ``<pad>``; 257 ids.

    Decoding is exact for any string, except where ``max_length`` cut a multi-byte
    character in half: that partial character decodes as U+FFFD.
    """

    PAD = 0
    PAD_TOKEN = "<pad>"

    def encode(self, text: Union[str, bytes], *, max_length: int | None = None) -> list[int]:
        """Ids of the UTF-8 bytes of ``text``, cut to ``max_length``.

        ``text`` may also be ``bytes`` (or ``bytearray``, ``memoryview``): they are already bytes, so they are
        encoded as they are, whatever their encoding. :meth:`decode` always returns a ``str`` (invalid UTF-8 decodes
        as U+FFFD).

        Args:
            text: one text (a lone surrogate, which has no UTF-8 bytes, is a ValueError), or its bytes.
            max_length: keep the first ``max_length`` ids (bytes); ``None`` keeps them all.

        Returns:
            The ids, one per byte, each in ``[1, 257)``.
        """
        if isinstance(text, str):
            try:
                data = text.encode("utf-8")
            except UnicodeEncodeError as err:  # e.g. json.loads('"\\ud800"'): half of a surrogate pair
                raise ValueError(
                    f"text is not valid Unicode: lone surrogate {text[err.start]!r} at index {err.start} "
                    f"has no UTF-8 bytes (clean the text first)"
                ) from err
        elif isinstance(text, (bytes, bytearray, memoryview)):
            data = bytes(text)
        else:
            raise TypeError(f"text must be a str or bytes, got {type(text).__name__}")
        check_max_length(max_length)
        return [b + 1 for b in data[:max_length]]  # [:None] keeps them all

    def decode(self, ids: Iterable[int]) -> str:
        """Ids back to text: id ``b + 1`` is byte ``b``, ``<pad>`` (id 0) is dropped, invalid UTF-8 reads U+FFFD.

        Args:
            ids: a sequence of ints (a list, a 1-D integer tensor or array), each in ``[0, 257)``.

        Returns:
            The text the bytes spell in UTF-8.
        """
        return bytes(i - 1 for i in check_ids(ids, 257) if i != self.PAD).decode("utf-8", errors="replace")

    def __len__(self) -> int:
        return 257

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def state_dict(self) -> dict:
        """Everything needed to rebuild this tokenizer: only its kind, since it has no vocabulary to store.

        Returns:
            ``{"kind": "byte"}``.
        """
        return {"kind": "byte"}

    @classmethod
    def from_state_dict(cls, state: dict) -> ByteTokenizer:
        """Rebuild the tokenizer from what :meth:`state_dict` returned (a clear error for another kind's state).

        Args:
            state: what :meth:`state_dict` returned.

        Returns:
            A new :class:`ByteTokenizer` (they are all alike).
        """
        check_state(state, "byte")
        return cls()


def tokenizer_from_state_dict(state: dict) -> WordTokenizer | ByteTokenizer | BPETokenizer:
    """Rebuild whichever tokenizer wrote ``state`` (dispatch on ``state["kind"]``).

    Args:
        state: what a tokenizer's ``state_dict()`` returned.

    Returns:
        The tokenizer, of the class ``state["kind"]`` names: :class:`WordTokenizer` (``"word"``),
        :class:`ByteTokenizer` (``"byte"``) or :class:`~torchformer.data.bpe.BPETokenizer` (``"bpe"``, which needs
        the ``tokenizers`` package: ``pip install "torchformer[bpe]"``).

    Raises:
        TypeError: ``state`` is not a dict.
        ValueError: ``state["kind"]`` is none of these, or the state is not valid for its class.
        ImportError: ``state`` is a BPE tokenizer's and the ``tokenizers`` package is missing.
    """
    classes = {"word": WordTokenizer, "byte": ByteTokenizer, "bpe": BPETokenizer}
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict, got {type(state).__name__} (pass what state_dict() returned)")
    kind = state.get("kind")
    if kind not in classes:
        raise ValueError(f"state['kind'] must be one of {sorted(classes)}, got {kind!r}")
    return classes[kind].from_state_dict(state)


TOKENIZERS = ("word", "bpe", "byte")


def build_tokenizer(kind: str, texts: Sequence[str], *,
                    vocab_size: int) -> WordTokenizer | ByteTokenizer | BPETokenizer:
    """A tokenizer of ``kind``, its vocabulary learned from ``texts`` (for ``"word"`` and ``"bpe"``).

    Pass the *training* texts only: a vocabulary that has seen the validation or test texts leaks them.

    Args:
        kind: ``"word"`` (:class:`WordTokenizer`), ``"bpe"`` (:class:`~torchformer.data.bpe.BPETokenizer`, needs
            the ``tokenizers`` package) or ``"byte"`` (:class:`ByteTokenizer`, which learns nothing).
        texts: the texts to learn the vocabulary from.
        vocab_size: the vocabulary size, padding included (ignored for bytes).

    Returns:
        the tokenizer.

    Raises:
        ValueError: ``kind`` is not one of the three, or ``vocab_size`` is too small for it.
        TypeError: ``texts`` is a single string instead of a sequence of them.
        ImportError: ``"bpe"`` without the ``tokenizers`` package (``pip install "torchformer[bpe]"``).
    """
    if kind == "word":
        return WordTokenizer.build(texts, vocab_size)
    if kind == "bpe":
        return BPETokenizer.build(texts, vocab_size)
    if kind == "byte":
        return ByteTokenizer()
    raise ValueError(f"kind must be one of {', '.join(map(repr, TOKENIZERS))}, got {kind!r}")
