"""Tests for torchformer.data.download: checksums, atomic writes, failure cleanup. No network."""

import hashlib
import http.client
import io
import os
import pickle
import re
import subprocess
import sys
import time

import pytest

from torchformer.data.download import ChecksumError, DataFileError, default_root, download, file_digest, verify

PAYLOAD = bytes(range(256)) * 50 + b"tail"
SHA256 = hashlib.sha256(PAYLOAD).hexdigest()
MD5 = hashlib.md5(PAYLOAD).hexdigest()


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "remote" / "payload.bin"
    path.parent.mkdir()
    path.write_bytes(PAYLOAD)
    return path


def _folder_is_empty(folder):
    return not folder.exists() or list(folder.iterdir()) == []


def test_default_root_env_override(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHFORMER_HOME", str(tmp_path / "home"))
    assert default_root() == tmp_path / "home"
    monkeypatch.delenv("TORCHFORMER_HOME")
    assert default_root().parts[-2:] == (".cache", "torchformer")


def test_file_digest_matches_hashlib(source):
    assert file_digest(source) == SHA256
    assert file_digest(source, "md5") == MD5
    with pytest.raises(ValueError, match="algorithm"):
        file_digest(source, "no-such-hash")


def test_verify(source):
    verify(source, sha256=SHA256, md5=MD5)
    verify(source, sha256=SHA256.upper())  # case does not matter
    wrong = "0" * 64
    with pytest.raises(ChecksumError) as info:
        verify(source, sha256=wrong)
    message = str(info.value)
    assert str(source) in message and "sha256" in message and wrong in message and SHA256 in message
    with pytest.raises(ValueError, match="md5 must be 32 hex digits"):
        verify(source, md5="abc")


def test_checksum_error_pickles():
    err = ChecksumError("f.bin", "md5", "a" * 32, "b" * 32, "do this")
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == str(err) and again.received == "b" * 32


def test_file_url_download(source, tmp_path):
    dest = tmp_path / "cache" / "sub" / "payload.bin"
    out = download(source.as_uri(), dest, sha256=SHA256, md5=MD5)
    assert out == dest and dest.read_bytes() == PAYLOAD
    assert [p.name for p in dest.parent.iterdir()] == ["payload.bin"]


def test_wrong_checksum_leaves_nothing(source, tmp_path):
    cache = tmp_path / "cache"
    dest = cache / "payload.bin"
    with pytest.raises(ChecksumError) as info:
        download(source.as_uri(), dest, sha256="1" * 64)
    assert SHA256 in str(info.value) and source.as_uri() in str(info.value)
    assert not dest.exists()
    assert _folder_is_empty(cache)  # no temporary file either


class _FakeResponse(io.BytesIO):
    """A file-like response that announces a Content-Length and can fail after some bytes."""

    def __init__(self, body, *, declared=None, fail_after=None, error=None):
        super().__init__(body)
        self.headers = {} if declared is None else {"Content-Length": str(declared)}
        self.fail_after = fail_after
        self.error = error

    def read(self, size=-1):
        if self.fail_after is not None and self.tell() >= self.fail_after:
            raise self.error
        if self.fail_after is not None:
            size = min(size if size >= 0 else len(self.getbuffer()), self.fail_after - self.tell())
        return super().read(size)


def test_truncated_transfer_is_rejected(tmp_path):
    cache = tmp_path / "cache"
    opener = lambda url: _FakeResponse(PAYLOAD[:1000], declared=len(PAYLOAD))  # noqa: E731
    with pytest.raises(OSError, match="incomplete: received 1,000 bytes"):
        download("https://example.invalid/payload.bin", cache / "payload.bin", opener=opener)
    assert _folder_is_empty(cache)


@pytest.mark.parametrize(
    "error", [ConnectionResetError("connection reset by peer"), http.client.IncompleteRead(b"", 10)]
)
def test_error_mid_stream_is_rejected(tmp_path, error):
    cache = tmp_path / "cache"
    opener = lambda url: _FakeResponse(PAYLOAD, declared=len(PAYLOAD), fail_after=3000, error=error)  # noqa: E731
    with pytest.raises(OSError, match="failed after 3,000 bytes") as info:
        download("https://example.invalid/payload.bin", cache / "payload.bin", opener=opener, sha256=SHA256)
    assert "https://example.invalid/payload.bin" in str(info.value)  # tells where to get it by hand
    assert _folder_is_empty(cache)


def test_opener_failure_is_reported(tmp_path):
    def opener(url):
        raise TimeoutError("timed out")

    with pytest.raises(OSError, match="could not open"):
        download("https://example.invalid/x", tmp_path / "c" / "x", opener=opener)
    assert _folder_is_empty(tmp_path / "c")


def test_injected_opener_without_headers(tmp_path):
    dest = download("mem://x", tmp_path / "x", opener=lambda url: io.BytesIO(PAYLOAD), sha256=SHA256)
    assert dest.read_bytes() == PAYLOAD


def test_existing_verified_file_is_not_downloaded(tmp_path):
    dest = tmp_path / "payload.bin"
    dest.write_bytes(PAYLOAD)

    def opener(url):
        raise AssertionError("must not download a file that is already there and verifies")

    assert download("https://example.invalid/x", dest, sha256=SHA256, opener=opener) == dest


def test_existing_corrupt_file_is_replaced(source, tmp_path):
    dest = tmp_path / "payload.bin"
    dest.write_bytes(b"garbage")
    with pytest.warns(UserWarning, match="checksum mismatch"):
        download(source.as_uri(), dest, sha256=SHA256)
    assert dest.read_bytes() == PAYLOAD


def test_bad_arguments(tmp_path):
    with pytest.raises(TypeError, match="url"):
        download("", tmp_path / "x")
    with pytest.raises(ValueError, match="sha256 must be 64 hex digits"):
        download("file:///x", tmp_path / "x", sha256="xyz")


def test_progress_bar_does_not_change_the_result(source, tmp_path):
    dest = download(source.as_uri(), tmp_path / "p.bin", sha256=SHA256, progress=True)
    assert dest.read_bytes() == PAYLOAD
    assert issubclass(ChecksumError, ValueError)


# ------------------------------------------------------------------ sizes, bad arguments, stale temporaries


def test_verify_checks_the_size_before_hashing(source):
    verify(source, size=len(PAYLOAD), sha256=SHA256)
    with pytest.raises(ChecksumError) as info:
        verify(source, size=len(PAYLOAD) + 1, sha256=SHA256)
    message = str(info.value)
    assert str(source) in message and f"{len(PAYLOAD) + 1:,} bytes" in message and f"{len(PAYLOAD):,} bytes" in message
    assert info.value.algorithm == "size"
    for bad in (-1, 2.5, "12", True):
        with pytest.raises(ValueError, match="size must be"):
            verify(source, size=bad)


def test_verify_advice_is_part_of_the_message(source):
    with pytest.raises(ChecksumError, match="call it again with download=True"):
        verify(source, md5="0" * 32, advice="call it again with download=True")


def test_existing_file_of_the_wrong_size_is_replaced(source, tmp_path):
    dest = tmp_path / "payload.bin"
    dest.write_bytes(PAYLOAD[:-1])
    with pytest.warns(UserWarning, match="size mismatch"):
        download(source.as_uri(), dest, size=len(PAYLOAD))
    assert dest.read_bytes() == PAYLOAD


def test_download_of_the_wrong_size_is_rejected(tmp_path):
    cache = tmp_path / "cache"
    opener = lambda url: io.BytesIO(PAYLOAD[:100])  # noqa: E731  (no Content-Length: only size= can tell)
    with pytest.raises(ChecksumError, match=f"expected {len(PAYLOAD):,} bytes, got 100 bytes"):
        download("mem://x", cache / "x", size=len(PAYLOAD), opener=opener)
    assert _folder_is_empty(cache)


def test_more_bytes_than_announced_is_not_called_incomplete(tmp_path):
    opener = lambda url: _FakeResponse(PAYLOAD, declared=10)  # noqa: E731
    with pytest.raises(OSError, match=f"received {len(PAYLOAD):,} bytes, the server announced 10") as info:
        download("mem://x", tmp_path / "x", opener=opener)
    assert "incomplete" not in str(info.value)


def test_a_folder_at_dest_is_an_error_not_a_cached_file(tmp_path):
    (tmp_path / "x").mkdir()
    with pytest.raises(IsADirectoryError, match=r"dest .*x is a folder"):
        download("mem://x", tmp_path / "x", opener=lambda url: io.BytesIO(PAYLOAD))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"dest": 5}, TypeError, "dest must be a str or os.PathLike, got int"),
        ({"dest": ""}, ValueError, "dest must not be empty"),
        ({"opener": 5}, TypeError, "opener must be a callable, got int"),
        ({"opener": lambda url: None}, TypeError, "opener must return a binary file-like object.*got NoneType"),
        ({"opener": lambda url: io.StringIO("text")}, TypeError, "read.* must return bytes, got str"),
        ({"progress": "yes"}, TypeError, "progress must be a bool, got 'yes'"),
    ],
)
def test_bad_arguments_are_named(tmp_path, kwargs, error, match):
    args = {"dest": tmp_path / "cache" / "x", "opener": lambda url: io.BytesIO(PAYLOAD), **kwargs}
    with pytest.raises(error, match=match):
        download("mem://x", **args)
    assert _folder_is_empty(tmp_path / "cache")


def test_a_file_where_the_folder_should_be_is_named(tmp_path):
    (tmp_path / "cache").write_bytes(b"not a folder")
    with pytest.raises(NotADirectoryError, match=r"cache.* is a file, not a folder"):
        download("mem://x", tmp_path / "cache" / "x", opener=lambda url: io.BytesIO(PAYLOAD))


_KILLED_DOWNLOAD = """
import io, os, sys
from torchformer.data.download import download

class Dies(io.BytesIO):
    def read(self, size=-1):
        if self.tell() > 0:
            os._exit(3)  # like kill -9: no cleanup code runs
        return super().read(100)

download("mem://x", sys.argv[1], opener=lambda url: Dies(b"x" * 1000))
"""


def _killed_download(dest):
    """Run a download in a child process that dies mid-transfer; return the temporary file it left behind."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    result = subprocess.run([sys.executable, "-c", _KILLED_DOWNLOAD, str(dest)], env=env, capture_output=True)
    assert result.returncode == 3, result.stderr.decode()
    (leftover,) = [p for p in dest.parent.iterdir() if p.name.endswith(".part")]
    return leftover, result


def test_leftover_of_a_killed_download_is_removed_by_the_next_one(tmp_path):
    dest = tmp_path / "cache" / "payload.bin"
    leftover, _ = _killed_download(dest)
    assert leftover.is_file() and not dest.exists()
    download("mem://x", dest, opener=lambda url: io.BytesIO(PAYLOAD), sha256=SHA256)
    assert [p.name for p in dest.parent.iterdir()] == ["payload.bin"]


def test_only_stale_temporaries_of_the_same_file_are_removed(tmp_path):
    dest = tmp_path / "cache" / "payload.bin"
    leftover, child = _killed_download(dest)
    dead_pid = re.search(r"-(\d+)-", leftover.name)[1]
    folder, day = dest.parent, 24 * 3600

    def make(name, age_s=0.0):
        path = folder / name
        path.write_bytes(b"partial")
        os.utime(path, (time.time() - age_s, time.time() - age_s))
        return path

    live = make(leftover.name.replace(f"-{dead_pid}-", f"-{os.getpid()}-"))  # a download in progress here
    other_host_fresh = make(re.sub(r"^\.payload\.bin\.[A-Za-z0-9_]+-", ".payload.bin.otherhost-", leftover.name))
    other_host_old = make(other_host_fresh.name.replace("otherhost", "oldhost"), age_s=2 * day)
    legacy_fresh = make(".payload.bin.abc12_yz.part")  # the name scheme of older versions: no host, no pid
    legacy_old = make(".payload.bin.old12_yz.part", age_s=2 * day)
    other_file = make(".payload.bin.zip.oldhost-1-abcdefgh.part", age_s=2 * day)  # a temporary of payload.bin.zip
    not_ours = make(".payload.bin.notes", age_s=2 * day)

    download("mem://x", dest, opener=lambda url: io.BytesIO(PAYLOAD))
    remaining = {p.name for p in folder.iterdir()}
    for kept in (live, other_host_fresh, legacy_fresh, other_file, not_ours):
        assert kept.name in remaining, kept.name
    for removed in (leftover, other_host_old, legacy_old):
        assert removed.name not in remaining, removed.name


def test_leftover_is_removed_even_when_the_file_is_already_there(tmp_path):
    dest = tmp_path / "cache" / "payload.bin"
    leftover, _ = _killed_download(dest)
    dest.write_bytes(PAYLOAD)  # completed by another process meanwhile
    download("mem://x", dest, sha256=SHA256, opener=lambda url: pytest.fail("must not download"))
    assert [p.name for p in dest.parent.iterdir()] == ["payload.bin"]


def test_data_file_error_names_file_and_line_and_pickles():
    err = DataFileError("data.jsonl.gz", "is not valid JSON", "Fix that line.", line=7)
    assert str(err) == "data.jsonl.gz, line 7: is not valid JSON. Fix that line."
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == str(err) and again.line == 7 and isinstance(again, ValueError)
    assert "download or copy it again" in str(DataFileError("x.gz", "is truncated"))
