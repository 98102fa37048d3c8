"""The file helpers that several modules share: checking a file path, writing a file atomically, temporary files,
SHA-256 digests.

A private module with public names: checkpoints, exports, logs, plots and downloads import from here, so that no
module reaches into another's private helpers, and this module imports nothing of torchformer (no cycle).

Telling the temporary file of a killed writer from one still being written: checkpoints
(:mod:`torchformer.train.checkpoint`) and downloads (:mod:`torchformer.data.download`) are written to a temporary
file that is renamed into place when complete. A process killed mid-write (``kill -9``, a power cut)
cannot clean up, so the temporary file's name records who writes it, host and process id, and the next writer
removes the leftovers that are surely dead, never a live writer's file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import socket
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

# A temporary file nobody has written to for this long is abandoned, whoever wrote it: the rule for files of other
# machines sharing the folder (whose process ids mean nothing here) and for files whose name records no writer.
STALE_AFTER_S = 24 * 3600


def host_tag() -> str:
    """This machine's name, reduced to letters, digits and "_" (so that "-" can separate the parts of a name)."""
    return re.sub(r"[^A-Za-z0-9]", "_", socket.gethostname())[:64] or "host"


def process_alive(pid: int) -> bool:
    """Whether a process with this id runs on this machine (True when that cannot be told)."""
    if pid == os.getpid():
        return True  # another thread of this very process may be writing
    if os.name == "nt":
        return True  # on Windows os.kill(pid, 0) would terminate the process: there, only the age rule applies
    try:
        os.kill(pid, 0)  # signal 0 checks that the process exists and sends nothing
    except (ProcessLookupError, OverflowError):  # no such process (a number too large cannot be one)
        return False
    except OSError:
        return True  # e.g. PermissionError: it exists, it belongs to another user
    return True


def is_stale(host: Optional[str], pid: Optional[int], mtime: float) -> bool:
    """Whether a temporary file written by ``pid`` on ``host`` (``None``: unknown), last modified at ``mtime``,
    is a dead writer's leftover: its process is gone from this machine, or nobody wrote to it for a day."""
    dead = host == host_tag() and pid is not None and not process_alive(pid)
    return dead or time.time() - mtime > STALE_AFTER_S


# The temporary files of downloads and extractions (torchformer.data): ".{dest.name}.{host}-{pid}-{random}.part".
# What sits between ".{dest.name}." and ".part": "host-pid-random" (this version) or mkstemp's 8 random
# characters alone (older versions, which did not record the writer).
_PART_MIDDLE = re.compile(r"(?:(?P<host>[A-Za-z0-9_]+)-(?P<pid>\d+)-)?[a-z0-9_]{8}")


def part_file(dest: Path) -> tuple[int, Path]:
    """Create ``.{dest.name}.{host}-{pid}-{8 random chars}.part`` next to ``dest``; return (fd, path)."""
    fd, name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.{host_tag()}-{os.getpid()}-", suffix=".part")
    return fd, Path(name)


def remove_stale_part_files(dest: Path) -> list[Path]:
    """Remove leftover temporary files of earlier downloads of ``dest``; return the removed paths.

    Only the stale ones (:func:`is_stale`). Temporaries of other files and files that do not follow the naming
    scheme are never touched. Removal is best effort: a file that cannot be removed is left alone, it never makes a
    download fail.
    """
    part = re.compile(re.escape(f".{dest.name}.") + _PART_MIDDLE.pattern + re.escape(".part"))
    removed = []
    try:
        entries = list(os.scandir(dest.parent))
    except OSError:
        return removed
    for entry in entries:
        match = part.fullmatch(entry.name)
        if match is None:
            continue
        try:
            mtime = entry.stat().st_mtime
        except OSError:
            continue  # its owner just renamed or removed it
        if is_stale(match["host"], match["pid"] and int(match["pid"]), mtime):
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
                removed.append(Path(entry.path))
    return removed


# ---------------------------------------------------------------------------------------------------------
# File paths


class IsAFolderError(IsADirectoryError, ValueError):
    """A folder given where a file path is expected.

    Both an ``IsADirectoryError`` (as ``open()`` would raise: what checkpoint code has always raised) and a
    ``ValueError`` (a wrong argument: what the loggers and plots have always raised), so every caller's ``except``
    still catches it.
    """


def check_path(value: object, name: str) -> Path:
    """``value`` as a ``Path``: a ``TypeError`` naming ``name`` unless it is a str or ``os.PathLike`` (bytes are
    refused), a ``ValueError`` for ``""`` (which ``Path`` would read as the current folder). ``~`` is not expanded."""
    if isinstance(value, bytes) or not isinstance(value, (str, os.PathLike)) or isinstance(os.fspath(value), bytes):
        raise TypeError(f"{name} must be a str or os.PathLike, got {type(value).__name__} {value!r:.60}")
    if os.fspath(value) == "":
        raise ValueError(f"{name} must not be empty, got {value!r} (write '.' to mean the current folder)")
    return Path(value)


def check_file_path(path: object, name: str = "path", *, example: str = "") -> Path:
    """``path`` as a ``Path`` naming a file that can be written; else an error naming ``name`` and what is wrong.

    Refused: a type other than str or os.PathLike (``TypeError``); ``""``, ``"."``, ``".."`` and a name ending in a
    slash, which ``Path`` would silently drop, making ``"runs/new/"`` a file named ``new`` (``ValueError``); an
    existing folder (:class:`IsAFolderError`); a path through an existing file (``NotADirectoryError``).
    ``example`` shows how to name a file in a folder, ``{folder}`` standing for it (e.g.
    ``"checkpoint_path({folder}, step)"``); the messages about folders end with it.
    """
    if not isinstance(path, (str, os.PathLike)) or not isinstance(os.fspath(path), str):  # bytes: Path refuses them
        raise TypeError(f"{name} must be a str or os.PathLike naming a file, got {type(path).__name__} {path!r}")
    text = os.fspath(path)
    if text.endswith(("/", os.sep)):
        raise ValueError(f"{name} must name a file, got the folder {text!r}; pass a file in it{_hint(example, text)}")
    if text == "":
        raise ValueError(f"{name} must name a file, got an empty path{_hint(example, None)}")
    file = Path(text)
    if text in (".", "..") or file.name in ("", ".", ".."):
        raise ValueError(f"{name} must name a file, got the folder {text!r}{_hint(example, text)}")
    if file.is_dir():
        raise IsAFolderError(f"{name} must name a file, got the existing folder {file}; pass a file in it"
                             f"{_hint(example, str(file))}")
    check_parents(file, name)
    return file


def _hint(example: str, folder: Optional[str]) -> str:
    """", e.g. <example>" with the folder filled in (``None``: the word "folder"), or "" without an example."""
    return f", e.g. {example.format(folder='folder' if folder is None else repr(folder))}" if example else ""


def check_parents(path: Path, name: str) -> None:
    """Raise ``NotADirectoryError`` when a folder on the way to ``path`` is an existing file."""
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise NotADirectoryError(f"{name} {path} cannot be created: {parent} is a file, not a folder")
            return


def read_json(file: Path) -> Any:
    """The JSON value in ``file``; a ``ValueError`` naming the file when it is not valid JSON (or not UTF-8)."""
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{file} is not valid JSON: {e}") from e


def check_png_path(path: object, name: str) -> Path:
    """A file path ending in ``.png``: matplotlib picks the format from the suffix and appends ``.png`` to a name
    without one, so the picture would not be at ``path``."""
    path = check_file_path(path, name)
    if path.suffix.lower() != ".png":
        raise ValueError(f"{name} must name a .png file, got {str(path)!r}")
    return path


# ---------------------------------------------------------------------------------------------------------
# Writing a file whole or not at all


def write_atomically(path: Path, write: Callable[[Path], Any]) -> Path:
    """Create or replace ``path`` with what ``write(temporary_path)`` writes: all of it, or nothing.

    The temporary file is in the same folder as ``path``, so ``os.replace`` is a rename within one file system, and
    therefore atomic. It is hidden (a leading dot), so checkpoint listings never see a half-written file, and its name
    records its writer (see the module docstring; :func:`~torchformer.train.checkpoint.remove_stale_temporaries`).

    Args:
        path: the file to create or replace; missing parent folders are created.
        write: called once with the temporary path; it must create that file and write all of it.

    Returns:
        ``path``.

    Raises:
        OSError: the file system failed (a full disk, no permission): the message names ``path``, the ``errno``
            is the file system's (so a full disk is ``errno.ENOSPC``); ``path`` is then as it was.
        Exception: whatever else ``write`` raises, after the temporary file is deleted; ``path`` is then as it was.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{host_tag()}-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())  # the data must be on disk before the rename makes it visible
        os.replace(tmp, path)
    except OSError as e:  # a full disk, no permission, a name too long: name the file, not its temporary
        tmp.unlink(missing_ok=True)
        if e.errno is None:  # not the file system's (e.g. a compressor's): as it is
            raise
        raise OSError(e.errno, f"{e.strerror}; cannot write the file, which is as it was", str(path)) from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)
    return path


def _fsync_directory(directory: Path) -> None:
    # Make the rename itself durable (POSIX). Windows cannot open folders; there the rename is already durable.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------------------
# Digests

_CHUNK = 1 << 20  # 1 MiB: large enough to be fast, small enough to keep memory flat


def hash_file(path: str | os.PathLike, h: Any) -> str:
    """The hex digest of the file at ``path`` by the hashlib object ``h``, read in chunks (little memory)."""
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 hex digest of the file at ``path``."""
    return hash_file(path, hashlib.sha256())


def expected_digests(sha256: Optional[str], md5: Optional[str]) -> dict[str, str]:
    """Validate the expected digests and return them as {algorithm: lowercase hex}."""
    expected = {}
    for algorithm, value, length in (("sha256", sha256, 64), ("md5", md5, 32)):
        if value is None:
            continue
        if not isinstance(value, str):
            raise TypeError(f"{algorithm} must be a hex string or None, got {type(value).__name__}")
        value = value.strip().lower()
        if len(value) != length or any(c not in "0123456789abcdef" for c in value):
            raise ValueError(f"{algorithm} must be {length} hex digits, got {value!r}")
        expected[algorithm] = value
    return expected
