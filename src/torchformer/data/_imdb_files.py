"""Reading IMDb's review files: strict UTF-8, tar archives, and jsonl lines checked one by one.

Shared by :mod:`torchformer.data.imdb_dataset` (the labelled reviews) and :mod:`torchformer.data.imdb_unlabelled`
(the unlabelled ones), which read the same three forms of the same archive and must check them alike. A damaged or
malformed file is a :class:`~torchformer.data.download.DataFileError` naming the file (the tar member, the line).
"""

from __future__ import annotations

import codecs
import gzip
import json
import os
import re
import tarfile
from pathlib import Path
from typing import Callable, Sequence, TypeVar

from torchformer.data.download import DAMAGED_DATA_ERRORS, DataFileError, is_damaged_data

_UTF8_ADVICE = (
    "IMDb texts are UTF-8 and the official files are valid UTF-8, so this copy is damaged or was re-encoded: "
    "restore it from the official archive, or re-encode it as UTF-8."
)
# A lone surrogate ("\ud800") is valid JSON ("\\ud800") but not valid Unicode: it has no UTF-8 bytes.
_SURROGATE = re.compile("[\ud800-\udfff]")
T = TypeVar("T")


def is_tar(path: Path) -> bool:
    try:
        return tarfile.is_tarfile(path)
    except DAMAGED_DATA_ERRORS as err:  # a damaged compressed file can fail before tarfile decides
        if not is_damaged_data(err):
            raise
        return False


def decode(data: bytes, path: Path, *, where: str = "", line: int | None = None) -> str:
    """Strict UTF-8 (see imdb_dataset's module docstring): invalid bytes are an error naming the file, never
    replaced."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        bad = data[err.start:err.end]
        raise DataFileError(
            path, f"{where}is not valid UTF-8 (byte {err.start}{' of the line' if line else ''} is {bad!r})",
            _UTF8_ADVICE, line=line,
        ) from err


def read_tar(path: Path, key: Callable[[str], T | None]) -> list[tuple[T, str]]:
    """``(key(name), text)`` for each file of the tar archive whose member name ``key`` accepts (returns not None);
    a damaged archive or a text that is not UTF-8 is a DataFileError naming the file (and the member)."""
    rows = []
    try:
        with tarfile.open(path, "r:*") as tar:
            for member in tar:
                if not member.isfile() or (found := key(member.name)) is None:
                    continue
                handle = tar.extractfile(member)
                assert handle is not None  # a regular file always has contents
                rows.append((found, decode(handle.read(), path, where=f"member {member.name} ")))
            # tarfile stops at the archive's end marker and never reads the last bytes of the compressed
            # stream, where gzip keeps its CRC: read them, so that a changed byte is an error, not a review.
            while tar.fileobj.read(1 << 20):
                pass
    except DAMAGED_DATA_ERRORS as err:
        if not is_damaged_data(err):
            raise  # the system's error (permissions, disk), not damage
        raise DataFileError(path, f"is a damaged or truncated archive ({type(err).__name__}: {err})") from err
    return rows


def read_folder(folder: Path, name: re.Pattern) -> list[tuple[int, str]]:
    """``(id, text)`` for each file of ``folder`` whose name ``name`` matches in full, the id its first group."""
    rows = []
    with os.scandir(folder) as entries:  # closed also when a file fails to decode
        for entry in entries:
            match = name.fullmatch(entry.name)
            if match is not None and entry.is_file():
                path = Path(entry.path)
                rows.append((int(match[1]), decode(path.read_bytes(), path)))
    return rows


def read_jsonl(path: Path, parse: Callable[[str, Path, int], T]) -> list[T]:
    """Each non-blank line of a gzipped jsonl file, parsed by ``parse(line, path, line_number)`` (a labelled review
    or an unlabelled one); a damaged file or line is a DataFileError naming the file (and the line)."""
    rows = []
    try:
        with gzip.open(path, "rb") as f:
            # Bytes, decoded line by line, so that a bad byte is reported with its line number.
            for line_number, raw in enumerate(f, start=1):
                if line_number == 1 and raw.startswith(codecs.BOM_UTF8):
                    raw = raw[len(codecs.BOM_UTF8):]  # written by some Windows tools; not part of the JSON
                line = decode(raw, path, line=line_number)
                if line.strip():
                    rows.append(parse(line, path, line_number))
    except DAMAGED_DATA_ERRORS as err:
        if not is_damaged_data(err):
            raise  # the system's error (permissions, disk), not damage
        raise DataFileError(
            path, f"is not a valid gzip file: damaged, truncated, or not gzip-compressed ({type(err).__name__}: {err})",
            "Write it again with gzip (e.g. gzip.open(path, 'wt', encoding='utf-8')), or copy it again.",
        ) from err
    return rows


def check_ids_everywhere_or_nowhere(ids: Sequence[int], path: Path) -> None:
    """Every line of a jsonl file has an ``"id"`` or none has: a line number standing in for a missing id (a
    :class:`LineId`) could equal a real id of another line, and the sort by id would then mix them up silently."""
    missing = [i for i in ids if isinstance(i, LineId)]
    if missing and len(missing) != len(ids):
        raise DataFileError(path, "has no \"id\" while other lines have one; give every line an id, or none (line "
                                  "order then stands in)", "Fix the file.", line=int(missing[0]))


class LineId(int):
    """A line number standing in for a missing id: an int, so rows sort as they would by it."""


def line_error(path: Path, line_number: int) -> Callable[[str], DataFileError]:
    """``bad(problem)``: the DataFileError for a problem on this line of this file."""
    return lambda problem: DataFileError(path, problem, "Fix or remove that line.", line=line_number)


def json_object(line: str, bad: Callable[[str], DataFileError], keys: tuple[str, ...]) -> dict:
    """The line's JSON object, which must have ``keys``."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise bad(f"is not valid JSON ({error}): {line[:80]!r}") from None
    if not isinstance(record, dict) or any(key not in record for key in keys):
        raise bad(f"expected a JSON object with {' and '.join(repr(k) for k in keys)}, got {line[:80]!r}")
    return record


def review_text(record: dict, bad: Callable[[str], DataFileError]) -> str:
    """The record's ``"text"``: a string of valid Unicode."""
    text = record["text"]
    if not isinstance(text, str):
        raise bad(f"text must be a string, got {type(text).__name__}")
    if surrogate := _SURROGATE.search(text):
        raise bad(
            f"text is not valid Unicode: lone surrogate {surrogate[0]!r} at index {surrogate.start()} "
            "(a \\ud800-\\udfff escape without its pair)"
        )
    return text


def review_id(record: dict, line_number: int, bad: Callable[[str], DataFileError]) -> int:
    """The record's ``"id"``, or without one its line number: line order stands in for it (the sort is stable).
    An id must be an int: ids of mixed types (3 and "7") cannot even be sorted."""
    value = record.get("id", LineId(line_number))
    if type(value) not in (int, LineId):
        raise bad(f"id must be an int, got {value!r}")
    return value
