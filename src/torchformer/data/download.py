"""Download a file safely: stream it, check its checksum, and only then put it in place.

A dataset cache must never hold a half-written or corrupt file: the next run would load it without complaint and
train on garbage. So :func:`download` streams into a temporary file in the destination's folder, checks the byte
count and the checksum(s) while the bytes pass, and only then renames it into place with :func:`os.replace`, atomic
on one file system; if anything goes wrong, the temporary file is deleted and nothing is left at the destination.
The temporary's name, ``.{name}.{host}-{pid}-{random}.part``, records who writes it, so that the next download
removes what a killed process (``kill -9``, a power cut) left behind and never a live download's
(``torchformer._files.remove_stale_part_files``). A file already at the destination is checked like a fresh
download before it is trusted. ``docs/data.md`` tells the whole story.

:class:`DataFileError` is the data package's one error for a file that is there but unusable (truncated, damaged,
not in the expected format). The cache lives in ``~/.cache/torchformer`` unless ``$TORCHFORMER_HOME`` names another
folder (:func:`default_root`).
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import http.client
import lzma
import os
import pathlib
import tarfile
import urllib.request
import warnings
import zipfile
import zlib
from typing import BinaryIO, Callable, Optional, Union

from torchformer._checks import check_bool, is_int
from torchformer._files import check_path, expected_digests, hash_file, part_file, remove_stale_part_files

PathLike = Union[str, "os.PathLike[str]"]

_CHUNK = 1 << 20  # 1 MiB: large enough to be fast, small enough to keep memory flat


class ChecksumError(ValueError):
    """A file's digest (or its size) is not the expected one.

    Each argument is kept as the attribute of the same name.

    Args:
        path: the file.
        algorithm: ``"sha256"``, ``"md5"`` or ``"size"``.
        expected: the expected digest (or size).
        received: the file's digest (or size).
        advice: what to do about it; the message ends with it.
    """

    def __init__(self, path: PathLike, algorithm: str, expected: str, received: str, advice: str = "") -> None:
        # Passing every field to the base class keeps the exception picklable.
        super().__init__(str(path), algorithm, expected, received, advice)
        self.path = str(path)
        self.algorithm = algorithm
        self.expected = expected
        self.received = received
        self.advice = advice or "Delete the file and download it again."

    def __str__(self) -> str:
        what = "size mismatch" if self.algorithm == "size" else f"{self.algorithm} checksum mismatch"
        return f"{what} for {self.path}: expected {self.expected}, got {self.received}. {self.advice}"


class DataNotFoundError(FileNotFoundError):
    """No copy of IMDb in the cache folder :func:`~torchformer.data.imdb` looked in, and no download asked for.

    The message reads ``"{problem}; {advice}"``, the advice in the words of the Python API (``path=``,
    ``download=True``); the parts are attributes, so a script can say ``problem`` with its own flags instead.

    Args:
        problem: what was looked for, where, and what is missing.
        advice: how to get the data.
    """

    def __init__(self, problem: str, advice: str) -> None:
        super().__init__(errno.ENOENT, f"{problem}; {advice}")  # errno and strerror, as any FileNotFoundError's
        self.problem, self.advice = problem, advice

    def __str__(self) -> str:
        return f"{self.problem}; {self.advice}"

    def __reduce__(self) -> tuple:  # pickles (across processes) with its parts, not OSError's (errno, strerror)
        return type(self), (self.problem, self.advice)


class DataFileError(ValueError):
    """A data file is there but unusable: truncated, damaged, or not in the expected format.

    The message reads ``"{path}[, line {line}]: {problem}. {advice}"``; the same parts are attributes. The
    low-level error (``EOFError``, ``zipfile.BadZipFile``, ``UnicodeDecodeError``, ...) is kept as ``__cause__``.

    Args:
        path: the file.
        problem: what is wrong with it.
        advice: what to do about it.
        line: the line of the file where the problem is, if there is one.
    """

    def __init__(self, path: PathLike, problem: str, advice: str = "", line: Optional[int] = None) -> None:
        super().__init__(str(path), problem, advice, line)  # every field, so that the exception pickles
        self.path = str(path)
        self.problem = problem
        self.advice = advice or "The file is damaged or not the expected one; download or copy it again."
        self.line = line

    def __str__(self) -> str:
        where = self.path if self.line is None else f"{self.path}, line {self.line}"
        return f"{where}: {self.problem}. {self.advice}"


# What decompressors raise when the bytes are damaged or cut short: a truncated stream ends early (EOFError); a
# changed byte breaks the compressed data (zlib.error, lzma.LZMAError, the bare OSError of bz2) or a checksum
# (BadGzipFile, BadZipFile, tarfile's ReadError).
DAMAGED_DATA_ERRORS = (EOFError, zlib.error, lzma.LZMAError, gzip.BadGzipFile, zipfile.BadZipFile, tarfile.TarError,
                       OSError)


def is_damaged_data(err: BaseException) -> bool:
    """Whether ``err``, raised while decompressing, means damaged bytes rather than a failing system.

    An OSError *with* an errno (permission denied, disk error) is the system's and must surface as it is; the
    decompressors' own OSErrors (BadGzipFile, bz2's "Invalid data stream") have none.

    Args:
        err: the exception caught while reading or decompressing a data file.

    Returns:
        True for one of :data:`DAMAGED_DATA_ERRORS` that carries no errno; False for a system error (to re-raise
        as it is) and for any other exception.
    """
    if isinstance(err, OSError) and err.errno is not None:
        return False
    return isinstance(err, DAMAGED_DATA_ERRORS)


def default_root() -> pathlib.Path:
    """The folder where datasets are cached: ``$TORCHFORMER_HOME`` or ``~/.cache/torchformer``.

    Returns:
        The folder, as a :class:`pathlib.Path` (it may not exist yet).
    """
    env = os.environ.get("TORCHFORMER_HOME")
    if env:
        return pathlib.Path(env).expanduser()
    return pathlib.Path.home() / ".cache" / "torchformer"


def file_digest(path: PathLike, algorithm: str = "sha256") -> str:
    """Hex digest of the file at ``path``, read in chunks so that large files need little memory.

    Args:
        path: the file.
        algorithm: any name :func:`hashlib.new` knows (``"sha256"``, ``"md5"``, ...).

    Returns:
        The hex digest, a ``str``.
    """
    try:
        h = hashlib.new(algorithm)
    except (ValueError, TypeError):
        raise ValueError(
            f"algorithm must be a hashlib algorithm name such as 'sha256' or 'md5', got {algorithm!r}"
        ) from None
    return hash_file(path, h)


def _check_size(size: Optional[int]) -> None:
    if size is not None and (not is_int(size) or size < 0):
        raise ValueError(f"size must be a byte count (an int >= 0) or None, got {size!r}")


def verify(path: PathLike, *, sha256: Optional[str] = None, md5: Optional[str] = None, size: Optional[int] = None,
           advice: str = "") -> None:
    """Raise :class:`ChecksumError` unless the file at ``path`` has the given size and digest(s).

    The size is checked first: it costs nothing, while a digest reads the whole file. With no ``size``, ``sha256``
    or ``md5`` there is nothing to check and the call does nothing.

    Args:
        path: the file.
        sha256: the expected SHA-256 hex digest, or ``None``.
        md5: the expected MD5 hex digest, or ``None``.
        size: the expected size in bytes, or ``None``.
        advice: replaces the error's default advice (say how *this* file is repaired).
    """
    expected = expected_digests(sha256, md5)
    _check_size(size)
    advice = advice or "The file is corrupt or not the expected one; delete it and download it again."
    if size is not None and (received_size := os.path.getsize(path)) != size:  # first: it costs nothing
        raise ChecksumError(path, "size", f"{size:,} bytes", f"{received_size:,} bytes", advice)
    for algorithm, value in expected.items():
        if (received := file_digest(path, algorithm)) != value:
            raise ChecksumError(path, algorithm, value, received, advice)


def _declared_size(response: object) -> Optional[int]:
    """The Content-Length the server announced, if any (HTTP responses and file:// URLs have one)."""
    headers = getattr(response, "headers", None)
    items = headers.items() if headers is not None else ()
    length = next((value for key, value in items if key.lower() == "content-length"), None)
    try:
        return int(length)  # None (no Content-Length) is a TypeError too
    except (TypeError, ValueError):
        return None


def download(url: str, dest: PathLike, *, sha256: Optional[str] = None, md5: Optional[str] = None,
             size: Optional[int] = None, opener: Optional[Callable[[str], BinaryIO]] = None,
             progress: bool = False) -> pathlib.Path:
    """Download ``url`` to ``dest`` atomically and check its size and checksum(s); return ``dest`` as a Path.

    Args:
        url: where to fetch the file (``http(s)://``, ``file://``, anything ``urllib`` opens).
        dest: the final file path. Its folder is created if needed.
        sha256: the expected SHA-256 hex digest.
        md5: the expected MD5 hex digest.
        size: the expected byte count, checked even when the server announces no Content-Length.
        opener: ``opener(url)`` returns a readable binary file-like object; the default is
            :func:`urllib.request.urlopen`. If the object has ``headers`` with a Content-Length,
            the byte count is checked against it.
        progress: show a progress bar if ``tqdm`` is installed.

    A file already at ``dest`` is verified like a download (``size``, ``sha256``, ``md5``) and returned without
    downloading if it passes; if it fails, a warning says so and it is downloaded again. With none of the three
    given, an existing ``dest`` is trusted. Leftover temporary files of earlier, killed downloads of ``dest`` are
    removed first (see ``torchformer._files.remove_stale_part_files``).

    Returns:
        ``dest``, as a :class:`pathlib.Path`.

    Raises:
        ChecksumError: the downloaded bytes do not have the expected size or digest.
        OSError: the transfer failed or was cut short.
    In both cases nothing is left at ``dest`` and no temporary file remains.
    """
    if not isinstance(url, str) or not url:
        raise TypeError(f"url must be a non-empty str, got {url!r}")
    dest = check_path(dest, "dest")
    expected = expected_digests(sha256, md5)
    _check_size(size)
    if opener is not None and not callable(opener):
        raise TypeError(f"opener must be a callable, got {type(opener).__name__}")
    check_bool(progress, "progress")
    manual = f"Retry, or download {url} yourself and pass the local file's path."

    if dest.is_dir():
        # Without this check a folder would pass as "already downloaded" when no digest is given.
        raise IsADirectoryError(f"dest {dest} is a folder; expected the path of a file (move the folder away)")
    if dest.parent.exists() and not dest.parent.is_dir():
        raise NotADirectoryError(f"{dest.parent} is a file, not a folder: cannot download {dest.name} into it")
    if dest.parent.is_dir():
        # Also when dest is already there: a killed concurrent download may have left its temporary beside it.
        remove_stale_part_files(dest)
    if dest.exists():
        try:
            verify(dest, size=size, **expected)
            return dest
        except ChecksumError as err:
            # A stale or corrupt file must not survive a failed re-download either.
            warnings.warn(f"{err} Downloading it again.", stacklevel=2)
            dest.unlink()

    dest.parent.mkdir(parents=True, exist_ok=True)
    # The temporary file lives next to dest so that os.replace is a rename, not a copy.
    fd, tmp = part_file(dest)
    received = 0
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                response = opener(url) if opener else urllib.request.urlopen(url, timeout=60)
            except Exception as err:
                raise OSError(f"could not open {url}: {err}. {manual}") from err
            if not callable(getattr(response, "read", None)):
                raise TypeError(
                    f"opener must return a binary file-like object (with a read method), "
                    f"got {type(response).__name__}"
                )
            try:
                declared = _declared_size(response)
                hashes = {algorithm: hashlib.new(algorithm) for algorithm in expected}
                bar = _progress_bar(declared, dest.name) if progress else None
                try:
                    while chunk := response.read(_CHUNK):
                        if not isinstance(chunk, (bytes, bytearray)):
                            raise TypeError(
                                f"the opener's file object: read() must return bytes, got {type(chunk).__name__} "
                                f"(open the URL in binary mode)"
                            )
                        out.write(chunk)
                        for h in hashes.values():
                            h.update(chunk)
                        received += len(chunk)
                        if bar is not None:
                            bar.update(len(chunk))
                finally:
                    if bar is not None:
                        bar.close()
            except (OSError, http.client.HTTPException) as err:
                # HTTPException covers IncompleteRead: the server closed the connection early.
                raise OSError(
                    f"download of {url} failed after {received:,} bytes: {err}. "
                    f"Nothing was saved at {dest}. {manual}"
                ) from err
            finally:
                close = getattr(response, "close", None)
                if close is not None:
                    close()
        if declared is not None and received != declared:
            what = "is incomplete" if received < declared else "does not match the announced size"
            raise OSError(
                f"download of {url} {what}: received {received:,} bytes, the server announced "
                f"{declared:,}. Nothing was saved at {dest}. {manual}"
            )
        problem = f"{dest} (downloaded from {url})"
        advice = f"The download is corrupt or the file changed on the server; nothing was saved. {manual}"
        if size is not None and received != size:
            raise ChecksumError(problem, "size", f"{size:,} bytes", f"{received:,} bytes", advice)
        for algorithm, value in expected.items():
            if (digest := hashes[algorithm].hexdigest()) != value:
                raise ChecksumError(problem, algorithm, value, digest, advice)
        os.replace(tmp, dest)
    except BaseException:
        # Also on KeyboardInterrupt: never leave a partial file behind.
        tmp.unlink(missing_ok=True)
        raise
    return dest


def _progress_bar(total: Optional[int], name: str):
    try:
        from tqdm.auto import tqdm
    except ImportError:  # progress bars are a nicety, not a dependency
        return None
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=name)
