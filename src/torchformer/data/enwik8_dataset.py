"""enwik8: the first 100 million bytes of English Wikipedia, for byte-level language modelling.

enwik8 (from the Hutter Prize, http://mattmahoney.net/dc/textdata.html) is raw XML with wiki
markup, modelled one byte at a time: the vocabulary is the 256 byte values, so there is no
tokenizer. The standard protocol splits it into the first 90M bytes for training and the next
5M + 5M for validation and test, and reports bits per byte on the test split.

:func:`enwik8` reads the file (raw, ``.gz``, or the official ``enwik8.zip``) into three ``uint8``
tensors. Any other byte file works too (it is split 90/5/5 percent, with a warning that it is
not enwik8), so the same script can train on any text. :func:`random_batches` samples training
windows, and :func:`enwik8_sample` gives a 300 KB piece of real enwik8 that ships with the package.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import pathlib
import tempfile
import warnings
import zipfile
from typing import BinaryIO, Callable, Optional, Sequence, Union

import numpy as np
import torch
from torch import Tensor

from torchformer._checks import check_positive_int

from torchformer.data.download import ChecksumError, default_root
from torchformer.data.download import download as _download

PathLike = Union[str, "os.PathLike[str]"]

ENWIK8_URL = "http://mattmahoney.net/dc/enwik8.zip"
ENWIK8_MD5 = "a1fa5ffddb56f4953e226637dabbb36a"  # md5 of the raw 100,000,000-byte file
ENWIK8_SIZE = 100_000_000
ENWIK8_SPLITS = (90_000_000, 5_000_000, 5_000_000)

_GZIP_MAGIC = b"\x1f\x8b"
_ZIP_MAGIC = b"PK\x03\x04"


def sample_path() -> pathlib.Path:
    """Path of the bundled sample: the first 299,994 bytes of enwik8, gzipped (see SAMPLE_LICENSE.md)."""
    return pathlib.Path(__file__).with_name("sample_enwik8.gz")


def _zip_member(archive: zipfile.ZipFile, path: PathLike) -> zipfile.ZipInfo:
    files = [info for info in archive.infolist() if not info.is_dir()]
    for info in files:
        if pathlib.PurePosixPath(info.filename).name == "enwik8":
            return info
    if len(files) == 1:
        return files[0]
    raise ValueError(
        f"{path} is a zip archive; expected a member named 'enwik8' or exactly one file, "
        f"got {[info.filename for info in files]}"
    )


def load_text_bytes(path: PathLike) -> Tensor:
    """Read every byte of a file into a 1-D ``torch.uint8`` tensor.

    Gzip and zip files are recognised by their first bytes (not their names) and decompressed;
    a zip must hold a member named ``enwik8`` or a single file.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"path does not name a file: {path}")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic.startswith(_GZIP_MAGIC):
        with gzip.open(path, "rb") as f:
            raw = f.read()
    elif magic == _ZIP_MAGIC:
        with zipfile.ZipFile(path) as archive:
            raw = archive.read(_zip_member(archive, path))
    else:
        # A plain file goes straight into a writable numpy array, with no intermediate copy.
        return torch.from_numpy(np.fromfile(path, dtype=np.uint8))
    # bytes are immutable and torch wants writable memory, hence the one copy.
    return torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).copy())


def _split(data: Tensor, splits: Sequence[float]) -> tuple[Tensor, Tensor, Tensor]:
    """Cut ``data`` into three consecutive pieces sized by ``splits``.

    If ``splits`` sums to ``len(data)`` the numbers are byte counts; otherwise they are relative
    sizes (so (90M, 5M, 5M) means 90/5/5 percent of a file of another length).
    """
    if len(splits) != 3 or any(isinstance(s, bool) or not isinstance(s, (int, float)) for s in splits):
        raise ValueError(f"splits must be three numbers (train, val, test), got {splits!r}")
    if any(s < 0 for s in splits) or sum(splits) <= 0:
        raise ValueError(f"splits must be non-negative with a positive sum, got {splits!r}")
    n = len(data)
    total = sum(splits)
    if total == n:
        sizes = [int(s) for s in splits]
    else:
        val = int(n * splits[1] / total)
        test = int(n * splits[2] / total)
        sizes = [n - val - test, val, test]
    for name, requested, size in zip(("train", "val", "test"), splits, sizes):
        if requested > 0 and size == 0:
            raise ValueError(f"{n:,} bytes are too few for splits={tuple(splits)}: the {name} split would be empty")
    train, val, test = torch.split(data, sizes)
    return train, val, test


def _md5(data: Tensor) -> str:
    return hashlib.md5(data.contiguous().numpy()).hexdigest()


def _fetch(url: str, root: pathlib.Path, *, md5: Optional[str], opener, progress: bool) -> pathlib.Path:
    """Download the enwik8 zip into ``root`` and extract the raw file, leaving only ``root/enwik8``."""
    archive_path = root / "enwik8.zip"
    dest = root / "enwik8"
    # The zip's own checksum is not published, so the md5 of the extracted file is what we check.
    _download(url, archive_path, opener=opener, progress=progress)
    fd, tmp_name = tempfile.mkstemp(dir=root, prefix=".enwik8.", suffix=".part")
    tmp = pathlib.Path(tmp_name)
    try:
        h = hashlib.md5()
        try:
            with zipfile.ZipFile(archive_path) as archive, os.fdopen(fd, "wb") as out:
                with archive.open(_zip_member(archive, archive_path)) as member:
                    while chunk := member.read(1 << 20):
                        out.write(chunk)
                        h.update(chunk)
        except zipfile.BadZipFile as err:
            raise zipfile.BadZipFile(
                f"the file downloaded from {url} is not a valid zip archive ({err}); nothing was kept. "
                f"Retry, or download it yourself and pass its path."
            ) from err
        if md5 is not None and h.hexdigest() != md5.lower():
            raise ChecksumError(
                f"enwik8 extracted from {url}", "md5", md5.lower(), h.hexdigest(),
                "The download is corrupt; nothing was kept. Retry, or download it yourself and pass its path.",
            )
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        # The raw file is all we need; the zip would only double the cache's size.
        archive_path.unlink(missing_ok=True)
    return dest


def enwik8(
    path: Optional[PathLike] = None,
    *,
    download: bool = False,
    root: Optional[PathLike] = None,
    splits: Sequence[float] = ENWIK8_SPLITS,
    expected_size: int = ENWIK8_SIZE,
    md5: Optional[str] = ENWIK8_MD5,
    url: str = ENWIK8_URL,
    opener: Optional[Callable[[str], BinaryIO]] = None,
    progress: bool = True,
) -> tuple[Tensor, Tensor, Tensor]:
    """Load enwik8 (or any byte file) as ``(train, val, test)``, three 1-D ``torch.uint8`` tensors.

    Args:
        path: a raw byte file, a ``.gz``, or a zip holding ``enwik8``. With ``None``, look for
            ``enwik8`` or ``enwik8.zip`` in ``root``.
        download: when ``path`` is None and ``root`` holds no copy, download ``url`` into ``root``.
        root: the cache folder; default :func:`~torchformer.data.download.default_root`.
        splits: sizes of train/val/test. They are byte counts when they add up to the file's
            length and relative sizes otherwise, so the default is the standard 90M/5M/5M on
            enwik8 and 90/5/5 percent on any other file.
        expected_size, md5: how the official file is recognised. A file of ``expected_size``
            bytes must have this md5 (else :class:`ChecksumError`); ``md5=None`` skips the check.
            Any other size is loaded with a warning that it is not enwik8.
        url, opener, progress: passed to :func:`~torchformer.data.download.download`.
    """
    if path is None:
        root = pathlib.Path(root) if root is not None else default_root()
        candidates = [root / "enwik8", root / "enwik8.zip"]
        found = [c for c in candidates if c.is_file()]
        if found:
            path = found[0]
        elif download:
            root.mkdir(parents=True, exist_ok=True)
            path = _fetch(url, root, md5=md5, opener=opener, progress=progress)
        else:
            raise FileNotFoundError(
                f"enwik8 not found in {root} (looked for 'enwik8' and 'enwik8.zip'). Pass path= to a local "
                f"copy, call enwik8(download=True) to fetch {url}, or use enwik8_sample() for a small bundled piece."
            )

    data = load_text_bytes(path)
    if len(data) == expected_size:
        if md5 is not None:
            received = _md5(data)
            if received != md5.lower():
                raise ChecksumError(
                    path, "md5", md5.lower(), received,
                    f"A file of exactly {expected_size:,} bytes should be the official enwik8, but it is "
                    f"corrupt or a different file; download it again from {url}.",
                )
    else:
        warnings.warn(
            f"{path} holds {len(data):,} bytes, not the {expected_size:,} of the official enwik8; "
            f"splitting it {_describe(splits)}. Results on it are not comparable to enwik8 results.",
            stacklevel=2,
        )
    return _split(data, splits)


def _describe(splits: Sequence[float]) -> str:
    total = sum(splits) if len(splits) == 3 and sum(splits) > 0 else 1
    return "/".join(f"{100 * s / total:g}" for s in splits) + " percent"


def enwik8_sample(*, splits: Sequence[float] = (90, 5, 5)) -> tuple[Tensor, Tensor, Tensor]:
    """The bundled 299,994-byte start of enwik8, split 90/5/5 percent (by default) into uint8 tensors.

    Good for smoke tests and demos on any machine; far too small for results worth reporting.
    """
    return _split(load_text_bytes(sample_path()), splits)


def random_batches(
    data: Tensor,
    *,
    context: int,
    batch_size: int,
    generator: Optional[torch.Generator] = None,
    device: Optional[Union[str, torch.device]] = None,
) -> tuple[Tensor, Tensor]:
    """Sample ``batch_size`` random windows of ``data`` for next-byte prediction.

    Returns ``(inputs, targets)``, both ``(batch_size, context)`` int64 on ``device`` (default:
    ``data``'s device), with ``targets[i, j] = data[start_i + j + 1]``: each target is the byte
    that follows the corresponding input. Start positions are uniform over every window that fits.
    """
    if not isinstance(data, Tensor) or data.dim() != 1:
        raise ValueError(f"data must be a 1-D tensor, got {type(data).__name__} with shape "
                         f"{tuple(data.shape) if isinstance(data, Tensor) else None}")
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
