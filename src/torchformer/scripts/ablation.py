"""Ablations as one command: a base run of an example script and its variants, each with several seeds, in a table.

An ablation is a base command (an example script and its flags, e.g. ``generate_enwik8.py --preset cpu``) and a
list of **variants**, each a name and the flags it adds (``--positions learned``), run with every seed. Every run
is one call of the script in a folder of its own (``OUT/runs/<variant>/seed-<s>``) with ``--out`` and
``--checkpoint`` there, so the harness inherits the scripts' exact resume: kill it anywhere, start it again, and the
finished runs are kept (their ``record.json``), the interrupted one resumes from its checkpoint, and the rest run.
Several runs can go at once (``jobs``), the CPU threads split between them.

Each run's record holds its command, its results (the script's ``results.json``), its validation curve (the
script's ``log.csv``), the code commit, the machine, the torch version, its minutes and its parameters (all, and
the active ones: a mixture of experts' skipped experts left out). :func:`summarize` turns the records into one row
per variant: the metric's mean and spread over the seeds, the difference from the base with the spread of the
per-seed differences, tokens/s, parameters and minutes; a run made at another commit than most is marked.

    ablation = read_ablation("examples/ablations/enwik8-cpu.toml")
    records = run_ablation(ablation, Path("runs/ablation"), jobs=2, threads=2)
    write_outputs(Path("runs/ablation"), ablation, records)   # ablation.md, ablation.json, curves.png

The file (TOML)::

    script = "../generate_enwik8.py"     # relative to the file
    base = ["--preset", "cpu"]
    seeds = [1, 2]
    metric = "bpb"                       # a key of the script's results.json
    curve = "val_bpb"                    # a column of its log.csv, plotted against "step"
    [[variants]]
    name = "learned positions"
    flags = ["--positions", "learned"]

``{seed}`` in a flag stands for the run's seed, for a file made once per seed: ``flags = ["--pretrained",
"runs/pretrain/seed-{seed}/pretrained.pt"]``.
"""

from __future__ import annotations

import csv
import ctypes
import json
import math
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import time
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from torchformer.train.flops import active_matmul_parameters, matmul_parameters
from torchformer.train.loading import load_model

__all__ = ["Ablation", "Variant", "markdown_table", "read_ablation", "run_ablation", "run_folder", "summarize",
           "write_outputs"]

BASE = "base"  # the name of the base run's variant (no flags of its own)
SEED = "{seed}"  # in a flag, stands for the run's seed: a file made once per seed (a pretrained model)


@dataclass(frozen=True)
class Variant:
    """One arm of an ablation: a name and the flags it adds to the base command (the later flag wins).

    Args:
        name: the variant's name in the table (and, lower-cased, its folder's).
        flags: the command-line flags it adds after the base ones; ``{seed}`` in a flag stands for the run's seed
            (``"runs/pretrain/seed-{seed}/pretrained.pt"``: a file made once per seed).
    """

    name: str
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Ablation:
    """A base command, its variants and the seeds each runs with.

    Args:
        script: the example script every run calls.
        base: its flags for every run (a preset, a step or time budget, data options); ``{seed}`` as in
            :class:`Variant`.
        variants: the arms; the first is the base itself (``Variant("base")``, added by :func:`read_ablation`).
        seeds: each variant runs once per seed (``--seed S``).
        metric: the key of the script's ``results.json`` the table compares (``"bpb"``, ``"accuracy"``).
        curve: the column of the script's ``log.csv`` plotted against ``"step"``; ``None``: no curves.
    """

    script: Path
    base: tuple[str, ...]
    variants: tuple[Variant, ...]
    seeds: tuple[int, ...] = (1,)
    metric: str = "bpb"
    curve: Optional[str] = "val_bpb"


def read_ablation(path: str | os.PathLike) -> Ablation:
    """The ablation a TOML file describes (see the module docstring); the base run comes first.

    Args:
        path: the file; ``script`` in it is relative to the file's folder.

    Returns:
        The ablation (an :class:`Ablation`), ``variants[0]`` the base.

    Raises:
        FileNotFoundError: the file or its script does not exist.
        ValueError: a key is missing, unknown or of the wrong type, two variants share a name, or a seed repeats.
    """
    path = Path(path)
    with open(path, "rb") as f:
        try:
            data = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{path}: not a TOML file ({e})") from None
    unknown = sorted(set(data) - {"script", "base", "seeds", "metric", "curve", "variants"})
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {', '.join(unknown)}; the keys are script, base, seeds, metric, "
                         f"curve and variants")
    if not isinstance(data.get("script"), str):
        raise ValueError(f"{path}: script must be the path of an example script (a string), got "
                         f"{data.get('script')!r}")
    script = (path.parent / data["script"]).resolve()
    if not script.is_file():
        raise FileNotFoundError(f"{path}: script {data['script']} is not a file ({script})")
    base = _flags(data.get("base", []), f"{path}: base")
    seeds = data.get("seeds", [1])
    if not isinstance(seeds, list) or not seeds or not all(type(s) is int and s >= 0 for s in seeds):
        raise ValueError(f"{path}: seeds must be a non-empty list of ints >= 0, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"{path}: seeds must differ, got {seeds}")
    variants = [Variant(BASE)]
    for i, v in enumerate(data.get("variants", [])):
        if not isinstance(v, dict) or set(v) - {"name", "flags"} or not isinstance(v.get("name"), str):
            raise ValueError(f"{path}: variants[{i}] must be a table with a name (a string) and flags, got {v!r}")
        variants.append(Variant(v["name"], _flags(v.get("flags", []), f"{path}: variants[{i}].flags")))
    names = [_slug(v.name) for v in variants]
    if len(set(names)) != len(names):
        twice = next(v.name for v in variants if names.count(_slug(v.name)) > 1)
        raise ValueError(f"{path}: two variants share the name {twice!r} (names are compared as folder names)")
    for key, default in (("metric", "bpb"), ("curve", "val_bpb")):
        if not isinstance(data.get(key, default), str):
            raise ValueError(f"{path}: {key} must be a string, got {data[key]!r}")
    return Ablation(script, base, tuple(variants), tuple(seeds), data.get("metric", "bpb"),
                    data.get("curve", "val_bpb"))


def _flags(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(f, str) for f in value):
        raise ValueError(f"{where} must be a list of strings (command-line flags), got {value!r}")
    for flag in value:  # a misspelt placeholder would reach the script as it is, hours into an ablation
        other = re.search(r"\{[^{}]*\}", flag.replace(SEED, ""))
        if other:
            raise ValueError(f"{where}: {flag!r} holds {other.group()}; the one placeholder is {SEED} (the run's "
                             f"seed)")
    return tuple(value)


def _slug(name: str) -> str:
    """A variant's folder name: lower case, runs of other characters as one ``-``."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "variant"


def run_folder(out: Path, variant: Variant, seed: int) -> Path:
    """Where a run writes: ``out/runs/<variant>/seed-<seed>``.

    Args:
        out: the ablation's folder.
        variant: the run's variant.
        seed: the run's seed.

    Returns:
        The run's folder (not created here).
    """
    return Path(out) / "runs" / _slug(variant.name) / f"seed-{seed}"


def _command(ablation: Ablation, variant: Variant, seed: int, folder: Path, threads: int) -> list[str]:
    """The run's command line: the script, the base flags, the variant's (``{seed}`` in one replaced by the seed),
    then the seed, folders and threads."""
    flags = [flag.replace(SEED, str(seed)) for flag in (*ablation.base, *variant.flags)]
    return [sys.executable, str(ablation.script), *flags, "--seed", str(seed),
            "--out", str(folder), "--checkpoint", str(folder / "checkpoints"), "--threads", str(threads)]


def run_ablation(ablation: Ablation, out: str | os.PathLike, *, jobs: int = 1, threads: Optional[int] = None,
                 echo: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Run every variant with every seed that has no record yet, ``jobs`` at a time; the records of all of them.

    A run killed with the harness (which takes its runs with it) resumes from its checkpoint at the next call; a
    run that fails is reported and left without a record (the next call tries it again).

    Args:
        ablation: what to run.
        out: the folder of the runs and the outputs.
        jobs: runs at once.
        threads: CPU threads in all, split evenly between the jobs (at least 1 each); ``None``: ``jobs``.
        echo: where progress lines go.

    Returns:
        The records of the finished runs, in the order of the variants and seeds.

    Raises:
        ValueError: ``jobs`` or ``threads`` is not a positive int, or another harness is running one of the runs.
    """
    if type(jobs) is not int or jobs < 1:
        raise ValueError(f"jobs must be a positive int, got {jobs!r}")
    threads = jobs if threads is None else threads
    if type(threads) is not int or threads < 1:
        raise ValueError(f"threads must be a positive int or None, got {threads!r}")
    per_job = max(1, threads // jobs)
    todo = [(v, s) for v in ablation.variants for s in ablation.seeds
            if not (run_folder(Path(out), v, s) / "record.json").is_file()]
    echo(f"{len(ablation.variants) * len(ablation.seeds) - len(todo)} run(s) done, {len(todo)} to run, {jobs} at a "
         f"time with {per_job} thread(s) each")
    running: list[tuple[Variant, int, subprocess.Popen, float]] = []
    failed = []
    while todo or running:
        while todo and len(running) < jobs:
            variant, seed = todo.pop(0)
            running.append((variant, seed, _start(ablation, variant, seed, Path(out), per_job, echo), time.time()))
        time.sleep(0.2)
        for entry in list(running):
            variant, seed, job, started = entry
            if job.poll() is None:
                continue
            running.remove(entry)
            folder = run_folder(Path(out), variant, seed)
            (folder / "running").unlink(missing_ok=True)
            if job.returncode != 0:
                failed.append((variant.name, seed))
                echo(f"FAILED {variant.name}, seed {seed} (exit {job.returncode}): see {folder / 'output.txt'}")
                continue
            record = _make_record(ablation, variant, seed, folder, time.time() - started)
            _write_json(folder / "record.json", record)
            echo(f"done {variant.name}, seed {seed}: {ablation.metric} {record['metric']}")
    if failed:
        echo(f"{len(failed)} run(s) failed: {failed}; run again to retry them")
    return read_records(ablation, Path(out))


def _start(ablation: Ablation, variant: Variant, seed: int, out: Path, threads: int,
           echo: Callable[[str], None]) -> subprocess.Popen:
    folder = run_folder(out, variant, seed)
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / "running"
    if lock.is_file():
        pid = int(lock.read_text().split()[0] or 0)
        if pid and _alive(pid):
            raise ValueError(f"{folder} is being run by another harness (pid {pid}): wait for it, or stop it")
    lock.write_text(f"{os.getpid()}\n")
    resumed = (folder / "checkpoints").is_dir() and any((folder / "checkpoints").iterdir())
    echo(f"{'resuming' if resumed else 'starting'} {variant.name}, seed {seed} in {folder}")
    output = open(folder / "output.txt", "a")  # noqa: SIM115 - the child holds it; closed when the parent exits
    return subprocess.Popen(_command(ablation, variant, seed, folder, threads), stdout=output,
                            stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)


def _die_with_parent() -> None:
    """In the child, before the script starts: on Linux, be killed when the harness dies (even by ``kill -9``), so
    a restarted harness never finds a run still going on its own."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return pid != os.getpid()


def _make_record(ablation: Ablation, variant: Variant, seed: int, folder: Path, seconds: float) -> dict[str, Any]:
    """A finished run's record: command, results, curve, commit, machine, versions, minutes, parameters.

    Args:
        ablation: the ablation the run belongs to.
        variant: its variant.
        seed: its seed.
        folder: its folder (the script wrote ``results.json``, ``log.csv`` and ``model.pt`` there).
        seconds: the wall time of this last call of the script (a resumed run's first part is not in it; the
            script's own ``elapsed_s`` or ``wall_seconds``, when it has one, counts all of it).

    Returns:
        A JSON-ready dict.

    Raises:
        ValueError: the script wrote no ``results.json``, or it lacks the metric.
    """
    results_file = folder / "results.json"
    if not results_file.is_file():
        raise ValueError(f"{folder}: the run ended without results.json")
    results = json.loads(results_file.read_text())
    if ablation.metric not in results:
        raise ValueError(f"{results_file} has no {ablation.metric!r} (metric): its keys are {', '.join(results)}")
    parameters, active = _count_parameters(folder / "model.pt")
    script_seconds = results.get("elapsed_s", results.get("wall_seconds"))
    return {
        "variant": variant.name, "seed": seed, "flags": list(variant.flags),
        "command": _command(ablation, variant, seed, folder, 0)[1:-2],  # without the interpreter and threads
        "metric": results[ablation.metric], "results": results,
        "curve": _read_curve(folder / "log.csv", ablation.curve),
        "minutes": (script_seconds if script_seconds is not None else seconds) / 60,
        "tokens_per_s": results.get("tokens_per_s"), "parameters": parameters, "active_parameters": active,
        "commit": _code_commit(ablation.script.parent),
        "machine": {"system": platform.platform(), "processor": _processor(), "cpus": os.cpu_count()},
        "torch": torch.__version__, "python": platform.python_version(),
    }


def _processor() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux: two x86_64 machines can differ twofold in speed), else
    what the platform module knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _count_parameters(model_file: Path) -> tuple[Optional[int], Optional[int]]:
    """``(parameters, active parameters)`` of a run's final model, each tied tensor once; ``None``s without one.

    The active ones leave out the weights a token skips (a mixture's unused experts), as
    :func:`~torchformer.train.flops.active_matmul_parameters` counts them; a model that is not a torchformer model
    (the LSTM baseline) counts all.
    """
    if not model_file.is_file():
        return None, None
    state = torch.load(model_file, map_location="cpu", weights_only=True, mmap=True)["model"]  # the weights
    seen, total = set(), 0
    for tensor in state.values():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key not in seen:
            seen.add(key)
            total += tensor.numel()
    try:
        model = load_model(model_file)
    except (KeyError, ValueError, TypeError):  # no model config in the file: not a torchformer model
        return total, total
    return total, total - (matmul_parameters(model) - active_matmul_parameters(model))


def _read_curve(log: Path, column: Optional[str]) -> list[tuple[int, float]]:
    """``(step, value)`` of each row of ``log`` with a value in ``column``; empty without a log or a column."""
    if column is None or not log.is_file():
        return []
    with open(log, newline="", encoding="utf-8") as f:
        return [(int(r["step"]), float(r[column])) for r in csv.DictReader(f) if r.get(column)]


def _code_commit(folder: Path) -> Optional[str]:
    """The git commit of the code in ``folder``, with ``+dirty`` when files differ from it; ``None`` outside git."""
    def git(*args: str) -> Optional[str]:
        try:
            done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return None
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return commit[:12] + ("+dirty" if dirty else "")


def read_records(ablation: Ablation, out: Path) -> list[dict[str, Any]]:
    """The records of the finished runs in ``out``, in the order of the variants and seeds.

    Args:
        ablation: the ablation.
        out: its folder.

    Returns:
        One dict per finished run (its ``record.json``).
    """
    records = []
    for v in ablation.variants:
        for s in ablation.seeds:
            path = run_folder(out, v, s) / "record.json"
            if path.is_file():
                records.append(json.loads(path.read_text()))
    return records


def _spread(values: Sequence[float]) -> Optional[float]:
    """The sample standard deviation (``n - 1``), ``None`` for fewer than two values."""
    return statistics.stdev(values) if len(values) > 1 else None


def summarize(ablation: Ablation, records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per variant: the metric over its seeds, its difference from the base, speed, size, time, commits.

    ``spread`` is the sample standard deviation over the seeds; ``difference`` is the mean of the per-seed
    differences from the base (over the seeds both have), ``difference_spread`` their standard deviation: paired by
    seed, so what the seeds share (the data order, the initial weights) cancels. ``other_commit`` lists the seeds
    of runs made at another commit than most runs of the ablation.

    Args:
        ablation: the ablation.
        records: the finished runs' records (:func:`read_records`).

    Returns:
        A list of dicts, the base first; a variant without finished runs has ``runs == 0`` and ``None`` figures.
    """
    commits = Counter(r["commit"] for r in records)
    usual = commits.most_common(1)[0][0] if commits else None
    by_variant = {v.name: {r["seed"]: r for r in records if r["variant"] == v.name} for v in ablation.variants}
    base = by_variant[BASE]
    rows = []
    for v in ablation.variants:
        runs = by_variant[v.name]
        values = [r["metric"] for r in runs.values()]
        common = [s for s in runs if s in base]
        differences = [runs[s]["metric"] - base[s]["metric"] for s in common]

        def mean(key: str) -> Optional[float]:
            known = [r[key] for r in runs.values() if r.get(key) is not None]
            return statistics.mean(known) if known else None

        rows.append({
            "variant": v.name, "flags": list(v.flags), "runs": len(runs), "seeds": sorted(runs),
            "mean": statistics.mean(values) if values else None, "spread": _spread(values),
            "difference": statistics.mean(differences) if differences and v.name != BASE else None,
            "difference_spread": _spread(differences) if v.name != BASE else None,
            "tokens_per_s": mean("tokens_per_s"), "parameters": mean("parameters"),
            "active_parameters": mean("active_parameters"), "minutes": mean("minutes"),
            "other_commit": sorted(s for s, r in runs.items() if r["commit"] != usual),
        })
    return rows


def _number(value: Optional[float], digits: int) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:,.{digits}f}"


def markdown_table(ablation: Ablation, rows: Sequence[dict[str, Any]], *, digits: int = 4) -> str:
    """The table of :func:`summarize`'s rows in Markdown, with a line on what the columns mean.

    Args:
        ablation: the ablation (its metric, seeds and base command).
        rows: :func:`summarize`'s rows.
        digits: the metric's decimals.

    Returns:
        The Markdown text, ending in a newline.
    """
    lines = [f"| variant | flags | seeds | {ablation.metric} (mean ± sd) | vs base (± sd) | tokens/s | parameters "
             f"| active | minutes |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    marked = False
    for row in rows:
        spread = "" if row["spread"] is None else f" ± {_number(row['spread'], digits)}"
        if row["difference"] is None:
            versus = "-"
        else:
            versus = f"{row['difference']:+.{digits}f}" + (
                "" if row["difference_spread"] is None else f" ± {_number(row['difference_spread'], digits)}")
        mark = " †" if row["other_commit"] else ""
        marked = marked or bool(mark)
        flags = " ".join(row["flags"]) or "(the base)"
        lines.append(f"| {row['variant']}{mark} | `{flags}` | {row['runs']} | {_number(row['mean'], digits)}{spread} "
                     f"| {versus} | {_number(row['tokens_per_s'], 0)} | {_number(row['parameters'], 0)} "
                     f"| {_number(row['active_parameters'], 0)} | {_number(row['minutes'], 1)} |")
    note = (f"\nMean and sample standard deviation over the seeds {', '.join(map(str, ablation.seeds))}; the "
            f"difference from the base is the mean of the per-seed differences. Base command: `{ablation.script.name} "
            f"{' '.join(ablation.base)}`.")
    if marked:
        note += " †: some of the variant's runs were made at another code commit than most."
    return "\n".join(lines) + "\n" + note + "\n"


def write_outputs(out: str | os.PathLike, ablation: Ablation, records: Sequence[dict[str, Any]]) -> list[Path]:
    """``ablation.md``, ``ablation.json`` (rows and records) and ``curves.png`` (without matplotlib: none) in ``out``.

    Args:
        out: the ablation's folder.
        ablation: the ablation.
        records: the finished runs' records (:func:`read_records`).

    Returns:
        The files written.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows = summarize(ablation, records)
    written = [out / "ablation.md", out / "ablation.json"]
    written[0].write_text(markdown_table(ablation, rows))
    _write_json(written[1], {"script": str(ablation.script), "base": list(ablation.base), "metric": ablation.metric,
                             "seeds": list(ablation.seeds), "rows": rows, "records": list(records)})
    if ablation.curve and _plot(out / "curves.png", ablation, records):
        written.append(out / "curves.png")
    return written


def _plot(path: Path, ablation: Ablation, records: Sequence[dict[str, Any]]) -> bool:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return False
    fig = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    colours = {v.name: f"C{i % 10}" for i, v in enumerate(ablation.variants)}
    for record in records:
        if record["curve"]:
            steps, values = zip(*record["curve"])
            first = record["seed"] == min(r["seed"] for r in records if r["variant"] == record["variant"])
            ax.plot(steps, values, color=colours[record["variant"]], alpha=0.8,
                    label=record["variant"] if first else None)
    ax.set_xlabel("step")
    ax.set_ylabel(ablation.curve)
    ax.set_title(f"{ablation.script.name}: one line per run")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def _write_json(path: Path, data: Any) -> None:
    """Written whole or not at all: a temporary file, then a rename."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(temporary, path)
