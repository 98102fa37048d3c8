"""Command-line checks the example scripts share: every flag is checked before anything is loaded or trained.

A script lists the valid values of its flags as ``{dest: (test, what the flag must be)}`` and calls
:func:`check_flags` after parsing, so a bad value is one usage error naming the flag (``--flag must be ..., got
...``) and never costs a training run or ends in a traceback::

    CHECKS = {"batch_size": POSITIVE_INT, "learn_rate": POSITIVE, "out": WRITABLE_FOLDER}
    args = parser.parse_args(argv)
    check_flags(parser, args, CHECKS)

:func:`preset_flags` adds flags whose help says their default, or what each ``--preset`` sets them to, and
:func:`preset_epilog` writes each preset out as flags, so ``--help`` tells a user what a run will do without reading
the source; :func:`choose_threads` picks the CPU threads.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import torch
from torch import nn

Check = tuple[Callable[[Any], bool], str]


def writable_folder(path: object) -> bool:
    """Whether ``path`` is a folder this process can write in, or one it can create (not a file, nor under one).

    Args:
        path: a str or path-like, as a ``--out`` flag gives it.

    Returns:
        True when ``path`` is a writable folder, or when its nearest existing ancestor is one (so ``mkdir -p``
        would succeed); False for a file, a path under a file, or a dangling link.
    """
    path = Path(path)  # type: ignore[arg-type]
    while not path.exists():
        if path.is_symlink():  # a dangling link: mkdir would fail
            return False
        path = path.parent
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def files_in_the_way(folder: object, names: Sequence[str]) -> list[Path]:
    """The paths among ``folder / name`` where a run could not write its file: something else (a folder) is there.

    Check them before training, so a run does not end in an error after hours, when it writes its results.

    Args:
        folder: the output folder (``--out``); it need not exist yet.
        names: the files the run writes into it, e.g. ``["log.csv", "model.pt", "results.json"]``.

    Returns:
        The paths that exist and are not files (empty when the run can write every one), in the order of ``names``.
    """
    folder = Path(folder)  # type: ignore[arg-type]
    return [folder / name for name in names if (folder / name).exists() and not (folder / name).is_file()]


def check_outputs(parser: argparse.ArgumentParser, folder: object, names: Sequence[str]) -> None:
    """Stop with a usage error when one of the files a run writes into ``folder`` is taken by something else.

    Args:
        parser: the script's parser, which prints the usage message.
        folder: the output folder (``--out``); it need not exist yet.
        names: the files the run writes into it.

    Raises:
        SystemExit: :func:`files_in_the_way` found one (exit status 2, after the usage message naming it).
    """
    if blocked := files_in_the_way(folder, names):
        parser.error(f"--out {folder}: {blocked[0]} is not a file (a folder?), and this run writes a file there: "
                     f"move it away or choose another --out")


def remove_interrupted_saves(*folders: Optional[object]) -> None:
    """Delete what saves killed mid-write left in each folder (``None`` skipped), and say so for each file.

    Checkpoints and the final model are written atomically, through a temporary file that a kill leaves behind
    (:func:`~torchformer.train.checkpoint.remove_stale_temporaries` tells those from a save in progress).

    Args:
        *folders: the run's output and checkpoint folders.
    """
    from torchformer.train.checkpoint import remove_stale_temporaries  # the checkpoint module imports torch's own

    for folder in folders:
        for path in remove_stale_temporaries(folder) if folder is not None else ():
            print(f"removed {path.name}, left by a save that was interrupted")


def utf8_text(value: str) -> str:
    """An ``argparse`` type for a flag that takes text (a prompt, a review): the text, if it is valid UTF-8.

    Python hands bytes of the command line that are not UTF-8 to the program as lone surrogates ("\\udcff" for
    the byte 0xff); a tokenizer would fail on them deep inside, or a word tokenizer read them as an unknown word.

    Args:
        value: the flag's text, as ``sys.argv`` holds it.

    Returns:
        ``value`` unchanged.

    Raises:
        argparse.ArgumentTypeError: ``value`` holds a byte that is not UTF-8 (the message names it and where).
    """
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        char = value[e.start]
        byte = f"the byte 0x{ord(char) - 0xDC00:02x}" if 0xDC80 <= ord(char) <= 0xDCFF else repr(char)
        raise argparse.ArgumentTypeError(f"not valid UTF-8 text: {byte} at character {e.start} of {value!r}; "
                                         f"pass UTF-8 text") from None
    return value


def available_memory(device: torch.device | str) -> Optional[int]:
    """Bytes of memory free for new tensors on ``device``; ``None`` where it cannot be told.

    On a GPU its free memory; on the CPU the machine's available RAM (``MemAvailable`` of ``/proc/meminfo``, so
    ``None`` on systems without it).

    Args:
        device: where the model will live.

    Returns:
        The free bytes, or ``None``.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024  # the file counts kB
    return None


def check_model_fits(build: Callable[[], nn.Module], device: torch.device | str, *, copies: float = 4) -> None:
    """Size the model on the ``meta`` device (no memory); stop if ``copies`` of its weights do not fit on ``device``.

    A typo such as ``-M 100000000`` (learned positions for a hundred million tokens) would otherwise allocate tens of GB
    and get the process killed by the operating system, with no message. Training holds about four copies of the weights
    (the weights, their gradients and Adam's two moments), before any activation: a lower bound. Sharded over ``n``
    processes (FSDP), each holds the whole model while it is built, then a share of the rest: ``copies=1 + 3 / n``.

    Args:
        build: makes the model (the same call that will build it for real), e.g. ``lambda: GTransformer(...)``.
        device: where it will train.
        copies: how many copies of the weights training needs at least (on each process).

    Raises:
        MemoryError: they need more than :func:`available_memory` says is free; the message gives both figures.
    """
    with torch.device("meta"):
        model = build()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    free = available_memory(device)
    if free is not None and copies * weights > free:
        count = sum(p.numel() for p in model.parameters())
        raise MemoryError(f"the model has {count:,} parameters ({weights / 2**30:.1f} GiB); training needs at least "
                          f"{copies:g} times that ({copies * weights / 2**30:.1f} GiB: weights, gradients and Adam's "
                          f"two moments), but {device} has {free / 2**30:.1f} GiB free: choose smaller sizes")


POSITIVE_INT: Check = (lambda v: v >= 1, "a positive int")
POSITIVE: Check = (lambda v: 0 < v < math.inf, "a positive number")
WRITABLE_FOLDER: Check = (writable_folder, "a folder this user can write in or create (not a file)")


def flags_as_saved(saved: Mapping[str, Any], flags: Mapping[str, Any]) -> dict[str, Any]:
    """A script's flags saved in a checkpoint, with ``positions`` as the model's record reads it.

    A script keeps its flags in the checkpoint's ``extra``, next to the model's record. In a checkpoint of torchformer
    before 0.5 both say ``"rotary"``, for the layout this torchformer calls ``"rotary_interleaved"``; the record is
    read as that (:data:`torchformer.saving.CONFIG_VERSION`), and a resumed or fine-tuned model must be built the
    same way, or it would compute something else with the same weights.

    Args:
        saved: what :func:`~torchformer.train.checkpoint.read_checkpoint` returned (its ``"config"``: the model's
            config, or ``None``).
        flags: the script's saved flags (a dict with or without ``"positions"``).

    Returns:
        A copy of ``flags``, its ``"positions"`` (if it has one) taken from the model's config.
    """
    config = saved.get("config")
    if config is None or "positions" not in flags:
        return dict(flags)
    return {**flags, "positions": config.positions}


def check_flags(parser: argparse.ArgumentParser, args: argparse.Namespace, checks: Mapping[str, Check]) -> None:
    """Stop with a usage error naming the first flag whose value fails its check.

    Flags that are ``None`` (not given, and no preset set them) are not checked.

    Args:
        parser: the script's parser, which prints the usage message.
        args: the parsed flags.
        checks: ``{dest: (test, what the flag must be)}``, e.g. ``{"batch_size": POSITIVE_INT}``; ``test`` takes the
            value and returns True when it is valid.

    Raises:
        SystemExit: a flag's value fails its test (exit status 2, after the usage message).
    """
    for name, (valid, must) in checks.items():
        value = getattr(args, name)
        if value is not None and not valid(value):
            parser.error(f"--{name.replace('_', '-')} must be {must}, got {value}")


def preset_flags(parser: argparse.ArgumentParser,
                 presets: Mapping[str, Mapping[str, Any]]) -> Callable[..., argparse.Action]:
    """A drop-in for ``parser.add_argument`` that appends to each flag's help what it will be when not given.

    A flag that a preset sets (its ``dest`` is a key of ``presets[name]``) gets ``(--preset cpu: 2000; --preset gpu:
    not set)``; any other flag with a default gets ``(default: ...)``. Flags whose help is ``argparse.SUPPRESS``
    and switches that default to off are left as they are.

    Args:
        parser: the script's parser.
        presets: ``{preset name: {dest: value}}``, what each ``--preset`` sets.

    Returns:
        A function with ``parser.add_argument``'s signature: it adds the flag to ``parser``, extends its help, and
        returns the ``argparse.Action``.
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
        elif not (action.default is None or action.default is False  # `is`: 0 == False, and a default of 0 is shown
                  or action.default == argparse.SUPPRESS):
            action.help += f" (default: {shown(action.default)})"
        return action

    return add


def as_flag(key: str, value: Any) -> str:
    """How a preset's setting is typed on the command line: ``--num-batches 2000``, ``--kqnorm``, ``--no-kqnorm``.

    Args:
        key: the flag's ``dest``; its underscores become hyphens.
        value: the setting; a bool becomes the switch alone (``--name`` or ``--no-name``, as
            ``argparse.BooleanOptionalAction`` reads them), anything else follows the flag as ``str(value)``.

    Returns:
        The flag as typed.
    """
    name = key.replace("_", "-")
    return (f"--{name}" if value else f"--no-{name}") if isinstance(value, bool) else f"--{name} {value}"


def preset_epilog(presets: Mapping[str, Mapping[str, Any]], *, width: int = 100) -> str:
    """The end of a script's ``--help``: each preset written out as the flags it stands for.

    The lines are wrapped at ``width`` without ever splitting a flag from its value. Use it with
    ``argparse.RawDescriptionHelpFormatter``, which keeps these lines as they are.

    Args:
        presets: ``{preset name: {dest: value}}``, what each ``--preset`` sets.
        width: the longest line, in characters (a single flag longer than that still gets its line).

    Returns:
        The text, lines joined by newlines, for ``ArgumentParser(epilog=...)``.
    """
    lines = ["presets (the flags you do not give; an explicit flag always wins):"]
    for name, preset in presets.items():
        line = f"  --preset {name} means"
        for key, value in preset.items():
            typed = as_flag(key, value)
            if len(line) + 1 + len(typed) > width:
                lines.append(line)
                line = "   "
            line += " " + typed
        lines.append(line)
    return "\n".join(lines)


def choose_threads(requested: Optional[int] = None) -> tuple[int, str]:
    """The CPU threads a script should give torch, and why: ``(threads, reason)``.

    ``requested`` (a ``--threads`` flag) wins. Otherwise the cores this process may run on, less the ones other
    programs keep busy right now (measured over a quarter of a second), and at least 1: PyTorch's own default uses
    every core, and its threads then wait for the cores other programs hold (measured in examples/README.md,
    "Threads").

    Args:
        requested: the thread count the user asked for, or ``None`` to choose. A request above the usable cores is
            granted, with a reason that says it will be slower.

    Returns:
        ``(threads, reason)``: the count for ``torch.set_num_threads``, and a short explanation for the script's
        first line of output.
    """
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    cores = len(allowed) if allowed is not None else (os.cpu_count() or 1)
    if requested is not None:
        if requested > cores:  # more threads than cores: they take turns, and every parallel step waits
            return requested, f"--threads; more than the {cores} core(s) this process may use: expect it to be slower"
        return requested, "--threads"
    cores = max(1, min(cores, torch.get_num_threads()))  # torch's default, or OMP_NUM_THREADS when set
    busy = busy_cores(cpus=allowed)
    if busy is None:
        return cores, f"{cores} core(s); --threads overrides"
    threads = max(1, min(cores, round(cores - busy)))
    if threads == cores:
        return threads, f"{cores} core(s), idle; --threads overrides"
    return threads, f"{cores} cores, {busy:.1f} busy with other programs; --threads overrides"


def _cpu_times() -> dict[int, list[int]]:
    """Per core, the time it spent in each state since boot (Linux's ``/proc/stat``, lines ``cpuN user nice system
    idle iowait ...``, in ticks)."""
    with open("/proc/stat") as f:
        return {int(line[3:].split()[0]): [int(v) for v in line.split()[1:]]
                for line in f if line.startswith("cpu") and line[3].isdigit()}


def busy_cores(seconds: float = 0.25, *, cpus: Optional[Sequence[int]] = None) -> Optional[float]:
    """How many of the cores ``cpus`` other programs keep busy, measured over the next ``seconds``.

    This process sleeps meanwhile, and reads Linux's ``/proc/stat`` before and after. Of the time that passes on a core
    while we sleep, the share it did not spend idle (or waiting for disks) is the work of other programs; summed over
    the cores, it counts busy cores. Only the cores this process may run on matter: a busy core it cannot use slows none
    of its threads.

    Args:
        seconds: how long to measure, in seconds.
        cpus: the numbers of the cores to count (e.g. ``os.sched_getaffinity(0)``); ``None``: all.

    Returns:
        The busy cores, from 0 to ``len(cpus)`` (fractions included); ``None`` where ``/proc/stat`` cannot be read
        (not Linux) or lists none of ``cpus``.
    """
    try:
        before = _cpu_times()
        time.sleep(seconds)
        after = _cpu_times()
    except (OSError, ValueError, IndexError):
        return None
    chosen = [c for c in (before if cpus is None else cpus) if c in before and c in after]
    if not chosen:
        return None
    busy = 0.0
    for c in chosen:
        delta = [a - b for a, b in zip(after[c], before[c])]
        total, idle = sum(delta), delta[3] + (delta[4] if len(delta) > 4 else 0)  # user nice system idle iowait
        if total > 0:
            busy += (total - idle) / total
    return busy
