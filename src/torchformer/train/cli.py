"""Command-line checks the example scripts share: every flag is checked before anything is loaded or trained.

A script lists the valid values of its flags as ``{dest: (test, what the flag must be)}`` and calls
:func:`check_flags` after parsing, so a bad value is one usage error naming the flag (``--flag must be ..., got
...``) and never costs a training run or ends in a traceback::

    CHECKS = {"batch_size": POSITIVE_INT, "learn_rate": POSITIVE, "out": WRITABLE_FOLDER}
    args = parser.parse_args(argv)
    check_flags(parser, args, CHECKS)
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Any, Callable, Mapping

Check = tuple[Callable[[Any], bool], str]


def writable_folder(path: object) -> bool:
    """Whether ``path`` is a folder this process can write in, or one it can create (not a file, nor under one)."""
    path = Path(path)  # type: ignore[arg-type]
    while not path.exists():
        if path.is_symlink():  # a dangling link: mkdir would fail
            return False
        path = path.parent
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


POSITIVE_INT: Check = (lambda v: v >= 1, "a positive int")
POSITIVE: Check = (lambda v: 0 < v < math.inf, "a positive number")
WRITABLE_FOLDER: Check = (writable_folder, "a folder this user can write in or create (not a file)")


def check_flags(parser: argparse.ArgumentParser, args: argparse.Namespace, checks: Mapping[str, Check]) -> None:
    """``parser.error`` (exit status 2, a usage message) for the first flag whose value fails its check; flags that
    are ``None`` (not given, and no preset set them) are not checked."""
    for name, (valid, must) in checks.items():
        value = getattr(args, name)
        if value is not None and not valid(value):
            parser.error(f"--{name.replace('_', '-')} must be {must}, got {value}")
