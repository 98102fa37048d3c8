"""Tests for torchformer.data.download: checksums, atomic writes, failure cleanup. No network."""

import hashlib
import http.client
import io
import pickle

import pytest

from torchformer.data.download import ChecksumError, default_root, download, file_digest, verify

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
