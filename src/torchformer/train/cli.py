"""Command-line checks the example scripts share: every flag is checked before anything is loaded or trained.

A script lists the valid values of its flags as ``{dest: (test, what the flag must be)}`` and calls
:func:`check_flags` after parsing, so a bad value is one usage error naming the flag (``--flag must be ..., got
...``) and never costs a training run or ends in a traceback::

    CHECKS = {"batch_size": POSITIVE_INT, "learn_rate": POSITIVE, "out": WRITABLE_FOLDER}
    args = parser.parse_args(argv)
    check_flags(parser, args, CHECKS)

:func:`preset_flags` adds flags whose help says their default, or what each ``--preset`` sets them to, so ``--help``
tells a user what a run will do without reading the source; :func:`choose_threads` picks the CPU threads.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import torch

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


def preset_flags(parser: argparse.ArgumentParser, presets: Mapping[str, Mapping[str, Any]]) -> Callable[..., argparse.Action]:
    """A drop-in for ``parser.add_argument`` that appends to each flag's help what it will be when not given.

    A flag that a preset sets (its ``dest`` is a key of ``presets[name]``) gets ``(--preset cpu: 2000; --preset gpu:
    not set)``; any other flag with a default gets ``(default: ...)``. Flags whose help is ``argparse.SUPPRESS``
    and switches that default to off are left as they are.
    """

    def shown(value: Any) -> str:
        return str(value).replace("%", "%%")  # help strings are %-formatted by argparse

    def add(*names: str, **kwargs: Any) -> argparse.Action:
        action = parser.add_argument(*names, **kwargs)
        if action.help is None or action.help == argparse.SUPPRESS:
            return action
        by_preset = {name: preset[action.dest] for name, preset in presets.items() if action.dest in preset}
        if by_preset:
            action.help += " (" + "; ".join(
                f"--preset {name}: {shown(by_preset[name]) if name in by_preset else 'not set'}"
                for name in presets) + ")"
        elif action.default not in (None, False, argparse.SUPPRESS):
            action.help += f" (default: {shown(action.default)})"
        return action

    return add


def choose_threads(requested: Optional[int] = None) -> tuple[int, str]:
    """The CPU threads a script should give torch, and why: ``(threads, reason)``.

    ``requested`` (a ``--threads`` flag) wins. Otherwise the cores this process may run on, less the ones other
    programs keep busy right now (measured over a quarter of a second), and at least 1. PyTorch's own default uses
    every core, and when something else runs on one of them its threads keep waiting for each other (measured in
    examples/README.md, "Threads").
    """
    if requested is not None:
        return requested, "--threads"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    cores = max(1, min(cores, torch.get_num_threads()))  # torch's default, or OMP_NUM_THREADS when set
    busy = busy_cores()
    if busy is None:
        return cores, f"{cores} core(s); --threads overrides"
    threads = max(1, min(cores, round(cores - busy)))
    if threads == cores:
        return threads, f"{cores} core(s), idle; --threads overrides"
    return threads, f"{cores} cores, {busy:.1f} busy with other programs; --threads overrides"


def busy_cores(seconds: float = 0.25) -> Optional[float]:
    """How many of the machine's cores other programs kept busy over the next ``seconds`` (this process sleeps
    meanwhile), from Linux's ``/proc/stat``; ``None`` where it cannot be read.

    ``/proc/stat``'s first line counts the time all cores spent in each state since boot; of the time that passes
    while we sleep, the share not spent idle (or waiting for disks) is the work of other programs.
    """

    def times() -> list[int]:
        with open("/proc/stat") as f:
            return [int(v) for v in f.readline().split()[1:]]

    try:
        before = times()
        time.sleep(seconds)
        after = times()
    except (OSError, ValueError):
        return None
    delta = [a - b for a, b in zip(after, before)]
    total, idle = sum(delta), delta[3] + (delta[4] if len(delta) > 4 else 0)  # fields: user nice system idle iowait
    if total <= 0:
        return None
    return (os.cpu_count() or 1) * (total - idle) / total
