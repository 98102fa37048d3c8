"""IMDb's 50,000 unlabelled reviews, for pretraining, and the de-duplication that keeps the evaluation honest.

The IMDb archive has, besides the labelled train and test reviews, a folder ``aclImdb/train/unsup/`` of 50,000
reviews without a rating (files ``[id]_0.txt``). They come from the same site and the same years, so they are
in-domain text for self-supervised pretraining (Dai & Le 2015 pretrain an LSTM on them; BERT-style masked
language modelling does the same for a transformer: :mod:`torchformer.train.masked_lm`).

One catch: the same review was often posted under several titles, and some of those copies landed in different
folders. 269 reviews of the official *test* set (and 373 of the training set) occur verbatim among the unlabelled
ones. A model pretrained on them would have read test reviews before it is tested on them, so
:func:`deduplicate` removes every pretraining text that also occurs in the texts to be kept unseen (the test set
and the validation split), and the repeats within the corpus itself.

:func:`imdb_unlabelled` reads the same three forms as :func:`~torchformer.data.imdb_dataset.imdb`: the official
archive, an extracted ``aclImdb/`` folder (or its parent), or a folder with ``imdb_unsup.jsonl.gz`` (one JSON object
per line with ``"text"`` and ideally ``"id"``). Damaged files raise
:class:`~torchformer.data.download.DataFileError` naming the file.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from torchformer._files import check_path
from torchformer.data._imdb_files import (
    check_ids_everywhere_or_nowhere, is_tar, json_object, line_error, read_folder, read_jsonl, read_tar, review_id,
    review_text,
)
from torchformer.data.download import DataFileError
from torchformer.data.imdb_dataset import ARCHIVE_NAME

__all__ = ["UNLABELLED_JSONL", "Deduplicated", "deduplicate", "imdb_unlabelled", "texts_digest"]

UNLABELLED_JSONL = "imdb_unsup.jsonl.gz"
# ".../train/unsup/[id]_0.txt": an unlabelled review carries no rating, hence the 0.
_UNSUP_FILE = re.compile(r"(\d+)_0\.txt")
_UNSUP_MEMBER = re.compile(r"(?:.*/)?train/unsup/" + _UNSUP_FILE.pattern)


def imdb_unlabelled(path: str | os.PathLike) -> list[str]:
    """The unlabelled IMDb reviews, in the order of their ids, raw (``<br />`` tags included).

    Args:
        path: a folder with ``imdb_unsup.jsonl.gz``, that file itself, an ``aclImdb/`` folder (or its parent), or
            the official archive ``aclImdb_v1.tar.gz``.

    Returns:
        the review texts (50,000 for the official data), sorted by id.

    Raises:
        FileNotFoundError: none of the accepted forms is at ``path``.
        DataFileError: the file is damaged or malformed (the message names the file and line), or holds no review.
    """
    path = check_path(path, "path")
    source = _find(path)
    if source is None:
        raise FileNotFoundError(f"no unlabelled IMDb reviews at '{path}': expected a folder with {UNLABELLED_JSONL}, "
                                f"that file, an aclImdb/ folder with train/unsup/, or {ARCHIVE_NAME}")
    if source.name == UNLABELLED_JSONL:
        rows = read_jsonl(source, _parse_unlabelled)
        check_ids_everywhere_or_nowhere([i for i, _ in rows], source)
    elif source.is_file():
        rows = read_tar(source, _member_id)
    else:
        rows = read_folder(source, _UNSUP_FILE)
    if not rows:
        raise DataFileError(source, "holds no unlabelled review", "Copy it again from the official archive.")
    rows.sort(key=lambda row: row[0])
    return [text for _, text in rows]


def _find(path: Path) -> Path | None:
    """The jsonl file, the ``unsup/`` folder or the archive that ``path`` names or holds."""
    if path.is_file():
        if path.name == UNLABELLED_JSONL or is_tar(path):
            return path
        raise DataFileError(path, f"is neither {UNLABELLED_JSONL} nor a tar archive (or it is a damaged one)",
                            f"Pass the folder that holds {UNLABELLED_JSONL}, aclImdb/ or {ARCHIVE_NAME}.")
    if not path.is_dir():
        return None
    for candidate, folder in ((path / UNLABELLED_JSONL, False), (path / "train" / "unsup", True),
                              (path / "aclImdb" / "train" / "unsup", True), (path / ARCHIVE_NAME, False)):
        if candidate.exists() and candidate.is_dir() != folder:
            raise DataFileError(candidate, f"is a {'file' if folder else 'folder'}, expected a "
                                           f"{'folder of reviews' if folder else 'file'}",
                                "Copy it again from the official archive.")
        if candidate.exists():
            return candidate
    return None


def _member_id(name: str) -> int | None:
    """The id of an unlabelled review's tar member, ``None`` for any other member."""
    match = _UNSUP_MEMBER.fullmatch(name)
    return None if match is None else int(match[1])


def _parse_unlabelled(line: str, path: Path, line_number: int) -> tuple[int, str]:
    """One jsonl line as (id, text): the labelled reader's checks, without a label."""
    bad = line_error(path, line_number)
    record = json_object(line, bad, ("text",))
    return review_id(record, line_number, bad), review_text(record, bad)


@dataclass(frozen=True)
class Deduplicated:
    """What :func:`deduplicate` kept and how many texts it removed, for each reason.

    Args:
        texts: the texts kept, in their original order.
        overlapping: texts removed because they occur in ``exclude`` (every copy counts).
        repeated: further copies of a kept text, removed (the first copy stays).
    """

    texts: list[str]
    overlapping: int
    repeated: int


def deduplicate(texts: Iterable[str], *, exclude: Iterable[str]) -> Deduplicated:
    """Remove every text that also occurs in ``exclude``, and every repeat of a text, keeping the order.

    Texts are compared exactly (character for character): this removes verbatim copies, which is what the IMDb
    folders share; a review re-posted with one word changed is not caught.

    Args:
        texts: the pretraining corpus.
        exclude: texts the model must not have seen (the test reviews, the validation split).

    Returns:
        The texts kept and the counts removed, as a :class:`Deduplicated`.
    """
    if exclude is None:
        raise TypeError("exclude must be an iterable of texts (pass [] to remove only the repeats), got None")
    unseen = set(_strings(exclude, "exclude"))
    kept, seen = [], set()
    overlapping = repeated = 0
    for text in _strings(texts, "texts"):
        if text in unseen:
            overlapping += 1
        elif text in seen:
            repeated += 1
        else:
            seen.add(text)
            kept.append(text)
    return Deduplicated(kept, overlapping, repeated)


def texts_digest(texts: Iterable[str]) -> str:
    """A SHA-256 fingerprint of a collection of texts, whatever their order: the same texts give the same digest.

    A pretrained model stores the digest of the texts it was kept from (the test set and the validation split);
    a fine-tuning run compares it with the digest of its own, so that other data (a test set the model may have
    read) cannot slip past the de-duplication unnoticed.

    Args:
        texts: the texts (each a str).

    Returns:
        The hex digest (64 characters).
    """
    h = hashlib.sha256()
    for text in sorted(_strings(texts, "texts")):
        data = text.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "little") + data)  # length first: ["ab", "c"] and ["a", "bc"] differ
    return h.hexdigest()


def _strings(texts: Iterable[str], name: str) -> Iterable[str]:
    if isinstance(texts, (str, bytes)):
        raise TypeError(f"{name} must be an iterable of texts (e.g. a list of str), got a single "
                        f"{type(texts).__name__}")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"{name}[{i}] must be a str, got {type(text).__name__}")
        yield text
