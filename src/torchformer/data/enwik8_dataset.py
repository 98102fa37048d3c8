"""enwik8: the first 100 million bytes of English Wikipedia, for byte-level language modelling.

enwik8 (from the Hutter Prize, http://mattmahoney.net/dc/textdata.html) is raw XML with wiki markup, modelled one byte
at a time: the vocabulary is the 256 byte values, so there is no tokenizer. The standard protocol splits it into the
first 90M bytes for training and the next 5M + 5M for validation and test, and reports bits per byte on the test split.

:func:`enwik8` reads the file (raw, ``.gz``, or the official ``enwik8.zip``) into three ``uint8``
tensors. Any other byte file works too (it is split 90/5/5 percent, with a warning that it is
not enwik8), so the same script can train on any text. :func:`random_batches` samples training
windows, and :func:`enwik8_sample` gives a 300 KB piece of real enwik8 that ships with the package.

Files are checked, not trusted. A damaged gzip or zip raises :class:`~torchformer.data.download.DataFileError`
naming the file. The copy in the cache folder (``path=None``) must be the official file: its size and md5 are
checked on every load (reading 100 MB costs far more than hashing it), and a bad copy is an error that says how to
repair it, or, with ``download=True``, is replaced by a fresh download.
"""

from __future__ import annotations

import gzip
import hashlib
import math
import os
import pathlib
import warnings
import zipfile
from typing import BinaryIO, Callable, Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor

from torchformer._checks import check_bool, check_positive_int, is_real
from torchformer._files import check_path, expected_digests, part_file, remove_stale_part_files

from torchformer.data.download import (
    DAMAGED_DATA_ERRORS,
    ChecksumError,
    DataFileError,
    PathLike,
    default_root,
    is_damaged_data,
)
from torchformer.data.download import download as _download

ENWIK8_URL = "http://mattmahoney.net/dc/enwik8.zip"
ENWIK8_MD5 = "a1fa5ffddb56f4953e226637dabbb36a"  # md5 of the raw 100,000,000-byte file
ENWIK8_SIZE = 100_000_000
ENWIK8_SPLITS = (90_000_000, 5_000_000, 5_000_000)

_GZIP_MAGIC = b"\x1f\x8b"
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")  # a zip starts with its first member, or, if empty, its end record
# Besides damaged bytes (DAMAGED_DATA_ERRORS), a zip may use a compression method Python lacks
# (NotImplementedError) or be encrypted (RuntimeError): unusable as well.
_ZIP_ERRORS = (*DAMAGED_DATA_ERRORS, NotImplementedError, RuntimeError)


def sample_path() -> pathlib.Path:
    """Path of the bundled sample: the first 299,994 bytes of enwik8, gzipped (see SAMPLE_LICENSE.md).

    Returns:
        The path of the bundled ``sample_enwik8.gz``.
    """
    return pathlib.Path(__file__).with_name("sample_enwik8.gz")


def _zip_member(archive: zipfile.ZipFile, path: PathLike) -> zipfile.ZipInfo:
    files = [info for info in archive.infolist() if not info.is_dir()]
    for info in files:
        if pathlib.PurePosixPath(info.filename).name == "enwik8":
            return info
    if len(files) == 1:
        return files[0]
    raise DataFileError(
        path,
        f"is a zip archive, but not the expected one: it should hold a member named 'enwik8' or exactly one "
        f"file, and it holds {[info.filename for info in files]}",
        "Pass the raw file, or a zip with that one member.",
    )


def load_text_bytes(path: PathLike) -> Tensor:
    """Read every byte of a file into a 1-D ``torch.uint8`` tensor.

    Gzip and zip files are recognised by their first bytes (not their names) and decompressed; a zip must hold a
    member named ``enwik8`` or a single file. A damaged or truncated one is a
    :class:`~torchformer.data.download.DataFileError`, and so is a file named ``.gz`` or ``.zip`` that is not one (an
    error page saved under the archive's name would otherwise be read as text).

    Args:
        path: the file (plain, gzip or zip).

    Returns:
        A 1-D ``torch.uint8`` tensor of the (decompressed) bytes.
    """
    path = check_path(path, "path")
    if path.is_dir():
        raise IsADirectoryError(f"path {path} is a folder; expected a file (raw bytes, .gz or .zip)")
    if not path.exists():
        raise FileNotFoundError(f"path {path}: no such file")
    if not path.is_file():
        # A pipe or a device would be read forever (or block): refuse what is not a plain file.
        raise ValueError(f"path {path} is not a regular file (a pipe, socket or device?); expected a file")
    with open(path, "rb") as f:
        head = f.read(16)  # 4 bytes tell the format; 16 make a readable error message
    is_gzip, is_zip = head.startswith(_GZIP_MAGIC), head.startswith(_ZIP_MAGICS)
    for suffix, kind, matches in ((".gz", "gzip", is_gzip), (".zip", "zip", is_zip)):
        if path.suffix.lower() == suffix and not matches:
            raise DataFileError(
                path, f"is named like a {kind} file but is not one (it starts with {head!r})",
                "It may be an error page or a damaged download; download or copy it again.",
            )
    if is_gzip:
        try:
            with gzip.open(path, "rb") as f:
                raw = f.read()  # reading to the end also checks the CRC at the end of the stream
        except DAMAGED_DATA_ERRORS as err:
            if not is_damaged_data(err):
                raise  # the system's error (permissions, disk), not damage
            raise DataFileError(path, f"is a damaged or truncated gzip file ({type(err).__name__}: {err})") from err
    elif is_zip:
        try:
            with zipfile.ZipFile(path) as archive:
                raw = archive.read(_zip_member(archive, path))  # checks the member's CRC
        except _ZIP_ERRORS as err:
            if isinstance(err, OSError) and not is_damaged_data(err):
                raise  # the system's error (permissions, disk), not damage
            raise DataFileError(path, f"is a damaged or truncated zip archive ({type(err).__name__}: {err})") from err
    else:
        # A plain file goes straight into a writable numpy array, with no intermediate copy.
        return torch.from_numpy(np.fromfile(path, dtype=np.uint8))
    # bytes are immutable and torch wants writable memory, hence the one copy.
    return torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).copy())


def _check_splits(splits: object) -> tuple:
    """Validate ``splits`` before any file is read: three finite, non-negative numbers with a positive sum."""
    # numbers.Real also admits numpy's numbers; bool is a number to Python but surely a mistake here.
    if (isinstance(splits, (str, bytes)) or not isinstance(splits, (Sequence, np.ndarray)) or len(splits) != 3
            or any(not is_real(s) for s in splits)):
        raise ValueError(f"splits must be three numbers (train, val, test), got {splits!r}")
    if not all(math.isfinite(s) for s in splits):
        raise ValueError(f"splits must be finite numbers, got {tuple(splits)!r}")
    if any(s < 0 for s in splits) or sum(splits) <= 0:
        raise ValueError(f"splits must be non-negative with a positive sum, got {tuple(splits)!r}")
    if not math.isfinite(sum(splits)):  # each finite, the sum not: (1e308,) * 3 would make the proportions NaN
        raise ValueError(f"splits must have a finite sum, got {tuple(splits)!r}")
    return tuple(splits)


def _split(data: Tensor, splits: Sequence[float], source: object) -> tuple[Tensor, Tensor, Tensor]:
    """Cut ``data`` (read from ``source``) into three consecutive pieces sized by ``splits`` (see :func:`enwik8`)."""
    splits = _check_splits(splits)
    n = len(data)
    total = sum(splits)
    if total == n and all(float(s).is_integer() for s in splits):
        sizes = [int(s) for s in splits]
    else:
        val = int(n * splits[1] / total)
        test = int(n * splits[2] / total)
        sizes = [n - val - test, val, test]
    for name, requested, size in zip(("train", "val", "test"), splits, sizes):
        if requested > 0 and size == 0:
            raise ValueError(
                f"{source} holds {n:,} bytes: too few for splits={splits}, the {name} split would be empty"
            )
    return torch.split(data, sizes)


def _md5(data: Tensor) -> str:
    return hashlib.md5(data.contiguous().numpy()).hexdigest()


def _fetch(url: str, root: pathlib.Path, *, md5: Optional[str], expected_size: int, opener,
           progress: bool) -> pathlib.Path:
    """Download the enwik8 zip into ``root`` and extract the raw file, leaving only ``root/enwik8``."""
    archive_path = root / "enwik8.zip"
    dest = root / "enwik8"
    # We only get here when the cache holds no usable copy, so a zip still here is unverified; and download()
    # would trust it, since the zip's own checksum is not published. Start from a fresh download.
    archive_path.unlink(missing_ok=True)
    _download(url, archive_path, opener=opener, progress=progress)
    remove_stale_part_files(dest)  # an extraction killed half-way leaves one
    fd, tmp = part_file(dest)
    advice = "Nothing was kept. Retry, or download it yourself and pass its path."
    try:
        h, size = hashlib.md5(), 0
        with os.fdopen(fd, "wb") as out:
            try:
                with zipfile.ZipFile(archive_path) as archive:
                    with archive.open(_zip_member(archive, archive_path)) as member:
                        while chunk := member.read(1 << 20):  # reading to the end also checks the CRC
                            out.write(chunk)
                            h.update(chunk)
                            size += len(chunk)
            except (*_ZIP_ERRORS, DataFileError) as err:
                if isinstance(err, OSError) and not is_damaged_data(err):
                    raise  # the system's error (permissions, disk full), not damage
                detail = err.problem if isinstance(err, DataFileError) else f"{type(err).__name__}: {err}"
                raise DataFileError(
                    f"{archive_path} (downloaded from {url})", f"is not a valid zip archive of enwik8 ({detail})",
                    advice,
                ) from err
        # The zip's own checksum is not published, so the extracted file's size and md5 are what we check.
        if size != expected_size:
            raise ChecksumError(
                f"enwik8 extracted from {url}", "size", f"{expected_size:,} bytes", f"{size:,} bytes", advice
            )
        if md5 is not None and h.hexdigest() != md5:
            raise ChecksumError(f"enwik8 extracted from {url}", "md5", md5, h.hexdigest(), advice)
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        # The raw file is all we need; the zip would only double the cache's size.
        archive_path.unlink(missing_ok=True)
    return dest


def _load_cached(path: pathlib.Path, *, expected_size: int, md5: Optional[str], repair: str) -> Tensor:
    """Read the cached copy at ``path``; raise DataFileError or ChecksumError unless it is the official file."""
    try:
        data = load_text_bytes(path)
    except DataFileError as err:
        raise DataFileError(path, err.problem, repair) from err
    not_official = f"The cached copy is damaged, truncated or not enwik8. {repair}"
    if len(data) != expected_size:
        raise ChecksumError(path, "size", f"{expected_size:,} bytes", f"{len(data):,} bytes", not_official)
    if md5 is not None and (received := _md5(data)) != md5:
        raise ChecksumError(path, "md5", md5, received, not_official)
    return data


def _from_cache(root: pathlib.Path, *, download: bool, expected_size: int, md5: Optional[str], url: str, opener,
                progress: bool) -> tuple[Tensor, pathlib.Path]:
    """The verified enwik8 in ``root`` and its path; a bad copy is an error, or replaced when ``download``."""
    if root.exists() and not root.is_dir():
        raise NotADirectoryError(f"root {root} is a file, not a folder; pass the folder that caches enwik8")
    repair = f"Delete it, or call enwik8(download=True, root={str(root)!r}) to replace it with a fresh download."
    if root.is_dir():
        remove_stale_part_files(root / "enwik8")  # what a killed extraction left behind
    for candidate in (root / "enwik8", root / "enwik8.zip"):
        if candidate.is_dir():
            # Never deleted: a folder is the user's, not something this loader wrote.
            raise IsADirectoryError(
                f"{candidate} is a folder, where the enwik8 cache keeps a file; move it away or pass another root="
            )
        if not candidate.exists():
            continue
        try:
            return _load_cached(candidate, expected_size=expected_size, md5=md5, repair=repair), candidate
        except (DataFileError, ChecksumError) as err:
            if not download:
                raise
            reason = err.problem if isinstance(err, DataFileError) else (
                f"{err.algorithm} mismatch: expected {err.expected}, got {err.received}")
            warnings.warn(f"{candidate} is not a usable copy of enwik8 ({reason}). Downloading it again.", stacklevel=3)
            candidate.unlink()
    if not download:
        raise FileNotFoundError(
            f"enwik8 not found in {root} (looked for 'enwik8' and 'enwik8.zip'). Pass path= to a local "
            f"copy, call enwik8(download=True) to fetch {url}, or use enwik8_sample() for a small bundled piece."
        )
    root.mkdir(parents=True, exist_ok=True)
    dest = _fetch(url, root, md5=md5, expected_size=expected_size, opener=opener, progress=progress)
    return load_text_bytes(dest), dest


def enwik8(path: Optional[PathLike] = None, *, download: bool = False, root: Optional[PathLike] = None,
           splits: Sequence[float] = ENWIK8_SPLITS, expected_size: int = ENWIK8_SIZE, md5: Optional[str] = ENWIK8_MD5,
           url: str = ENWIK8_URL, opener: Optional[Callable[[str], BinaryIO]] = None,
           progress: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """Load enwik8 (or any byte file) as ``(train, val, test)``, three 1-D ``torch.uint8`` tensors.

    Args:
        path: a raw byte file, a ``.gz``, or a zip holding ``enwik8``. With ``None``, use the copy
            (``enwik8`` or ``enwik8.zip``) in ``root``, which must be the official file.
        download: with ``path=None``, download ``url`` into ``root`` when it holds no copy, or a
            damaged or wrong one (which is replaced).
        root: the cache folder; default :func:`~torchformer.data.download.default_root`.
        splits: sizes of train/val/test. They are byte counts when they are whole numbers adding up
            to the file's length and relative sizes otherwise, so the default is the standard
            90M/5M/5M on enwik8 and 90/5/5 percent on any other file.
        expected_size: with ``md5``, how the official file is recognised. A ``path`` of ``expected_size``
            bytes must have this md5 (else :class:`ChecksumError`). A ``path`` of any other size is loaded
            with a warning that it is not enwik8. The cached copy must have both.
        md5: the official file's MD5 hex digest; ``md5=None`` skips the check.
        url: passed to :func:`~torchformer.data.download.download`.
        opener: passed to :func:`~torchformer.data.download.download`.
        progress: passed to :func:`~torchformer.data.download.download`.

    Returns:
        ``(train, val, test)``, 1-D ``torch.uint8`` tensors of bytes.

    Raises:
        DataFileError: the file is a damaged or truncated gzip/zip (the message names it).
        ChecksumError: the file is not the official one where it must be (see ``expected_size``).
        FileNotFoundError: ``path`` does not exist, or the cache holds nothing and ``download`` is False.
    """
    check_bool(download, "download")
    check_bool(progress, "progress")
    check_positive_int(expected_size, "expected_size")
    md5 = expected_digests(None, md5).get("md5")  # validated and lower-cased, or None
    _check_splits(splits)  # before reading 100 MB, not after
    if path is None:
        root = check_path(root, "root") if root is not None else default_root()
        data, path = _from_cache(
            root, download=download, expected_size=expected_size, md5=md5, url=url, opener=opener, progress=progress
        )
        return _split(data, splits, path)

    if download:
        raise ValueError("download=True only applies with path=None (it downloads into root)")
    path = check_path(path, "path")
    data = load_text_bytes(path)
    if len(data) != expected_size:
        warnings.warn(
            f"{path} holds {len(data):,} bytes, not the {expected_size:,} of the official enwik8; "
            f"splitting it {_describe(splits)}. Results on it are not comparable to enwik8 results.",
            stacklevel=2,
        )
    elif md5 is not None and (received := _md5(data)) != md5:
        raise ChecksumError(
            path, "md5", md5, received,
            f"A file of exactly {expected_size:,} bytes should be the official enwik8, but it is "
            f"corrupt or a different file; download it again from {url}.",
        )
    return _split(data, splits, path)


def _describe(splits: Sequence[float]) -> str:
    total = sum(splits)  # positive: the splits were checked first
    return "/".join(f"{100 * s / total:g}" for s in splits) + " percent"


def enwik8_sample(*, splits: Sequence[float] = (90, 5, 5)) -> tuple[Tensor, Tensor, Tensor]:
    """The bundled 299,994-byte start of enwik8, split 90/5/5 percent (by default) into uint8 tensors.

    Good for smoke tests and demos on any machine; far too small for results worth reporting.

    Args:
        splits: relative sizes of train, validation and test.

    Returns:
        ``(train, val, test)``, 1-D ``torch.uint8`` tensors of bytes.
    """
    return _split(load_text_bytes(sample_path()), splits, sample_path())


def random_batches(data: Tensor, *, context: int, batch_size: int, generator: Optional[torch.Generator] = None,
                   device: Optional[Union[str, torch.device]] = None) -> tuple[Tensor, Tensor]:
    """Sample ``batch_size`` random windows of ``data`` for next-byte prediction.

    ``targets[i, j] = data[start_i + j + 1]``: each target is the byte that follows the corresponding input. Start
    positions are uniform over every window that fits.

    Args:
        data: a 1-D tensor of bytes (or token ids).
        context: the window length ``t``.
        batch_size: the number of windows ``b``.
        generator: makes the start positions reproducible.
        device: where the batches go (default: ``data``'s device).

    Returns:
        ``(inputs, targets)``, both ``(b, t)`` int64.
    """
    if not isinstance(data, Tensor):
        raise TypeError(f"data must be a 1-D torch.Tensor, got {type(data).__name__}")
    if data.dim() != 1:
        raise ValueError(f"data must be a 1-D tensor, got shape {tuple(data.shape)}")
    if data.is_floating_point() or data.is_complex() or data.dtype == torch.bool:
        raise TypeError(f"data must hold integer token ids, got dtype {data.dtype}")
    check_positive_int(context, "context")
    check_positive_int(batch_size, "batch_size")
    if context >= len(data):
        raise ValueError(
            f"context must be smaller than len(data) (a window needs context + 1 bytes), "
            f"got context={context} for {len(data)} bytes"
        )
    gen_device = generator.device if generator is not None else torch.device("cpu")
    # Every start in [0, len - context - 1] leaves room for the shifted-by-one targets.
    starts = torch.randint(0, len(data) - context, (batch_size,), generator=generator, device=gen_device)
    # One gather builds all windows: row i holds data[starts[i] : starts[i] + context + 1].
    index = starts.to(data.device)[:, None] + torch.arange(context + 1, device=data.device)
    windows = data[index].to(device=device if device is not None else data.device, dtype=torch.long)
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()
