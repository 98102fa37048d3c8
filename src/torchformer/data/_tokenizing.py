"""What every tokenizer checks at its door, and the line breaks they all remove.

Shared by :mod:`torchformer.data.tokenizers` and :mod:`torchformer.data.bpe`. It lives here, importing neither, so
that the two modules do not import each other: ``tokenizers`` needs ``bpe`` to rebuild a BPE tokenizer from its
state, and ``bpe`` needs these checks.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import Any, Iterable, Iterator

from torchformer._checks import is_int

# IMDb reviews mark line breaks with HTML tags; they would otherwise become the
# most frequent "words" of the corpus. Replaced by a space so the words on either
# side do not fuse.
BREAK = re.compile(r"<br\s*/?>", re.IGNORECASE)


def check_text(text: object) -> str:
    """``text`` itself if it is a ``str``; else a TypeError that says what to do with what was passed."""
    if not isinstance(text, str):
        hint = ""
        if isinstance(text, (bytes, bytearray)):
            hint = " (decode them first, e.g. text.decode('utf-8'))"
        elif isinstance(text, (list, tuple)):
            hint = " (encode one text at a time)"
        raise TypeError(f"text must be a str, got {type(text).__name__}{hint}")
    return text


def check_texts(texts: object) -> Iterator[tuple[int, str]]:
    """``enumerate(texts)`` for an iterable of ``str`` (read once, as it goes); else a TypeError naming the culprit."""
    if isinstance(texts, (str, bytes)):
        # A lone string would be iterated character by character: surely a mistake.
        raise TypeError("texts must be an iterable of strings, got a single string")
    if not isinstance(texts, Iterable):
        raise TypeError(f"texts must be an iterable of strings, got {type(texts).__name__}")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"texts[{i}] must be a str, got {type(text).__name__}")
        yield i, text


def check_ids(ids: object, vocab_size: int) -> list[int]:
    """``ids`` as a list of Python ints in ``[0, vocab_size)``: a sequence of ints, or a 1-D integer tensor or numpy
    array. Every id's type is checked before any id's range."""
    kind = type(ids).__name__
    if hasattr(ids, "tolist") and not isinstance(ids, (str, bytes, bytearray)):
        ids = ids.tolist()  # tensors and arrays: one C-level conversion instead of a Python loop over 0-d tensors
    # bytes are iterable ints too, but surely a mistake here: decode() turns ids into text, not bytes into text.
    # Sets and dicts iterate in no meaningful order: the text would come out shuffled.
    if isinstance(ids, (str, bytes, bytearray, AbstractSet, Mapping)) or not isinstance(ids, Iterable):
        raise TypeError(f"ids must be a sequence of ints, got {kind}")
    checked = []
    for k, i in enumerate(ids):
        # operator.index takes ints, numpy ints and 0-d integer tensors, never floats or strings (int() would
        # silently turn 2.7 into 2 and "3" into 3). bool is an int to Python, but not a token id.
        try:
            value = None if isinstance(i, bool) else operator.index(i)
        except TypeError:
            value = None
        if value is None:
            raise TypeError(f"ids[{k}] must be an int, got {type(i).__name__} {i!r}")
        checked.append(value)
    for i in checked:
        if not 0 <= i < vocab_size:
            raise ValueError(f"ids must be in [0, {vocab_size}), got {i}")
    return checked


def check_max_length(max_length: int | None) -> None:
    """Raise ValueError unless ``max_length`` is a positive int or ``None`` (no limit)."""
    if max_length is not None and (not is_int(max_length) or max_length < 1):
        raise ValueError(f"max_length must be a positive int or None, got {max_length!r}")


def check_state(state: Any, kind: str) -> None:
    """Raise unless ``state`` is a dict written by a tokenizer of ``kind`` (``"word"``, ``"byte"``, ``"bpe"``)."""
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict, got {type(state).__name__} (pass what state_dict() returned)")
    if state.get("kind") != kind:
        raise ValueError(f"state must be a dict with kind={kind!r}, got {state.get('kind')!r}")
