"""The IMDb movie-review sentiment dataset (Maas et al., ACL 2011).

50,000 reviews from IMDb, each labelled negative (0, rated 1-4 stars) or positive (1, rated 7-10 stars), split
25,000 / 25,000 into an official train and test set. It is the classic "does the model read a whole paragraph?"
benchmark: reviews average about 230 words, and the sentiment is often carried by a few words far apart.
(Measured on the 25,000 training reviews: 231.5 words separated by white space once the ``<br />`` line breaks are
removed, median 173; in tokens of the library's :class:`~torchformer.data.tokenizers.WordTokenizer`, which also
counts punctuation marks, 269.9, median 201.)

:func:`imdb` reads any of three on-disk forms and returns exactly the same ``(text, label)`` pairs, in the same
order, from each:

1. the official archive ``aclImdb_v1.tar.gz``, read straight from the tar
   (members ``aclImdb/{train,test}/{pos,neg}/[id]_[rating].txt``);
2. that archive extracted, i.e. an ``aclImdb/`` folder (or the folder holding it);
3. a folder with ``imdb_train.jsonl.gz`` and ``imdb_test.jsonl.gz``, one JSON object per line with at least
   ``"text"`` and ``"label"`` (and ideally ``"id"``).

The order is sorted by ``(label, id)``: all negative reviews by id, then all positive ones. That order is *not*
random, so always shuffle before training (the batching helpers do). Texts are returned raw, ``<br />`` tags
included: cleaning is the tokenizer's job. The test split should be looked at once, at the very end;
:func:`train_val_split` carves a validation set out of the training reviews for everything before that.

Files are checked, not trusted (``docs/data.md`` has the details). The archive found in ``root`` (``path=None``) is
the cache's copy of the official one, so its md5 is checked before every use (a hash pass over 84 MB, small next to
reading the reviews); a ``path=`` you pass is used as it is (it may be a repacked or partial copy on purpose), and
the folder and jsonl forms, which have no official checksum, are checked for their format only. A damaged,
truncated or malformed file raises :class:`~torchformer.data.download.DataFileError` naming the file (the tar
member, the jsonl line), and so does text that is not valid UTF-8: the official files are, so an invalid byte means
a damaged or re-encoded copy, never silently replaced by U+FFFD (which would train on altered text).
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Sequence, TypeVar

from torchformer._checks import check_bool, is_int
from torchformer._files import check_path, remove_stale_part_files
from torchformer.data._imdb_files import (
    check_ids_everywhere_or_nowhere, is_tar, json_object, line_error, read_folder, read_jsonl, read_tar, review_id,
    review_text,
)
from torchformer.data.download import DataFileError, DataNotFoundError, default_root, verify
from torchformer.data.download import download as download_file

__all__ = ["IMDB_URL", "IMDB_MD5", "imdb", "train_val_split"]

IMDB_URL = "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz"
# md5 of the official archive (the value torchtext and others check for this URL).
# Read at call time, so tests can point IMDB_URL/IMDB_MD5 at a local fixture.
IMDB_MD5 = "7c2ac02c03563afcf9b574c7e56c153a"

ARCHIVE_NAME = "aclImdb_v1.tar.gz"
JSONL_NAMES = {"train": "imdb_train.jsonl.gz", "test": "imdb_test.jsonl.gz"}
_LABELS = {"neg": 0, "pos": 1}
# ".../{train,test}/{pos,neg}/[id]_[rating].txt"; anything else (unsup/, urls_*.txt,
# the README, vocab files) simply does not match and is skipped.
_REVIEW_NAME = re.compile(r"(\d+)_(\d+)\.txt")

_ACCEPTED = (
    f"the official archive '{ARCHIVE_NAME}', an extracted 'aclImdb/' folder (or its parent), "
    f"or a folder with '{JSONL_NAMES['train']}' and '{JSONL_NAMES['test']}'"
)

Example = tuple[str, int]
T = TypeVar("T")


def imdb(path: str | os.PathLike | None = None, *, download: bool = False,
         root: str | os.PathLike | None = None) -> tuple[list[Example], list[Example]]:
    """Load the official IMDb train and test splits.

    Args:
        path: the archive, an ``aclImdb/`` folder or its parent, or a folder with the
            two ``imdb_*.jsonl.gz`` files. ``None`` looks for any of these in ``root``.
        download: with ``path=None``, fetch the official archive into ``root`` (md5
            checked) when nothing usable is there yet, or when the archive there is not
            the official one (it is replaced).
        root: where to look / download when ``path`` is None; defaults to
            :func:`torchformer.data.download.default_root`.

    Returns:
        ``(train, test)``, two lists of ``(text, label)`` with label 0 = negative and
        1 = positive, each sorted by ``(label, id)``.

    Raises:
        FileNotFoundError: nothing in an accepted form was found (:class:`~torchformer.data.download.DataNotFoundError`
            when nothing was found in ``root`` and ``download`` was not asked for).
        ChecksumError: the archive in ``root`` is not the official one (and ``download`` is False).
        DataFileError: the data was found but is damaged or malformed (a truncated archive,
            a bad label, text that is not UTF-8, an empty split, ...); the message names the file.
    """
    check_bool(download, "download")
    if path is not None:
        if download:
            raise ValueError("download=True only applies with path=None (it downloads into root)")
        path = check_path(path, "path")
        source = _find_source(path)
        if source is None:
            raise FileNotFoundError(f"no IMDb data at '{path}': {_what_is_missing(path)}")
    else:
        root_dir = check_path(root, "root") if root is not None else default_root()
        if root_dir.exists() and not root_dir.is_dir():
            raise NotADirectoryError(f"root {root_dir} is a file, not a folder; pass the folder that holds the data")
        source = _find_source(root_dir) if root_dir.is_dir() else None
        archive = root_dir / ARCHIVE_NAME
        if root_dir.is_dir():
            remove_stale_part_files(archive)  # what a killed download left behind
        if source == archive or (source is None and download):
            # The archive in root is the cache's copy of the official one: checked (or fetched) like a download.
            source = _cached_archive(archive, download)
        if source is None:
            raise DataNotFoundError(f"no IMDb data in '{root_dir}': {_what_is_missing(root_dir)}",
                                    "pass path=..., or download=True to fetch the official archive")

    if source.is_file():
        splits = _read_tar(source)
    elif (source / JSONL_NAMES["train"]).is_file():
        splits = {name: read_jsonl(source / JSONL_NAMES[name], _parse_record) for name in ("train", "test")}
        for name, rows in splits.items():
            check_ids_everywhere_or_nowhere([i for _, _, i in rows], source / JSONL_NAMES[name])
    else:
        splits = {name: _read_folder(source / name) for name in ("train", "test")}

    result = []
    for name in ("train", "test"):
        rows = splits[name]
        if not rows:
            raise _empty_split(source, name)
        # Sorting by (label, id) makes all three forms agree, whatever order the
        # file system, tar or jsonl happened to list the reviews in.
        rows.sort(key=lambda row: (row[1], row[2]))
        result.append([(text, label) for text, label, _ in rows])
    return result[0], result[1]


def _empty_split(source: Path, name: str) -> DataFileError:
    """The error for a split without a single review, naming where its reviews should have been."""
    if source.is_file():
        where, problem = source, f"holds no reviews under {name}/pos/ or {name}/neg/"
    elif (source / JSONL_NAMES[name]).is_file():
        where, problem = source / JSONL_NAMES[name], "holds no reviews"
    else:
        where, problem = source / name, "holds no reviews ([id]_[rating].txt files in pos/ and neg/)"
    return DataFileError(where, problem, f"The IMDb {name} split is empty; use a complete copy of the data.")


def _cached_archive(archive: Path, download: bool) -> Path:
    """The cache's copy of the official archive, verified; with ``download``, fetched or replaced if bad."""
    if download:
        # download() checks a file already there like a fresh one, and downloads it again if it fails.
        return download_file(IMDB_URL, archive, md5=IMDB_MD5, progress=True)
    verify(archive, md5=IMDB_MD5, advice=(
        f"It is damaged or not the official archive. Call imdb(download=True, root={str(archive.parent)!r}) "
        f"to replace it with the official one, or pass path={str(archive)!r} to use this copy as it is."
    ))
    return archive


def train_val_split(examples: Sequence[T], *, val_size: int = 5000, seed: int = 0) -> tuple[list[T], list[T]]:
    """Split ``examples`` into ``(train, val)`` with ``len(val) == val_size``.

    The choice of validation examples depends only on ``len(examples)`` and ``seed``, so a run can be reproduced
    exactly. Both parts keep the input's relative order (for IMDb: sorted by label), so shuffle when batching.

    Args:
        examples: the examples to split.
        val_size: how many go to the validation part.
        seed: which ones; the same seed gives the same split.

    Returns:
        ``(train, val)``, two lists.
    """
    if not is_int(seed):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    # Needs len() and indexing; a generator would have neither, a dict would index by key.
    # A str would be split into characters: surely a mistake too.
    if isinstance(examples, (str, bytes, Mapping)) or not (
        hasattr(examples, "__len__") and hasattr(examples, "__getitem__")
    ):
        raise TypeError(f"examples must be a sequence (e.g. a list), got {type(examples).__name__}")
    n = len(examples)
    if not is_int(val_size) or not 0 < val_size < n:
        raise ValueError(f"val_size must be an int with 0 < val_size < len(examples) = {n}, got {val_size!r}")
    # A private Random instance: no global RNG state is read or changed.
    val_idx = set(random.Random(seed).sample(range(n), val_size))
    train = [examples[i] for i in range(n) if i not in val_idx]
    val = [examples[i] for i in range(n) if i in val_idx]
    return train, val


# --------------------------------------------------------------------------- #
# Finding and reading the three forms. Each reader returns (text, label, id) rows.
# --------------------------------------------------------------------------- #


def _find_source(path: Path) -> Path | None:
    """Resolve ``path`` to an archive file, an aclImdb-style folder or a jsonl folder."""
    if path.is_file():
        if not is_tar(path):
            raise DataFileError(path, "is not a tar archive (or is a damaged one)", f"imdb() expects {_ACCEPTED}.")
        return path
    if not path.is_dir():
        return None
    # Cheapest form first: the jsonl files load several times faster than 50k small files.
    if all((path / name).is_file() for name in JSONL_NAMES.values()):
        return path
    for folder in (path, path / "aclImdb"):
        if (folder / "train").is_dir() and (folder / "test").is_dir():
            return folder
    archive = path / ARCHIVE_NAME
    return archive if archive.is_file() else None


def _what_is_missing(path: Path) -> str:
    """For the error message: the half-present form in ``path`` if there is one, else the accepted forms."""
    if path.is_dir():
        train, test = (path / JSONL_NAMES["train"], path / JSONL_NAMES["test"])
        if train.is_file() != test.is_file():
            have, lack = (train, test) if train.is_file() else (test, train)
            return f"it has {have.name} but not {lack.name}; both splits are needed (expected {_ACCEPTED})"
        for prefix in ("", "aclImdb/"):
            train, test = (path / prefix / "train").is_dir(), (path / prefix / "test").is_dir()
            if train != test:
                have, lack = ("train", "test") if train else ("test", "train")
                return f"it has {prefix}{have}/ but not {prefix}{lack}/; both splits are needed (expected {_ACCEPTED})"
    return f"expected {_ACCEPTED}"


def _read_tar(path: Path) -> dict[str, list]:
    splits: dict[str, list] = {"train": [], "test": []}
    for (split, label, review), text in read_tar(path, _tar_key):
        splits[split].append((text, label, review))
    return splits


def _tar_key(name: str) -> tuple[str, int, int] | None:
    """``(split, label, id)`` of a review's member name, ``None`` for any other member."""
    split, sentiment, filename = (["", "", ""] + name.split("/"))[-3:]
    match = _REVIEW_NAME.fullmatch(filename)
    if split not in ("train", "test") or sentiment not in _LABELS or match is None:
        return None
    return split, _LABELS[sentiment], int(match[1])


def _read_folder(folder: Path) -> list:
    rows = []
    for sentiment, label in _LABELS.items():
        directory = folder / sentiment
        if not directory.is_dir():
            raise FileNotFoundError(f"IMDb folder '{folder}' has no '{sentiment}/' subfolder")
        rows += [(text, label, review) for review, text in read_folder(directory, _REVIEW_NAME)]
    return rows


def _parse_record(line: str, path: Path, line_number: int) -> tuple[str, int, int]:
    """One jsonl line as (text, label, id), or a DataFileError naming the file and the line."""
    bad = line_error(path, line_number)
    record = json_object(line, bad, ("text", "label"))
    label = record["label"]
    if type(label) is not int or label not in (0, 1):  # type(...) is int: True is not a label
        raise bad(f"label must be 0 or 1, got {label!r}")
    return review_text(record, bad), label, review_id(record, line_number, bad)
