"""Tests for torchformer.data.enwik8_dataset: file formats, the official-file check, downloads, batches. No network."""

import gzip
import hashlib
import io
import os
import warnings
import zipfile

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchformer.data.download import ChecksumError, DataFileError
from torchformer.data.enwik8_dataset import enwik8, enwik8_sample, load_text_bytes, random_batches, sample_path

N = 2000  # size of the synthetic "official" file


@pytest.fixture
def raw():
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=N, dtype=np.uint8).tobytes()


def _write_zip(path, member, payload):
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(member, payload)
    return path


def _official(raw):
    """Keyword arguments that make `raw` the "official" file."""
    return {"expected_size": len(raw), "md5": hashlib.md5(raw).hexdigest()}


def test_raw_gz_and_zip_give_identical_splits(tmp_path, raw):
    plain = tmp_path / "enwik8"
    plain.write_bytes(raw)
    gz = tmp_path / "enwik8.gz"
    gz.write_bytes(gzip.compress(raw))
    zp = _write_zip(tmp_path / "enwik8.zip", "enwik8", raw)
    results = [enwik8(p, **_official(raw)) for p in (plain, gz, zp)]
    for result in results:
        assert all(piece.dtype == torch.uint8 and piece.dim() == 1 for piece in result)
        for piece, reference in zip(result, results[0]):
            assert torch.equal(piece, reference)
    assert torch.cat(results[0]).numpy().tobytes() == raw


def test_official_file_uses_official_split_sizes(tmp_path, raw):
    path = tmp_path / "enwik8"
    path.write_bytes(raw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the official file must load silently
        train, val, test = enwik8(path, splits=(1700, 200, 100), **_official(raw))
        default = enwik8(path, **_official(raw))
    assert (len(train), len(val), len(test)) == (1700, 200, 100)
    assert val.numpy().tobytes() == raw[1700:1900] and test.numpy().tobytes() == raw[1900:]
    assert [len(p) for p in default] == [1800, 100, 100]  # 90M/5M/5M scaled to 2000 bytes


def test_corrupt_official_file_raises(tmp_path, raw):
    corrupt = bytearray(raw)
    corrupt[1234] ^= 1
    path = tmp_path / "enwik8"
    path.write_bytes(bytes(corrupt))
    with pytest.raises(ChecksumError, match="md5") as info:
        enwik8(path, **_official(raw))
    assert info.value.expected == hashlib.md5(raw).hexdigest()
    assert info.value.received == hashlib.md5(corrupt).hexdigest()


def test_other_file_warns_and_splits_90_5_5(tmp_path):
    path = tmp_path / "novel.txt"
    text = ("It was a dark and stormy night. " * 40).encode()[:1000]
    path.write_bytes(text)
    with pytest.warns(UserWarning, match=r"novel\.txt holds 1,000 bytes") as record:
        train, val, test = enwik8(path)
    assert "not the 100,000,000" in str(record[0].message)
    assert (len(train), len(val), len(test)) == (900, 50, 50)
    assert torch.cat([train, val, test]).numpy().tobytes() == text


def test_real_enwik8_prefix_is_not_mistaken_for_enwik8():
    prefix = "/work/shared/data/enwik8_prefix.gz"
    if not os.path.exists(prefix):
        pytest.skip("shared data not available")
    with pytest.warns(UserWarning, match="4,154,399 bytes"):
        train, val, test = enwik8(prefix)
    assert len(train) + len(val) + len(test) == 4_154_399
    assert bytes(train[:10].tolist()) == b"<mediawiki"


def test_too_small_file_and_bad_splits(tmp_path):
    path = tmp_path / "tiny"
    path.write_bytes(b"abcdefghij")
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="val split would be empty"):
        enwik8(path)
    # Bad splits are refused before the file is read (so before the "not enwik8" warning).
    with pytest.raises(ValueError, match="splits must be three numbers"):
        enwik8(path, splits=(1, 2))
    with pytest.raises(ValueError, match="non-negative"):
        enwik8(path, splits=(8, -1, 3))


def test_zip_without_enwik8_member(tmp_path):
    path = tmp_path / "many.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("a.txt", b"aaa")
        archive.writestr("b.txt", b"bbb")
    with pytest.raises(ValueError, match="member named 'enwik8'"):
        load_text_bytes(path)


def test_missing_file_says_how_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="download=True") as info:
        enwik8(root=tmp_path)
    assert "mattmahoney.net" in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_download_into_cache(tmp_path, raw):
    remote = _write_zip(tmp_path / "remote.zip", "enwik8", raw)
    root = tmp_path / "cache"
    train, val, test = enwik8(download=True, root=root, url=remote.as_uri(), progress=False, **_official(raw))
    assert torch.cat([train, val, test]).numpy().tobytes() == raw
    assert [p.name for p in root.iterdir()] == ["enwik8"]  # raw file only, no zip or temp files

    def opener(url):
        raise AssertionError("the cached copy must be used")

    again = enwik8(download=True, root=root, opener=opener, **_official(raw))
    assert all(torch.equal(a, b) for a, b in zip(again, (train, val, test)))


def test_download_honours_torchformer_home(tmp_path, raw, monkeypatch):
    monkeypatch.setenv("TORCHFORMER_HOME", str(tmp_path / "home"))
    remote = _write_zip(tmp_path / "remote.zip", "enwik8", raw)
    enwik8(download=True, url=remote.as_uri(), progress=False, **_official(raw))
    assert (tmp_path / "home" / "enwik8").read_bytes() == raw


def test_corrupt_download_leaves_cache_empty(tmp_path, raw):
    corrupt = bytearray(raw)
    corrupt[0] ^= 0xFF
    remote = _write_zip(tmp_path / "remote.zip", "enwik8", bytes(corrupt))
    root = tmp_path / "cache"
    with pytest.raises(ChecksumError, match="md5"):
        enwik8(download=True, root=root, url=remote.as_uri(), progress=False, **_official(raw))
    assert list(root.iterdir()) == []


def test_download_that_is_not_a_zip_leaves_cache_empty(tmp_path, raw):
    root = tmp_path / "cache"
    html = b"<html>502 Bad Gateway</html>"
    opener = lambda url: io.BytesIO(html)  # noqa: E731
    with pytest.raises(DataFileError, match="not a valid zip"):
        enwik8(download=True, root=root, opener=opener, progress=False, **_official(raw))
    assert list(root.iterdir()) == []


def _zip_bytes(raw, compression=zipfile.ZIP_DEFLATED):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=compression) as archive:
        archive.writestr("enwik8", raw)
    return buffer.getvalue()


def _flip(data, index):
    data = bytearray(data)
    data[index] ^= 0xFF
    return bytes(data)


# Damaged files of every kind load_text_bytes reads: each must name the file and say what is wrong.
DAMAGED = {
    "truncated.gz": lambda raw: gzip.compress(raw)[:-100],
    "bad_crc.gz": lambda raw: _flip(gzip.compress(raw), -6),
    "trailing_junk.gz": lambda raw: gzip.compress(raw) + b"junk",
    "only_magic.gz": lambda raw: b"\x1f\x8b",
    "truncated.zip": lambda raw: _zip_bytes(raw)[:100],
    "bad_member.zip": lambda raw: _flip(_zip_bytes(raw), 200),
    "only_magic.zip": lambda raw: b"PK\x03\x04",
    "bad_bzip2_member.zip": lambda raw: _flip(_zip_bytes(raw, zipfile.ZIP_BZIP2), 100),
    "bad_lzma_member.zip": lambda raw: _flip(_zip_bytes(raw, zipfile.ZIP_LZMA), 100),
}


@pytest.mark.parametrize("name", sorted(DAMAGED))
def test_damaged_files_are_named(tmp_path, raw, name):
    path = tmp_path / name
    path.write_bytes(DAMAGED[name](raw))
    for load in (load_text_bytes, lambda p: enwik8(p, **_official(raw))):
        with pytest.raises(DataFileError) as info:
            load(path)
        message = str(info.value)
        assert str(path) in message and ("damaged" in message or "truncated" in message), message
        assert info.value.path == str(path)


def test_empty_zip_archive_is_named(tmp_path):
    path = tmp_path / "empty.zip"
    zipfile.ZipFile(path, "w").close()
    with pytest.raises(DataFileError, match=r"empty\.zip: is a zip archive, but not the expected one.*holds \[\]"):
        load_text_bytes(path)


def test_empty_file_is_named(tmp_path):
    path = tmp_path / "empty"
    path.write_bytes(b"")
    assert len(load_text_bytes(path)) == 0  # reading is fine: splitting nothing is not
    with pytest.warns(UserWarning), pytest.raises(ValueError, match=f"{path} holds 0 bytes: too few"):
        enwik8(path)


def test_folder_and_missing_paths(tmp_path):
    with pytest.raises(IsADirectoryError, match=f"path {tmp_path} is a folder"):
        load_text_bytes(tmp_path)
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_text_bytes(tmp_path / "nope")


@pytest.mark.parametrize("name", ["enwik8.zip", "enwik8.gz", "ENWIK8.ZIP"])
def test_a_name_that_promises_compression_the_bytes_lack(tmp_path, name):
    path = tmp_path / name
    path.write_bytes(b"<html>502 Bad Gateway</html>")  # e.g. an error page saved under the archive's name
    with pytest.raises(DataFileError, match=r"named like a (zip|gzip) file but .*starts with b'<html>502") as info:
        load_text_bytes(path)
    assert info.value.path == str(path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_path_that_is_not_a_regular_file(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="is not a regular file"):  # instead of blocking forever on read
        load_text_bytes(fifo)


def test_loading_from_the_cache_removes_dead_temporaries(tmp_path, raw):
    from torchformer._files import part_file

    root = _cache(tmp_path, "enwik8", raw)
    fd, leftover = part_file(root / "enwik8")
    os.close(fd)
    leftover.rename(leftover.with_name(leftover.name.replace(f"-{os.getpid()}-", "-999999999-")))
    enwik8(root=root, **_official(raw))
    assert [p.name for p in root.iterdir()] == ["enwik8"]


def _cache(tmp_path, name, payload):
    root = tmp_path / "cache"
    root.mkdir(exist_ok=True)
    (root / name).write_bytes(payload)
    return root


def _never(url):
    raise AssertionError("must not download")


def test_truncated_cached_zip_is_a_clear_error_without_download(tmp_path, raw):
    root = _cache(tmp_path, "enwik8.zip", _zip_bytes(raw)[:100])
    with pytest.raises(DataFileError) as info:
        enwik8(root=root, **_official(raw))
    message = str(info.value)
    assert str(root / "enwik8.zip") in message and "download=True" in message


def test_truncated_cached_zip_is_replaced_with_download(tmp_path, raw):
    root = _cache(tmp_path, "enwik8.zip", _zip_bytes(raw)[:100])
    opener = lambda url: io.BytesIO(_zip_bytes(raw))  # noqa: E731
    with pytest.warns(UserWarning, match="enwik8.zip.*Downloading it again"):
        data = enwik8(root=root, download=True, opener=opener, progress=False, **_official(raw))
    assert torch.cat(data).numpy().tobytes() == raw
    assert [p.name for p in root.iterdir()] == ["enwik8"]


@pytest.mark.parametrize("damage", ["short", "flipped"])
def test_cached_raw_file_is_verified(tmp_path, raw, damage):
    bad = raw[:-1] if damage == "short" else _flip(raw, 5)
    root = _cache(tmp_path, "enwik8", bad)
    with pytest.raises(ChecksumError) as info:
        enwik8(root=root, opener=_never, **_official(raw))
    message = str(info.value)
    assert str(root / "enwik8") in message and "download=True" in message
    if damage == "short":
        assert f"expected {len(raw):,} bytes, got {len(raw) - 1:,} bytes" in message
    else:
        assert hashlib.md5(raw).hexdigest() in message and hashlib.md5(bad).hexdigest() in message

    opener = lambda url: io.BytesIO(_zip_bytes(raw))  # noqa: E731
    with pytest.warns(UserWarning, match="Downloading it again"):
        data = enwik8(root=root, download=True, opener=opener, progress=False, **_official(raw))
    assert torch.cat(data).numpy().tobytes() == raw and (root / "enwik8").read_bytes() == raw


def test_good_cached_zip_is_used_without_download(tmp_path, raw):
    root = _cache(tmp_path, "enwik8.zip", _zip_bytes(raw))
    data = enwik8(root=root, download=True, opener=_never, **_official(raw))
    assert torch.cat(data).numpy().tobytes() == raw


def test_a_folder_where_the_cached_file_should_be(tmp_path, raw):
    root = tmp_path / "cache"
    (root / "enwik8").mkdir(parents=True)
    for download in (False, True):
        with pytest.raises(IsADirectoryError, match=r"cache/enwik8 is a folder"):
            enwik8(root=root, download=download, opener=_never, **_official(raw))
    assert (root / "enwik8").is_dir()  # a user's folder is never deleted


def test_root_that_is_a_file(tmp_path, raw):
    root = tmp_path / "cache"
    root.write_bytes(b"x")
    with pytest.raises(NotADirectoryError, match=r"root .*cache is a file"):
        enwik8(root=root, download=True, opener=_never, **_official(raw))


def test_downloaded_zip_of_the_wrong_size_is_not_cached(tmp_path, raw):
    root = tmp_path / "cache"
    opener = lambda url: io.BytesIO(_zip_bytes(raw[:-10]))  # noqa: E731
    with pytest.raises(ChecksumError, match=f"expected {len(raw):,} bytes, got {len(raw) - 10:,} bytes"):
        enwik8(root=root, download=True, opener=opener, progress=False, expected_size=len(raw), md5=None)
    assert list(root.iterdir()) == []


def test_leftover_extraction_temporary_is_removed(tmp_path, raw):
    from torchformer._files import part_file

    root = tmp_path / "cache"
    root.mkdir()
    fd, leftover = part_file(root / "enwik8")
    os.close(fd)
    dead = leftover.with_name(leftover.name.replace(f"-{os.getpid()}-", "-999999999-"))  # no such process
    leftover.rename(dead)
    opener = lambda url: io.BytesIO(_zip_bytes(raw))  # noqa: E731
    enwik8(root=root, download=True, opener=opener, progress=False, **_official(raw))
    assert [p.name for p in root.iterdir()] == ["enwik8"]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"path": 5}, TypeError, "path must be a str or os.PathLike, got int"),
        ({"path": ""}, ValueError, "path must not be empty"),
        ({"root": 5, "path": None}, TypeError, "root must be a str or os.PathLike, got int"),
        ({"expected_size": "2000"}, ValueError, "expected_size must be a positive int, got '2000'"),
        ({"expected_size": 2000.0}, ValueError, "expected_size must be a positive int, got 2000.0"),
        ({"md5": 123}, TypeError, "md5 must be a hex string or None, got int"),
        ({"md5": "xyz"}, ValueError, "md5 must be 32 hex digits, got 'xyz'"),
        ({"splits": None}, ValueError, "splits must be three numbers"),
        ({"splits": "abc"}, ValueError, "splits must be three numbers"),
        ({"splits": (float("nan"), 1, 1)}, ValueError, "splits must be finite"),
        ({"splits": (float("inf"), 1, 1)}, ValueError, "splits must be finite"),
        ({"splits": (1e308, 1e308, 1e308)}, ValueError, "splits must have a finite sum"),
        ({"download": "no"}, TypeError, "download must be a bool, got 'no'"),
        ({"progress": 1}, TypeError, "progress must be a bool, got 1"),
    ],
)
def test_bad_arguments_are_named(tmp_path, raw, kwargs, error, match):
    path = tmp_path / "enwik8"
    path.write_bytes(raw)
    args = {"path": path, **kwargs}
    with pytest.raises(error, match=match):
        enwik8(**args)


def test_download_needs_path_none(tmp_path, raw):
    path = tmp_path / "enwik8"
    path.write_bytes(raw)
    with pytest.raises(ValueError, match="download=True only applies with path=None"):
        enwik8(path, download=True, opener=_never)


def test_splits_may_be_numpy_numbers_and_fractional_byte_counts(tmp_path, raw):
    path = tmp_path / "enwik8"
    path.write_bytes(raw)
    sizes = [len(p) for p in enwik8(path, splits=tuple(np.array([90, 5, 5])), **_official(raw))]
    assert sizes == [1800, 100, 100]
    # Sums to the file's length but is not a whole number of bytes each: read as relative sizes.
    sizes = [len(p) for p in enwik8(path, splits=(1799.5, 100.5, 100), **_official(raw))]
    assert sum(sizes) == len(raw) and sizes[1:] == [100, 100]


def test_bundled_sample():
    train, val, test = enwik8_sample()
    assert sample_path().is_file()
    data = torch.cat([train, val, test])
    assert len(data) == 299_994
    assert (len(val), len(test)) == (14_999, 14_999)
    assert bytes(data[:10].tolist()) == b"<mediawiki"
    # The same digest is recorded in SAMPLE_LICENSE.md; a changed sample must update it.
    digest = hashlib.sha256(data.numpy().tobytes()).hexdigest()
    assert digest in sample_path().with_name("SAMPLE_LICENSE.md").read_text()


# ---------------------------------------------------------------- random_batches


def test_random_batches_shift_shape_dtype():
    data = torch.arange(1000)  # every value is its own position, so windows can be checked exactly
    inputs, targets = random_batches(data, context=16, batch_size=64, generator=torch.Generator().manual_seed(1))
    assert inputs.shape == targets.shape == (64, 16)
    assert inputs.dtype == targets.dtype == torch.int64
    starts = inputs[:, 0]
    expected = starts[:, None] + torch.arange(16)
    assert torch.equal(inputs, expected)
    assert torch.equal(targets, expected + 1)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 60), data=st.data())
def test_random_batches_windows_come_from_data(n, data):
    context = data.draw(st.integers(1, n - 1))
    batch_size = data.draw(st.integers(1, 8))
    seed = data.draw(st.integers(0, 2**31 - 1))
    text = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    inputs, targets = random_batches(text, context=context, batch_size=batch_size,
                                     generator=torch.Generator().manual_seed(seed))
    windows = text.long().unfold(0, context + 1, 1)  # every window that fits, (n - context, context + 1)
    pairs = torch.cat([inputs, targets[:, -1:]], dim=1)
    assert torch.equal(targets[:, :-1], inputs[:, 1:])
    for row in pairs:
        assert (windows == row).all(dim=1).any()


def test_random_batches_reach_every_start():
    # With 5 possible windows and many draws, each start (including the last one) must occur.
    data = torch.arange(12)
    inputs, _ = random_batches(data, context=7, batch_size=500, generator=torch.Generator().manual_seed(0))
    assert set(inputs[:, 0].tolist()) == {0, 1, 2, 3, 4}


def test_random_batches_seeded_reproducibility():
    train, _, _ = enwik8_sample()
    a = random_batches(train, context=32, batch_size=4, generator=torch.Generator().manual_seed(7))
    b = random_batches(train, context=32, batch_size=4, generator=torch.Generator().manual_seed(7))
    c = random_batches(train, context=32, batch_size=4, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_random_batches_device_argument():
    inputs, targets = random_batches(torch.arange(50, dtype=torch.uint8), context=4, batch_size=2, device="meta")
    assert inputs.device.type == targets.device.type == "meta"


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"context": 10}, ValueError, r"context must be smaller than len\(data\).*context=10 for 10 bytes"),
        ({"context": 0}, ValueError, "context must be a positive int, got 0"),
        ({"batch_size": 0}, ValueError, "batch_size must be a positive int, got 0"),
        ({"batch_size": 2.0}, ValueError, "batch_size must be a positive int, got 2.0"),
        ({"data": torch.zeros(2, 5, dtype=torch.uint8)}, ValueError, r"1-D tensor.*\(2, 5\)"),
        ({"data": torch.zeros(10)}, TypeError, "integer token ids, got dtype torch.float32"),
        ({"data": [1, 2, 3, 4, 5, 6]}, TypeError, "data must be a 1-D torch.Tensor, got list"),
    ],
)
def test_random_batches_bad_arguments(kwargs, error, match):
    args = {"data": torch.arange(10, dtype=torch.uint8), "context": 4, "batch_size": 2, **kwargs}
    data = args.pop("data")
    with pytest.raises(error, match=match):
        random_batches(data, **args)
