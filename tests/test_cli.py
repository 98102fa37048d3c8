"""torchformer.train.cli: the flag checks the example scripts share."""

from __future__ import annotations

import argparse
import os

import pytest

from torchformer.train.cli import POSITIVE, POSITIVE_INT, WRITABLE_FOLDER, check_flags, writable_folder


def test_writable_folder(tmp_path):
    (tmp_path / "a_file").write_text("x")
    assert writable_folder(tmp_path) and writable_folder(tmp_path / "new" / "deeper")  # exists, or can be made
    assert not writable_folder(tmp_path / "a_file")  # a file is no folder
    assert not writable_folder(tmp_path / "a_file" / "below")  # nor can one be made under a file
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    assert not writable_folder(tmp_path / "dangling")


def test_check_flags_names_the_first_bad_flag(capsys, tmp_path):
    parser = argparse.ArgumentParser()
    checks = {"batch_size": POSITIVE_INT, "learn_rate": POSITIVE, "out": WRITABLE_FOLDER}
    good = argparse.Namespace(batch_size=4, learn_rate=1e-3, out=tmp_path)
    check_flags(parser, good, checks)
    check_flags(parser, argparse.Namespace(batch_size=None, learn_rate=None, out=None), checks)  # not given
    for bad, message in [({"batch_size": 0}, "--batch-size must be a positive int, got 0"),
                         ({"learn_rate": float("inf")}, "--learn-rate must be a positive number, got inf"),
                         ({"out": tmp_path / "f" / "x"}, "--out must be a folder this user can write in")]:
        (tmp_path / "f").write_text("x")
        with pytest.raises(SystemExit) as info:
            check_flags(parser, argparse.Namespace(**{**vars(good), **bad}), checks)
        assert info.value.code == 2 and message in capsys.readouterr().err
