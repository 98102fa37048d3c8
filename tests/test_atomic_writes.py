"""Durability of checkpoint writes, observed through the system calls: ``write_atomically`` (and so
``save_checkpoint``) must fsync the temporary file, whole, before ``os.replace`` makes it visible under its name,
and fsync the folder after the rename, so that the new directory entry survives a power cut too.

A crash test cannot see a missing fsync (the page cache survives a killed process), so these tests record the
calls: ``os.fsync`` and ``os.replace`` are wrapped (they still do their work), and each call is logged with the
identity (device, inode) of what it acted on.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest
import torch

from torchformer._files import write_atomically
from torchformer.train.checkpoint import save_checkpoint


def identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


@pytest.fixture
def calls(monkeypatch):
    """The log of fsync and replace calls, in order: ``("fsync", id, is_folder, size)``, ``("replace", id, dst)``."""
    log: list[tuple] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        st = os.fstat(fd)
        log.append(("fsync", identity(st), stat.S_ISDIR(st.st_mode), st.st_size))
        return real_fsync(fd)

    def replace(src, dst, *args, **kwargs):
        log.append(("replace", identity(os.stat(src)), Path(dst)))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return log


def assert_durable(log: list[tuple], path: Path) -> None:
    """The file now at ``path`` was fsynced with its final size before being renamed to ``path``, and ``path``'s
    folder was fsynced after that rename."""
    file_id, folder_id = identity(os.stat(path)), identity(os.stat(path.parent))
    renames = [i for i, call in enumerate(log) if call[0] == "replace" and call[2] == path]
    assert len(renames) == 1, log
    rename = renames[0]
    assert log[rename][1] == file_id, "the renamed file is not the one now at the path"
    synced = [call for call in log[:rename] if call[0] == "fsync" and call[1] == file_id]
    assert synced, f"the file was not fsynced before the rename: {log}"
    assert not synced[-1][2] and synced[-1][3] == os.stat(path).st_size, "fsynced before it was completely written"
    after = [call for call in log[rename + 1 :] if call[0] == "fsync" and call[1] == folder_id]
    assert after and after[0][2], f"the folder was not fsynced after the rename: {log}"


def test_write_atomically_fsyncs_the_file_then_renames_then_fsyncs_the_folder(tmp_path, calls):
    path = tmp_path / "deep" / "file.bin"
    written = []
    write_atomically(path, lambda tmp: (written.append(tmp), tmp.write_bytes(b"x" * 1000)))
    assert path.read_bytes() == b"x" * 1000
    assert_durable(calls, path)
    # nothing else: one fsync of the file, the rename, one fsync of the folder
    file_id, folder_id = identity(os.stat(path)), identity(os.stat(path.parent))
    folder_size = os.stat(path.parent).st_size
    assert calls == [
        ("fsync", file_id, False, 1000), ("replace", file_id, path), ("fsync", folder_id, True, folder_size)
    ]
    assert calls[1][2] != written[0] and written[0].parent == path.parent  # a temporary name in the same folder


def test_replacing_a_file_is_as_durable_as_creating_it(tmp_path, calls):
    path = tmp_path / "file.bin"
    path.write_bytes(b"old")
    write_atomically(path, lambda tmp: tmp.write_bytes(b"new contents"))
    assert path.read_bytes() == b"new contents"
    assert_durable(calls, path)


def test_save_checkpoint_is_durable(tmp_path, calls):
    path = tmp_path / "run" / "step_00000003.pt"
    save_checkpoint(path, model=torch.nn.Linear(3, 2), step=3)
    assert_durable(calls, path)


def test_a_failed_fsync_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    """If the data cannot be made durable (EIO, a full disk), the rename must not happen."""
    path = tmp_path / "file.bin"
    path.write_bytes(b"old")

    def failing_fsync(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="Input/output error"):
        write_atomically(path, lambda tmp: tmp.write_bytes(b"new"))
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.bin"]


def test_a_full_disk_is_an_oserror_naming_the_checkpoint_not_its_temporary(tmp_path, monkeypatch):
    """torch.save reports a failed write as a RuntimeError of its zip writer ("unexpected pos 64 vs 0"), chained
    to the OSError; save_checkpoint raises that OSError, with the errno, naming the file it was asked to write."""
    path = tmp_path / "step_00000001.pt"
    path.write_bytes(b"old")

    def full_disk(obj, f):
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError) as info:
        save_checkpoint(path, model=torch.nn.Linear(2, 2), step=1)
    assert info.value.errno == errno.ENOSPC
    assert str(info.value) == f"[Errno 28] No space left on device; cannot write the file, which is as it was: '{path}'"
    assert info.value.filename == str(path)
    assert path.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == [path.name]

    def not_a_file_system_error(obj, f):
        raise RuntimeError("a bug")

    monkeypatch.setattr(torch, "save", not_a_file_system_error)
    with pytest.raises(RuntimeError, match="a bug"):  # passed on as it is
        save_checkpoint(path, model=torch.nn.Linear(2, 2), step=1)
