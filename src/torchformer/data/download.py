"""Download a file safely: stream it, check its checksum, and only then put it in place.

A dataset cache must never hold a half-written or corrupt file: the next run would load it
without complaint and train on garbage. So :func:`download` writes to a temporary file in the
destination's folder, checks the byte count and the checksum while the bytes stream past, and
only then renames the temporary file to its final name with :func:`os.replace`, which is atomic
on the same file system. If anything goes wrong, the temporary file is deleted and nothing is
left at the destination.

The cache lives in ``~/.cache/torchformer`` unless the ``TORCHFORMER_HOME`` environment variable
names another folder (see :func:`default_root`).
"""

from __future__ import annotations

import hashlib
import http.client
import os
import pathlib
import tempfile
import urllib.request
import warnings
from typing import BinaryIO, Callable, Optional, Union

PathLike = Union[str, "os.PathLike[str]"]

_CHUNK = 1 << 20  # 1 MiB: large enough to be fast, small enough to keep memory flat
_HEX_LENGTHS = {"sha256": 64, "md5": 32}


class ChecksumError(ValueError):
    """A file's digest is not the expected one.

    Attributes ``path``, ``algorithm``, ``expected``, ``received`` and ``advice`` hold the details.
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
        return (
            f"{self.algorithm} checksum mismatch for {self.path}: expected {self.expected}, "
            f"got {self.received}. {self.advice}"
        )


def default_root() -> pathlib.Path:
    """The folder where datasets are cached: ``$TORCHFORMER_HOME`` or ``~/.cache/torchformer``."""
    env = os.environ.get("TORCHFORMER_HOME")
    if env:
        return pathlib.Path(env).expanduser()
    return pathlib.Path.home() / ".cache" / "torchformer"


def _new_hash(algorithm: str):
    try:
        return hashlib.new(algorithm)
    except (ValueError, TypeError):
        raise ValueError(
            f"algorithm must be a hashlib algorithm name such as 'sha256' or 'md5', got {algorithm!r}"
        ) from None


def file_digest(path: PathLike, algorithm: str = "sha256") -> str:
    """Hex digest of the file at ``path``, read in chunks so that large files need little memory."""
    h = _new_hash(algorithm)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _expected_digests(sha256: Optional[str], md5: Optional[str]) -> dict[str, str]:
    """Validate the expected digests and return them as {algorithm: lowercase hex}."""
    expected = {}
    for algorithm, value in (("sha256", sha256), ("md5", md5)):
        if value is None:
            continue
        if not isinstance(value, str):
            raise TypeError(f"{algorithm} must be a hex string or None, got {type(value).__name__}")
        value = value.strip().lower()
        length = _HEX_LENGTHS[algorithm]
        if len(value) != length or any(c not in "0123456789abcdef" for c in value):
            raise ValueError(f"{algorithm} must be {length} hex digits, got {value!r}")
        expected[algorithm] = value
    return expected


def verify(path: PathLike, *, sha256: Optional[str] = None, md5: Optional[str] = None) -> None:
    """Raise :class:`ChecksumError` unless the file at ``path`` has the given digest(s).

    With neither ``sha256`` nor ``md5`` there is nothing to check and the call does nothing.
    """
    for algorithm, value in _expected_digests(sha256, md5).items():
        received = file_digest(path, algorithm)
        if received != value:
            raise ChecksumError(
                path, algorithm, value, received,
                "The file is corrupt or not the expected one; delete it and download it again.",
            )


def _default_opener(url: str) -> BinaryIO:
    return urllib.request.urlopen(url, timeout=60)


def _declared_size(response: object) -> Optional[int]:
    """The Content-Length the server announced, if any (HTTP responses and file:// URLs have one)."""
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    for key, value in headers.items():
        if key.lower() == "content-length":
            try:
                return int(value)
            except (TypeError, ValueError):
                return None
    return None


def download(
    url: str,
    dest: PathLike,
    *,
    sha256: Optional[str] = None,
    md5: Optional[str] = None,
    opener: Optional[Callable[[str], BinaryIO]] = None,
    progress: bool = False,
) -> pathlib.Path:
    """Download ``url`` to ``dest`` atomically and check its checksum(s); return ``dest`` as a Path.

    Args:
        url: where to fetch the file (``http(s)://``, ``file://``, anything ``urllib`` opens).
        dest: the final file path. Its folder is created if needed.
        sha256, md5: expected hex digests. When ``dest`` already exists and matches them, it is
            returned without downloading; with no digest given an existing ``dest`` is trusted.
        opener: ``opener(url)`` returns a readable binary file-like object; the default is
            :func:`urllib.request.urlopen`. If the object has ``headers`` with a Content-Length,
            the byte count is checked against it.
        progress: show a progress bar if ``tqdm`` is installed.

    Raises:
        ChecksumError: the downloaded bytes do not have the expected digest.
        OSError: the transfer failed or was cut short.
    In both cases nothing is left at ``dest`` and no temporary file remains.
    """
    if not isinstance(url, str) or not url:
        raise TypeError(f"url must be a non-empty str, got {url!r}")
    expected = _expected_digests(sha256, md5)
    dest = pathlib.Path(dest)
    manual = f"Retry, or download {url} yourself and pass the local file's path."

    if dest.exists():
        try:
            verify(dest, **expected)
            return dest
        except ChecksumError as err:
            # A stale or corrupt file must not survive a failed re-download either.
            warnings.warn(f"{err} Downloading it again.", stacklevel=2)
            dest.unlink()

    dest.parent.mkdir(parents=True, exist_ok=True)
    # The temporary file lives next to dest so that os.replace is a rename, not a copy.
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    tmp = pathlib.Path(tmp_name)
    received = 0
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                response = (opener or _default_opener)(url)
            except Exception as err:
                raise OSError(f"could not open {url}: {err}. {manual}") from err
            try:
                declared = _declared_size(response)
                hashes = {algorithm: hashlib.new(algorithm) for algorithm in expected}
                bar = _progress_bar(declared, dest.name) if progress else None
                try:
                    while chunk := response.read(_CHUNK):
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
            raise OSError(
                f"download of {url} is incomplete: received {received:,} bytes, the server announced "
                f"{declared:,}. Nothing was saved at {dest}. {manual}"
            )
        for algorithm, value in expected.items():
            digest = hashes[algorithm].hexdigest()
            if digest != value:
                raise ChecksumError(
                    f"{dest} (downloaded from {url})", algorithm, value, digest,
                    f"The download is corrupt or the file changed on the server; nothing was saved. {manual}",
                )
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
