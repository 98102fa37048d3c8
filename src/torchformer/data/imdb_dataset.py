"""The IMDb movie-review sentiment dataset (Maas et al., ACL 2011).

50,000 reviews from IMDb, each labelled negative (0, rated 1-4 stars) or positive
(1, rated 7-10 stars), split 25,000 / 25,000 into an official train and test set.
It is the classic "does the model read a whole paragraph?" benchmark: reviews
average about 230 words, and the sentiment is often carried by a few words far apart.

:func:`imdb` reads any of three on-disk forms and returns exactly the same
``(text, label)`` pairs, in the same order, from each:

1. the official archive ``aclImdb_v1.tar.gz``, read straight from the tar
   (members ``aclImdb/{train,test}/{pos,neg}/[id]_[rating].txt``);
2. that archive extracted, i.e. an ``aclImdb/`` folder (or the folder holding it);
3. a folder with ``imdb_train.jsonl.gz`` and ``imdb_test.jsonl.gz``, one JSON object
   per line with at least ``"text"`` and ``"label"`` (and ideally ``"id"``).

The order is sorted by ``(label, id)``: all negative reviews by id, then all
positive ones. That order is *not* random, so always shuffle before training
(the batching helpers do). Texts are returned raw, ``<br />`` tags included:
cleaning is the tokenizer's job.

The test split should be looked at once, at the very end. :func:`train_val_split`
carves a validation set out of the training reviews for everything before that.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import tarfile
from pathlib import Path
from typing import Sequence, TypeVar

from torchformer.data.download import default_root
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


def imdb(
    path: str | os.PathLike | None = None,
    *,
    download: bool = False,
    root: str | os.PathLike | None = None,
) -> tuple[list[Example], list[Example]]:
    """Load the official IMDb train and test splits.

    Args:
        path: the archive, an ``aclImdb/`` folder or its parent, or a folder with the
            two ``imdb_*.jsonl.gz`` files. ``None`` looks for any of these in ``root``.
        download: with ``path=None``, fetch the official archive into ``root`` (md5
            checked) when nothing usable is there yet. Never re-downloads.
        root: where to look / download when ``path`` is None; defaults to
            :func:`torchformer.data.download.default_root`.

    Returns:
        ``(train, test)``, two lists of ``(text, label)`` with label 0 = negative and
        1 = positive, each sorted by ``(label, id)``.

    Raises:
        FileNotFoundError: nothing in an accepted form was found.
        ValueError: the data was found but is malformed (bad label, empty split, ...).
    """
    if path is not None:
        if download:
            raise ValueError("download=True only applies with path=None (it downloads into root)")
        source = _find_source(Path(path))
        if source is None:
            raise FileNotFoundError(f"no IMDb data at '{path}': expected {_ACCEPTED}")
    else:
        root_dir = Path(root) if root is not None else default_root()
        source = _find_source(root_dir) if root_dir.is_dir() else None
        if source is None and download:
            source = download_file(IMDB_URL, root_dir / ARCHIVE_NAME, md5=IMDB_MD5, progress=True)
        if source is None:
            raise FileNotFoundError(
                f"no IMDb data in '{root_dir}': expected {_ACCEPTED}; "
                "pass path=..., or download=True to fetch the official archive"
            )

    if source.is_file():
        splits = _read_tar(source)
    elif (source / JSONL_NAMES["train"]).is_file():
        splits = {name: _read_jsonl(source / JSONL_NAMES[name]) for name in ("train", "test")}
    else:
        splits = {name: _read_folder(source / name) for name in ("train", "test")}

    result = []
    for name in ("train", "test"):
        rows = splits[name]
        if not rows:
            raise ValueError(f"IMDb {name} split in '{source}' is empty")
        # Sorting by (label, id) makes all three forms agree, whatever order the
        # file system, tar or jsonl happened to list the reviews in.
        rows.sort(key=lambda row: (row[1], row[2]))
        result.append([(text, label) for text, label, _ in rows])
    return result[0], result[1]


def train_val_split(
    examples: Sequence[T], *, val_size: int = 5000, seed: int = 0
) -> tuple[list[T], list[T]]:
    """Split ``examples`` into ``(train, val)`` with ``len(val) == val_size``.

    The choice of validation examples depends only on ``len(examples)`` and ``seed``,
    so a run can be reproduced exactly. Both parts keep the input's relative order
    (for IMDb: sorted by label), so shuffle when batching.
    """
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    n = len(examples)
    if not isinstance(val_size, int) or isinstance(val_size, bool) or not 0 < val_size < n:
        raise ValueError(
            f"val_size must be an int with 0 < val_size < len(examples) = {n}, got {val_size!r}"
        )
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
        return path if tarfile.is_tarfile(path) else None
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


def _decode(data: bytes) -> str:
    # The official files are valid UTF-8; "replace" only keeps a damaged copy loadable.
    return data.decode("utf-8", errors="replace")


def _read_tar(path: Path) -> dict[str, list]:
    splits: dict[str, list] = {"train": [], "test": []}
    with tarfile.open(path, "r:*") as tar:
        for member in tar:
            if not member.isfile():
                continue
            split, sentiment, filename = (["", "", ""] + member.name.split("/"))[-3:]
            match = _REVIEW_NAME.fullmatch(filename)
            if split not in splits or sentiment not in _LABELS or match is None:
                continue
            handle = tar.extractfile(member)
            assert handle is not None  # a regular file always has contents
            splits[split].append((_decode(handle.read()), _LABELS[sentiment], int(match[1])))
    return splits


def _read_folder(folder: Path) -> list:
    rows = []
    for sentiment, label in _LABELS.items():
        directory = folder / sentiment
        if not directory.is_dir():
            raise FileNotFoundError(f"IMDb folder '{folder}' has no '{sentiment}/' subfolder")
        for entry in os.scandir(directory):
            match = _REVIEW_NAME.fullmatch(entry.name)
            if match is not None and entry.is_file():
                rows.append((_decode(Path(entry.path).read_bytes()), label, int(match[1])))
    return rows


def _read_jsonl(path: Path) -> list:
    rows = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                text, label = record["text"], record["label"]
            except (json.JSONDecodeError, KeyError, TypeError) as error:
                raise ValueError(
                    f"{path}, line {line_number}: expected a JSON object with 'text' and "
                    f"'label', got {line[:80]!r} ({error})"
                ) from None
            if type(label) is not int or label not in (0, 1):
                raise ValueError(f"{path}, line {line_number}: label must be 0 or 1, got {label!r}")
            if not isinstance(text, str):
                raise ValueError(
                    f"{path}, line {line_number}: text must be a string, got {type(text).__name__}"
                )
            # Without an id, line order stands in for it (the sort is stable).
            rows.append((text, label, record.get("id", line_number)))
    return rows
