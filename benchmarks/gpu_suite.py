"""Every GPU figure of torchformer from one lent GPU, in named stages that each fit one run of at most 9.5 minutes.

    PYTHONPATH=src python benchmarks/gpu_suite.py --stages tests,decode --out $OUT
    PYTHONPATH=src python benchmarks/gpu_suite.py --stages enwik8 --enwik8-data gpu_data/enwiki.txt.gz --out $OUT
    PYTHONPATH=src python benchmarks/gpu_suite.py --smoke --out /tmp/suite     # every stage at toy sizes, CPU

Stages (``--stages all`` runs them in this order):

* ``tests``:       the CUDA-only tests (``pytest -k cuda``), then the whole suite (stopped at the time limit)
* ``step-small``:  training step, compiled, bf16: emb 256, depth 4 at contexts 256 and 1024, best batch size, MFU
* ``step-enwik8``: the same for the model of the enwik8 GPU preset (emb 512, depth 12, context 1024)
* ``step-768``:    the same for a 12-layer, emb 768, context 1024 model (GPT-2 small's shape, byte vocabulary)
* ``decode``:      tokens/s without cache, with the growing cache, and the compiled static step with CUDA graphs,
                   batch 1 and 16, contexts 256 and 1024
* ``decode-hf``:   ``benchmarks/generate.py --against transformers``: tokens/s of both libraries on the same
                   random GPT-2 and Llama checkpoints, torchformer eager and compiled with CUDA graphs
* ``enwik8``:      ``examples/generate_enwik8.py --preset gpu --compile --minutes 7.5 --final`` on ``--enwik8-data``
* ``imdb``:        ``examples/classify_imdb.py --preset gpu --final`` on ``--imdb-data``
* ``memory``:      peak memory and step time with and without activation checkpointing (``checkpoint_blocks``)
* ``long-context``: causal attention at 1k-8k positions: dense, the fixed pattern as a mask and through flex
* ``long-context-enwik8``: the enwik8 example at context 2048 dense, 1024 + memory 1024, and the fixed pattern
* ``packed``:      ``benchmarks/packed.py``: training steps on packed rows (a dense document mask, and flex attention's
                   block mask) against length-bucketed padded batches of the same documents
* ``ablation``:    ``examples/ablate.py`` on ``--ablation`` (an ablation file): the runs that fit, and their table

Each stage appends its figures (the commands, device, torch version, date and numbers) to ``OUT/report.md`` and
``OUT/results.json`` and the output of its commands to ``OUT/log.txt``: three files, whatever the stages. The report
also goes to stdout. ``--budget`` is the time this call may take (default 570 s, the 9.5 minutes of one run): a stage
that cannot finish in what is left is skipped with that reason, and a command that runs past it is interrupted and
reported as such. A stage whose data are missing is skipped with the reason, not a crash.

``--publish DIR`` (no GPU needed) copies the stages of ``DIR/results.json`` into the results page
(``docs/gpu-results.md``); publishing the same results twice changes nothing. See docs/gpu-suite.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Callable, Optional

import torch

from torchformer.scripts.ablation import markdown_table, read_ablation, read_records, summarize
from torchformer.train.flops import peak_bf16_tflops

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "gpu-results.md"
BEGIN, END = "<!-- gpu-suite results: begin -->", "<!-- gpu-suite results: end -->"
NO_RUN_YET = "No GPU run of the suite yet."
LOG_CHARS = 100_000  # of each command's output kept in log.txt (the end; tqdm bars are long)


@dataclasses.dataclass
class Stage:
    """A named stage: ``run(suite, record)`` fills ``record`` and returns the Markdown of its figures."""

    name: str
    about: str
    seconds: int  # about how long it takes on one H100, compilation included; a call must have this much left
    run: Callable[["Suite", dict], str]


class Skip(Exception):
    """A stage that cannot run here (missing data or option): the message says why."""


class Suite:
    """What the stages share: where to write, the device, the time left, and how to run a command."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.smoke, self.out = args, args.smoke, args.out
        self.device = "cpu" if args.smoke else "cuda"
        self.start = time.monotonic()
        self.work = Path(tempfile.mkdtemp(prefix="gpu_suite_"))  # outputs of the examples: large, not kept
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(ROOT / "src")] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))}
        if torch.cuda.is_available() and not args.smoke:
            self.device_name = torch.cuda.get_device_name()
            self.peak = peak_bf16_tflops(self.device_name)
        else:
            self.device_name = f"{platform.processor() or platform.machine()} CPU ({os.cpu_count()} cores)"
            self.peak = None

    def left(self) -> float:
        """Seconds left of ``--budget``."""
        return self.args.budget - (time.monotonic() - self.start)

    def run(self, record: dict, cmd: list[str], *, reserve: float = 15.0,
            env: Optional[dict[str, str]] = None) -> tuple[int, str]:
        """Run ``cmd`` in the repository root, with ``env`` added to the environment; returns (exit status, output).
        It is interrupted (SIGINT, so pytest and the examples report what they have) ``reserve`` seconds before the
        budget ends, then killed."""
        shown = " ".join(shlex.quote(os.path.relpath(c, ROOT) if c.startswith(str(ROOT)) else c)
                         for c in ["python", *cmd[1:]])
        record["commands"].append(shown)
        limit = self.left() - reserve
        if limit <= 0:
            record["notes"].append(f"not run, no time left in --budget: {shown}")
            return -1, ""
        tic = time.monotonic()
        # SIGINT back to its default in the child: a suite started in the background (`nohup ... &`) has it ignored,
        # and a Python stage that inherits "ignored" never raises KeyboardInterrupt, so it could not report.
        process = subprocess.Popen(cmd, cwd=ROOT, env={**self.env, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, errors="replace", start_new_session=True,
                                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            output, _ = process.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGINT)  # the whole group: step.py's own subprocesses too
            try:
                output, _ = process.communicate(timeout=min(30.0, reserve))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                output, _ = process.communicate()
            record["notes"].append(f"interrupted after {limit:.0f} s (--budget): {shown}")
            record["timed_out"] = True
        seconds = time.monotonic() - tic
        with open(self.out / "log.txt", "a", encoding="utf-8") as log:
            kept = output if len(output) <= LOG_CHARS else "[...]\n" + output[-LOG_CHARS:]
            log.write(f"\n===== {record['stage']}: {shown}\n===== exit status {process.returncode}, "
                      f"{seconds:.0f} s\n{kept}\n")
        return process.returncode, output

    def python(self, script: str, *flags: str) -> list[str]:
        return [sys.executable, str(ROOT / script), *flags]


# ------------------------------------------------------------------------------------------------------ stages --


def run_tests(suite: Suite, record: dict) -> str:
    """The CUDA-only tests (named ``*cuda*``), then the whole suite in what time is left."""
    # The whole suite in 8 processes where pytest-xdist is installed (the GPU machine's image has it): in one process
    # it got through 379 of 1,560 tests in the 5 minutes left (H100 machine, 2026-11-26). A file stays in one
    # process (--dist loadfile: module fixtures are built once), and each process gets 2 threads, not all 16.
    parallel = ["-n", "8", "--dist", "loadfile"] if importlib.util.find_spec("xdist") and not suite.smoke else []
    selections = {"CUDA tests (-k cuda)": ["tests", "-k", "cuda"], "whole suite": [*parallel, "tests"]}
    if suite.smoke:  # the same commands on two quick selections (the CUDA tests skip on a CPU)
        selections = {"CUDA tests (-k cuda)": ["tests/test_host_syncs.py", "-k", "cuda"],
                      "whole suite": ["tests/test_flops.py", "-k", "peak"]}
    lines = ["| selection | passed | failed | errors | skipped | seconds | failing tests |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for name, selection in selections.items():
        xml = suite.work / f"{len(record['figures'])}.xml"
        tic = time.monotonic()
        status, output = suite.run(record, [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                                            "--continue-on-collection-errors", f"--junitxml={xml}", *selection],
                                   env={"OMP_NUM_THREADS": "2"} if "-n" in selection else None)
        counts = pytest_counts(xml, output)
        counts["seconds"] = round(time.monotonic() - tic, 1)
        record["figures"][name] = counts
        if counts["failed"] or counts["errors"] or status not in (0, 5):  # 5: nothing selected
            record["status"] = "failed"
        # As code, which the site lets wrap at its joints (a test's name is one long word).
        failing = ", ".join(f"`{name}`" for name in counts["failing"][:10]) + (" ..." if len(counts["failing"]) > 10
                                                                               else "")
        lines.append(f"| {name} | {counts['passed']} | {counts['failed']} | {counts['errors']} | "
                     f"{counts['skipped']} | {counts['seconds']} | {failing or '-'} |")
    return "\n".join(lines)


def pytest_counts(xml: Path, output: str) -> dict:
    """Passed, failed, errors and skipped from pytest's JUnit XML; from its summary line if there is none."""
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "failing": []}
    try:
        root = ElementTree.parse(xml).getroot()
    except (OSError, ElementTree.ParseError):  # killed before it wrote the file: read the last summary line
        for number, word in re.findall(r"(\d+) (passed|failed|errors?|skipped)", output[-2000:]):
            counts["errors" if word.startswith("error") else word] = int(number)
        return counts
    for case in root.iter("testcase"):
        outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
        key = {"failure": "failed", "error": "errors"}.get(outcome, outcome)
        counts[key] += 1
        if key in ("failed", "errors"):
            counts["failing"].append(f"{case.get('classname', '')}::{case.get('name', '')}")
    return counts


# Sizes of the training-step stages: (emb, heads, depth, GTransformer options, {context: batch sizes to try}).
# Each search starts near the batch size that is known to fit (compiling every size costs up to a minute).
STEP_MODELS = {
    "step-small": (256, 8, 4, {}, {256: [128, 256, 512], 1024: [32, 64, 128]}),
    "step-768": (768, 12, 12, {"prenorm": True}, {1024: [16, 32, 64]}),
    # A top-2-of-8 mixture against the dense network as wide as the two experts a token uses (ff_hidden = 2 h).
    "step-moe": (512, 8, 8, {"prenorm": True, "positions": "rotary", "norm": "rms", "activation": "swiglu",
                             "ff_hidden": 1376}, {1024: [16, 32, 64]}),
}
# The step.py kinds each stage compares, and their flags.
STEP_KINDS = {"step-moe": ["fast", "moe"]}


def enwik8_preset() -> dict:
    """The enwik8 example's GPU preset, read from the script itself so that the two cannot drift apart."""
    spec = importlib.util.spec_from_file_location("generate_enwik8_preset", ROOT / "examples" / "generate_enwik8.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PRESETS["gpu"]


def step_model(name: str) -> tuple[int, int, int, dict, dict[int, list[int]]]:
    if name != "step-enwik8":
        return STEP_MODELS[name]
    p = enwik8_preset()
    options = {"prenorm": True, "dropout": p["dropout"], "kqnorm": p["kqnorm"], "positions": p["positions"],
               "norm": p["norm"], "activation": p["activation"]}  # as the script builds its GTransformer
    return p["embedding"], p["heads"], p["depth"], options, {p["context"]: [32, 64, 128]}


def run_step(suite: Suite, record: dict) -> str:
    """benchmarks/step.py, compiled and in bf16, over batch sizes until one runs out of memory or stops helping."""
    emb, heads, depth, options, batches = step_model(record["stage"])
    extra = ["--device", "cuda", "--bf16", "--compile", "--steps", "20", "--warmup", "5"]
    if suite.smoke:  # toy sizes; one stage compiles with the eager backend (tracing only: inductor takes minutes)
        emb, heads, depth, batches = 32, 2, 1, {32: [2]}
        options = {**options, "ff_hidden": 32} if "ff_hidden" in options else options
        extra = ["--device", "cpu", "--steps", "2", "--warmup", "1", "--threads", "1"]
        extra += ["--compile", "--backend", "eager"] if record["stage"] == "step-small" else []
    if suite.peak:
        extra += ["--peak-tflops", str(suite.peak)]
    lines = [f"Model: emb {emb}, heads {heads}, depth {depth}"
             + "".join(f", {k}={v}" for k, v in options.items()) + "; vocabulary 256.", "",
             "| context | kind | batch | ms/step | tokens/s | MFU | peak memory (MB) | FLOPs/token | note |",
             "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    record["figures"] = {"emb": emb, "heads": heads, "depth": depth, "options": options, "peak_tflops": suite.peak,
                         "rows": []}
    for context, sizes in batches.items():
        out = suite.work / f"{record['stage']}_{context}.json"
        kinds = STEP_KINDS.get(record["stage"], ["fast"])
        if "moe" in kinds:  # each expert half as wide as the dense network
            kinds = [*kinds, "--experts", "8", "--top-k", "2", "--expert-hidden", str(options["ff_hidden"] // 2)]
        flags = ["--emb", str(emb), "--heads", str(heads), "--depth", str(depth), "--kinds", *kinds, "--contexts",
                 str(context), "--batch-sizes", *map(str, sizes), "--json", str(out),
                 "--time-limit", f"{max(1.0, min(suite.left() - 30, STAGES[record['stage']].seconds)):.0f}", *extra]
        # Each stage keeps to its share of the call, so that the stages after it get theirs.
        for key, value in options.items():  # step.py reads each value as JSON, or else as a string
            flags += ["--set", f"{key}={value if isinstance(value, str) else json.dumps(value)}"]
        status, _ = suite.run(record, suite.python("benchmarks/step.py", *flags))
        if status != 0 or not out.exists():
            record["status"] = "failed"
            continue
        for row in json.loads(out.read_text())["rows"]:
            record["figures"]["rows"].append(row)
            if "error" in row:
                lines.append(f"| {context} | {row['kind']} | {row['batch']} | | | | | | {row['error']} |")
                continue
            share = f"{row['mfu']:.1%}" if row.get("mfu") is not None else "-"
            lines.append(f"| {context} | {row['kind']} | {row['batch']} | {row['ms']:.1f} | {row['tok_s']:,.0f} | "
                         f"{share} | "
                         f"{row['peak_mb']:,.0f} | {row['flops_per_token'] / 1e6:.1f} M | "
                         f"{'best' if row.get('best') else ''} |")
    return "\n".join(lines)


# The attention each decoding stage compares (benchmarks/generate.py flags; emb 256, 8 heads of 32): latent
# attention, absorbed and not, against grouped-query attention with the same 64 cached numbers per token and layer.
DECODE_VARIANTS = {
    "decode": [[]],
    "decode-latent": [["--latent-rank", "48", "--rope-dim", "16", "--absorb"], ["--latent-rank", "48", "--rope-dim",
                      "16"], ["--kv-heads", "1", "--positions", "rotary"]],
}


def run_decode(suite: Suite, record: dict) -> str:
    """benchmarks/generate.py with the compiled static step (CUDA graphs), batch 1 and 16, for each attention."""
    flags = ["--device", "cuda", "--compile", "--mode", "reduce-overhead", "--contexts", "256", "1024"]
    batches = [1, 16]
    variants = DECODE_VARIANTS[record["stage"]]
    if suite.smoke:
        flags = ["--device", "cpu", "--compile", "--backend", "eager", "--contexts", "32", "--new-tokens", "4",
                 "--repeats", "1", "--emb", "32", "--heads", "2", "--depth", "1", "--threads", "1"]
        batches = [2]
        variants = [["28" if v == "48" else "4" if v == "16" else v for v in flags_] for flags_ in variants]
    lines = ["| attention | batch | context | no cache (tok/s) | cache | static | compiled | cache / no cache | "
             "compiled / no cache | same tokens |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    record["figures"] = {"rows": []}
    for number, variant in enumerate(variants):
        for batch in batches:
            out = suite.work / f"{record['stage']}_{number}_{batch}.json"
            status, _ = suite.run(record, suite.python("benchmarks/generate.py", *flags, *variant, "--batch",
                                                       str(batch), "--json", str(out)))
            if status != 0 or not out.exists():
                record["status"] = "failed"
                continue
            report = json.loads(out.read_text())
            record["figures"].update({k: report[k] for k in ("emb", "heads", "depth", "new_tokens", "mode")})
            for row in report["rows"]:
                record["figures"]["rows"].append({**row, "attention": report["attention"],
                                                  "cache_values": report["cache_values"]})
                rate, gain = row["tok_s"], row["speedup"]
                same = "all" if min(row["same_tokens_as_no_cache"].values()) == 1 else ", ".join(
                    f"{k} {v:.0%}" for k, v in row["same_tokens_as_no_cache"].items() if v < 1)
                lines.append(f"| {report['attention']} ({report['cache_values']} cached) | "
                             f"{row['batch']} | {row['context']} | {rate['no cache']:,.1f} | {rate['cache']:,.1f} | "
                             f"{rate['static']:,.1f} | {rate['compiled']:,.1f} | {gain['cache']:.1f}x | "
                             f"{gain['compiled']:.1f}x | {same} |")
    return "\n".join(lines)


def run_decode_hf(suite: Suite, record: dict) -> str:
    """benchmarks/generate.py --against transformers: the same random GPT-2 and Llama checkpoints in both libraries,
    torchformer eager and with the compiled static step (CUDA graphs)."""
    if importlib.util.find_spec("transformers") is None:
        raise Skip("transformers is not installed (the comparison loads its checkpoints)")
    flags = ["--against", "transformers", "--device", "cuda", "--compile", "--mode", "reduce-overhead"]
    if suite.smoke:
        flags = ["--against", "transformers", "--toy", "--device", "cpu", "--compile", "--backend", "eager",
                 "--new-tokens", "4", "--repeats", "1", "--threads", "1"]
    out = suite.work / "decode-hf.json"
    status, _ = suite.run(record, suite.python("benchmarks/generate.py", *flags, "--json", str(out)))
    if status != 0 or not out.exists():
        record["status"] = "failed"
        return "The benchmark did not finish: see log.txt."
    rows = json.loads(out.read_text())["rows"]
    record["figures"] = {"rows": rows}
    lines = ["| shape | batch | prompt | transformers (tok/s) | torchformer (tok/s) | ratio | compiled (tok/s) | "
             "compiled ratio | same tokens |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        rate = row["tok_s"]
        lines.append(f"| {row['shape']} | {row['batch']} | {row['prompt']} | {rate['theirs']:,.1f} | "
                     f"{rate['ours']:,.1f} | {row['ratio']:.2f}x | {rate['compiled']:,.1f} | "
                     f"{row['compiled_ratio']:.2f}x | {row['same_tokens']:.0%} |")
    return "\n".join(lines)


def run_enwik8(suite: Suite, record: dict) -> str:
    """The enwik8 example's GPU preset for ``--enwik8-minutes`` of training, then the whole test split."""
    data = suite.args.enwik8_data
    if data is None or not data.is_file():
        raise Skip(f"no data: --enwik8-data {'is not given' if data is None else f'{data} is not a file'} (the "
                   f"Wikipedia stand-in enwiki_wikiextractor_sample.txt.gz, or enwik8.zip)")
    out = suite.work / "enwik8"
    flags = ["-D", str(data), "--preset", "gpu", "--final", "--out", str(out)]
    if suite.smoke:
        flags += ["--device", "cpu", "--threads", "1", "-N", "4", "-b", "2", "-E", "16", "-H", "2", "-d", "1", "-C",
                  "16", "--test-every", "2", "--test-subset", "64", "--sample-length", "8"]
    else:
        flags += ["--device", "cuda", "--compile", "--minutes", str(suite.args.enwik8_minutes)]
        flags += ["--peak-tflops", str(suite.peak)] if suite.peak else []
    status, output = suite.run(record, suite.python("examples/generate_enwik8.py", *flags))
    if status != 0 or not (out / "results.json").exists():
        record["status"] = "failed"
        return "The run did not finish: see log.txt."
    result = json.loads((out / "results.json").read_text())
    record["figures"] = {**result, "data": data.name}
    samples = output.split("sample (seed in brackets")
    if len(samples) > 1:  # the last sample, so that the report shows what the model writes
        record["figures"]["last_sample"] = samples[-1].split("\n", 1)[-1].split("\n\n")[0][-400:]
    share = f"{result['mfu']:.1%}" if result.get("mfu") is not None else "-"
    return "\n".join([
        "| data | split | bits per byte | steps | training (min) | tokens/s | MFU | parameters |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        f"| {data.name} | {result['split']} | {result['bpb']:.4f} | {result['step']:,} | "
        f"{result['elapsed_s'] / 60:.1f} | {result['tokens_per_s'] or 0:,.0f} | {share} | "
        f"{result['parameters']:,} |"])


def run_imdb(suite: Suite, record: dict) -> str:
    """The IMDb example's GPU preset, evaluated once on the official test set."""
    data = suite.args.imdb_data
    if data is None or not data.exists():
        raise Skip(f"no data: --imdb-data {'is not given' if data is None else f'{data} does not exist'} (a folder "
                   f"with imdb_train.jsonl.gz and imdb_test.jsonl.gz, or aclImdb_v1.tar.gz)")
    out = suite.work / "imdb"
    flags = ["--data", str(data), "--preset", "gpu", "--final", "--out", str(out)]
    flags += (["--device", "cpu", "--threads", "1", "-e", "1", "-E", "16", "-H", "2", "-M", "32", "-V", "100",
               "--val-size", "20"] if suite.smoke else ["--device", "cuda"])
    status, _ = suite.run(record, suite.python("examples/classify_imdb.py", *flags))
    if status != 0 or not (out / "results.json").exists():
        record["status"] = "failed"
        return "The run did not finish: see log.txt."
    result = json.loads((out / "results.json").read_text())
    record["figures"] = {k: result[k] for k in ("split", "accuracy", "loss", "count", "wall_seconds")}
    record["figures"]["ece"] = result["calibration"]["ece"]
    return "\n".join(["| split | reviews | accuracy | loss | calibration error (ECE) | wall time (s) |",
                      "| --- | ---: | ---: | ---: | ---: | ---: |",
                      f"| {result['split']} | {result['count']:,} | {result['accuracy']:.2%} | {result['loss']:.4f} | "
                      f"{result['calibration']['ece']:.4f} | {result['wall_seconds']} |"])


def run_imdb_pretrained(suite: Suite, record: dict) -> str:
    """Masked-language-model pretraining on the unlabelled reviews, then fine-tuning and the official test set."""
    data = suite.args.imdb_data
    forms = ("imdb_unsup.jsonl.gz", "aclImdb", "aclImdb_v1.tar.gz", "train/unsup")  # what imdb_unlabelled reads
    if data is None or not any((data / form).exists() for form in forms):
        raise Skip(f"no data: --imdb-data {'is not given' if data is None else f'{data} has no unlabelled reviews'} "
                   f"(imdb_unsup.jsonl.gz next to imdb_train.jsonl.gz and imdb_test.jsonl.gz, or the archive)")
    pretrained, out = suite.work / "pretrain_imdb", suite.work / "imdb_pretrained"
    small = ["--device", "cpu", "--threads", "1", "-e", "1", "-E", "16", "-H", "2", "-M", "32", "-V", "100",
             "--val-size", "20"]
    flags = ["--data", str(data), "--preset", "gpu", "--out", str(pretrained)]
    status, _ = suite.run(record, suite.python("examples/pretrain_imdb.py", *flags,
                                               *(small if suite.smoke else ["--device", "cuda"])))
    if status != 0 or not (pretrained / "results.json").exists():
        record["status"] = "failed"
        return "Pretraining did not finish: see log.txt."
    # The model's size and the vocabulary come from the pretrained file: -E, -H, -M and -V are not given again.
    tune = (["--device", "cpu", "--threads", "1", "-e", "1", "--val-size", "20"] if suite.smoke
            else ["--device", "cuda"])
    status, _ = suite.run(record, suite.python(
        "examples/classify_imdb.py", "--data", str(data), "--preset", "gpu", "--final", "--out", str(out),
        "--pretrained", str(pretrained / "pretrained.pt"), *tune))
    if status != 0 or not (out / "results.json").exists():
        record["status"] = "failed"
        return "Fine-tuning did not finish: see log.txt."
    before = json.loads((pretrained / "results.json").read_text())
    result = json.loads((out / "results.json").read_text())
    record["figures"] = {"corpus": before["corpus"], "masked_accuracy": before["val_masked_accuracy"],
                         "pretrain_seconds": before["wall_seconds"],
                         **{k: result[k] for k in ("split", "accuracy", "loss", "count", "wall_seconds")}}
    return "\n".join(["| reviews pretrained on | masked-token val accuracy | pretraining (s) | split | accuracy | "
                      "fine-tuning and test (s) |", "| ---: | ---: | ---: | --- | ---: | ---: |",
                      f"| {before['corpus']['kept']:,} | {before['val_masked_accuracy']:.2%} | "
                      f"{before['wall_seconds']} | {result['split']} | {result['accuracy']:.2%} | "
                      f"{result['wall_seconds']} |"])


def run_memory(suite: Suite, record: dict) -> str:
    """Peak memory and step time of the 12-layer emb-768 model with and without activation checkpointing."""
    emb, heads, depth, context, batch = 768, 12, 12, 1024, 32
    extra = ["--device", "cuda", "--bf16", "--compile", "--steps", "10", "--warmup", "3"]
    if suite.smoke:
        emb, heads, depth, context, batch = 32, 2, 2, 32, 2
        extra = ["--device", "cpu", "--steps", "2", "--warmup", "1", "--threads", "1"]
    lines = [f"Model: emb {emb}, heads {heads}, depth {depth}, prenorm, context {context}, batch {batch}.", "",
             "| checkpoint_blocks | ms/step | tokens/s | peak memory (MB) |", "| --- | ---: | ---: | ---: |"]
    record["figures"] = {"rows": []}
    for value in (False, True):
        out = suite.work / f"memory_{value}.json"
        status, _ = suite.run(record, suite.python(
            "benchmarks/step.py", "--emb", str(emb), "--heads", str(heads), "--depth", str(depth), "--kinds", "fast",
            "--contexts", str(context), "--batch-sizes", str(batch), "--set", "prenorm=true", "--set",
            f"checkpoint_blocks={json.dumps(value)}", "--json", str(out), *extra))
        if status != 0 or not out.exists():
            record["status"] = "failed"
            continue
        for row in json.loads(out.read_text())["rows"]:
            record["figures"]["rows"].append({**row, "checkpoint_blocks": value})
            if "error" in row:
                lines.append(f"| {value} | {row['error']} | | |")
            else:
                lines.append(f"| {value} | {row['ms']:.1f} | {row['tok_s']:,.0f} | {row['peak_mb']:,.0f} |")
    return "\n".join(lines)


def run_long_context(suite: Suite, record: dict) -> str:
    """Time and peak memory of causal attention at 1k-8k positions: dense, the fixed pattern as a dense mask, and
    the fixed pattern through compiled flex attention (benchmarks/long_context.py, forward and backward)."""
    contexts = ["1024", "2048", "4096", "8192"]
    extra = ["--device", "cuda", "--backward", "--batch", "4", "--heads", "8"]
    if suite.smoke:  # the CPU has no flex backward: forward only, toy sizes
        contexts, extra = ["128", "256"], ["--device", "cpu", "--repeats", "1", "--threads", "1"]
    out = suite.work / "long_context.json"
    status, _ = suite.run(record, suite.python("benchmarks/long_context.py", "--contexts", *contexts, "--json",
                                               str(out), *extra))
    if status != 0 or not out.exists():
        record["status"] = "failed"
        return "benchmarks/long_context.py failed: see the log."
    rows = json.loads(out.read_text())["rows"]
    record["figures"] = {"rows": rows}
    lines = ["| context | kind | ms per call | x dense | peak memory (MB) | kept |", "| ---: | --- | ---: | ---: | ---: | ---: |"]
    dense = {row["context"]: row.get("ms") for row in rows if row["kind"] == "dense"}
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['context']} | {row['kind']} | {row['error']} | | | |")
            continue
        ratio = f"{row['ms'] / dense[row['context']]:.2f}" if dense.get(row["context"]) else "-"
        kept = (f"{row['pairs_kept']:.1%} of pairs" if "pairs_kept" in row
                else f"{row['blocks_kept']:.1%} of blocks" if "blocks_kept" in row else "")
        peak = "-" if row["peak_mb"] is None else f"{row['peak_mb']:,.1f}"
        lines.append(f"| {row['context']} | {row['kind']} | {row['ms']:.2f} | {ratio} | {peak} | {kept} |")
    return "\n".join(lines)


def run_packed(suite: Suite, record: dict) -> str:
    """Real tokens/s of compiled bf16 training steps on the same review-like documents: padded, packed through a
    dense document mask (SDPA), packed through flex attention's block mask (benchmarks/packed.py)."""
    flags = ["--device", "cuda", "--compile", "--row", "1024", "--batch", "32"]
    if suite.smoke:  # the CPU has no flex backward: padded and the dense mask, toy sizes
        flags = ["--toy", "--device", "cpu", "--threads", "1"]
    out = suite.work / "packed.json"
    status, _ = suite.run(record, suite.python("benchmarks/packed.py", *flags, "--json", str(out)))
    if status != 0 or not out.exists():
        record["status"] = "failed"
        return "benchmarks/packed.py failed: see the log."
    rows = json.loads(out.read_text())["rows"]
    record["figures"] = {"rows": rows}
    lines = ["| kind | real tokens/s | ms per step | rows per step | padding | x padded |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}"
        lines.append(f"| {row['kind']} | {row['tok_s']:,.0f} | {row['ms_per_step']:.1f} | {row['rows_per_step']:.1f} | "
                     f"{row['padding']:.1%} | {ratio} |")
    return "\n".join(lines)

def run_ablation(suite: Suite, record: dict) -> str:
    """``examples/ablate.py`` on ``--ablation`` (an ablation file, examples/ablations/*.toml): its variants x seeds
    one after another until the budget ends, then the table of the runs that finished."""
    file = suite.args.ablation
    if suite.smoke:  # two toy runs on the CPU, on the suite's enwik8 data or the bundled sample
        file = suite.work / "smoke.toml"
        data = f'"-D", "{suite.args.enwik8_data}", ' if suite.args.enwik8_data else ""
        file.write_text(f'script = "{ROOT / "examples" / "generate_enwik8.py"}"\n'
                        f'base = [{data}"-N", "4", "-b", "2", "-C", "16", "-E", "16", "-H", "2", "-d", "1", '
                        f'"--test-every", "2", "--test-subset", "64", "--sample-length", "0", "--device", "cpu"]\n'
                        f'seeds = [1]\nmetric = "bpb"\ncurve = "val_bpb"\n'
                        f'[[variants]]\nname = "learned positions"\nflags = ["--positions", "learned"]\n')
    elif not file.is_file():
        raise Skip(f"no ablation file: --ablation {file} is not a file")
    out = suite.work / "ablation"
    status, _ = suite.run(record, suite.python("examples/ablate.py", str(file), "--out", str(out)))
    # The table of the runs that finished, here: an interrupted harness wrote none.
    ablation = read_ablation(file)
    records = read_records(ablation, out)
    rows = summarize(ablation, records)
    wanted = len(ablation.variants) * len(ablation.seeds)
    record["figures"] = {"file": "smoke.toml" if suite.smoke else os.path.relpath(file, ROOT), "rows": rows,
                         "runs": len(records)}
    if status != 0 and not record.get("timed_out") or not records:
        record["status"] = "failed"
    if len(records) < wanted:
        record["notes"].append(f"{len(records)} of the {wanted} runs finished in the budget")
    return markdown_table(ablation, rows).strip() if records else "No run finished: see the log."


# The long-context-enwik8 runs: the same tokens per step (32,768) and the same attention span, three ways.
# (name, flags on the GPU, flags of the --smoke run: the same meaning at toy sizes)
LONG_RUNS = [("dense, context 2048", "-C 2048 -b 16", "-C 32 -b 4"),
             ("context 1024 + memory 1024", "-C 1024 -b 32 --memory 1024", "-C 16 -b 8 --memory 16"),
             ("fixed pattern (block 45), context 2048", "-C 2048 -b 16 --sparse fixed --sparse-stride 45",
              "-C 32 -b 4 --sparse fixed --sparse-stride 6")]


def run_long_context_enwik8(suite: Suite, record: dict) -> str:
    """The enwik8 GPU preset's model for ``--long-context-minutes`` each: dense at context 2048, context 1024 with a
    memory of 1024, and the fixed pattern at 2048; validation bits per byte on the whole split (eager: --memory
    does not compile, so none of the three does)."""
    data = suite.args.enwik8_data
    if data is None or not data.is_file():
        raise Skip(f"no data: --enwik8-data {'is not given' if data is None else f'{data} is not a file'} (the "
                   f"Wikipedia stand-in enwiki_wikiextractor_sample.txt.gz, or enwik8.zip)")
    rows = []
    for i, (name, gpu, smoke) in enumerate(LONG_RUNS):
        out = suite.work / f"long_enwik8_{i}"
        flags = ["-D", str(data), "--preset", "gpu", "--sample-length", "0", "--out", str(out)]
        if suite.smoke:
            flags += ["--device", "cpu", "--threads", "1", "-N", "4", "-E", "16", "-H", "2", "-d", "1",
                      "--test-every", "2", "--test-subset", "256", *smoke.split()]
        else:
            # The preset warms up over 1,000 steps, most of a short run: 100 here, the same for all three.
            flags += ["--device", "cuda", "--minutes", str(suite.args.long_context_minutes), "--lr-warmup", "100",
                      *gpu.split()]
            flags += ["--peak-tflops", str(suite.peak)] if suite.peak else []
        status, _ = suite.run(record, suite.python("examples/generate_enwik8.py", *flags))
        if status != 0 or not (out / "results.json").exists():
            rows.append({"run": name, "error": "did not finish (see log.txt)"})
            continue
        result = json.loads((out / "results.json").read_text())
        rows.append({"run": name, **{k: result.get(k) for k in ("bpb", "split", "step", "elapsed_s", "tokens_per_s",
                                                               "mfu", "parameters")}})
    record["figures"] = {"rows": rows, "data": data.name}
    if any("error" in row for row in rows):  # a comparison with a row missing is no comparison
        record["status"] = "failed"
    lines = ["| run | validation bits per byte | steps | training (min) | tokens/s | MFU |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['run']} | {row['error']} | | | | |")
            continue
        share = f"{row['mfu']:.1%}" if row.get("mfu") is not None else "-"
        lines.append(f"| {row['run']} | {row['bpb']:.4f} | {row['step']:,} | {row['elapsed_s'] / 60:.1f} | "
                     f"{row['tokens_per_s'] or 0:,.0f} | {share} |")
    return "\n".join(lines)


STAGES = {stage.name: stage for stage in [
    Stage("tests", "CUDA-only tests, then the whole test suite", 300, run_tests),
    Stage("step-small", "training step, emb 256, depth 4, contexts 256 and 1024", 180, run_step),
    Stage("step-enwik8", "training step, the enwik8 GPU preset's model", 180, run_step),
    Stage("step-768", "training step, 12 layers, emb 768, context 1024", 210, run_step),
    Stage("decode", "decoding: no cache, cache, compiled static step with CUDA graphs", 240, run_decode),
    Stage("step-moe", "training step, a top-2-of-8 mixture of experts and the dense network of its active width "
          "(MFU over active parameters)", 240, run_step),
    Stage("decode-latent", "decoding with latent attention (DeepSeek's MLA) and with GQA of the same cache bytes",
          240, run_decode),
    Stage("decode-hf", "decoding against transformers on the same GPT-2 and Llama checkpoints, eager and compiled "
          "(CUDA graphs)", 300, run_decode_hf),
    Stage("enwik8", "enwik8 GPU preset, --minutes 7.5, test split", 535, run_enwik8),
    Stage("imdb", "IMDb GPU preset, test set", 300, run_imdb),
    Stage("imdb-pretrained", "IMDb: masked-LM pretraining on the unlabelled reviews, fine-tuning, test set", 540,
          run_imdb_pretrained),
    Stage("memory", "peak memory with and without activation checkpointing", 240, run_memory),
    Stage("long-context", "attention at 1k-8k positions: dense, a sparse pattern as a mask, and through flex "
          "attention", 240, run_long_context),
    Stage("long-context-enwik8", "enwik8: dense at context 2048, context 1024 + memory 1024, the fixed pattern at "
          "2048; --long-context-minutes each", 540, run_long_context_enwik8),
    Stage("packed", "training steps on packed rows (dense document mask, flex block mask) against padded batches",
          240, run_packed),
    Stage("ablation", "examples/ablate.py on --ablation (default examples/ablations/enwik8-gpu.toml): its table",
          540, run_ablation),
]}


# ----------------------------------------------------------------------------------------------------- reports --


def environment() -> dict:
    """What a figure needs to be read later: torch, CUDA and the commit of the code that produced it."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        commit += " (with uncommitted changes)" if dirty else ""
    except (OSError, subprocess.CalledProcessError):  # the GPU machine may get the files without .git
        commit = "unknown (no git repository)"
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            "commit": commit}


def wrapped(command: str, width: int = 84) -> list[str]:
    """A shell command as lines of at most ``width`` characters where its words allow, joined by `` \\``."""
    lines, line = [], ""
    for word in command.split(" "):  # the words shlex quoted: a quoted word holds no space
        if line and len(line) + 1 + len(word) + 2 > width:
            lines.append(line + " \\")
            line = "    " + word
        else:
            line = f"{line} {word}" if line else word
    return lines + [line]


def markdown(record: dict) -> str:
    """One stage's section of the report."""
    head = f"## {record['stage']}: {record['status']}"
    head += f" ({record['reason']})" if record.get("reason") else ""
    lines = [head, "",
             f"{record['date']}, {record['seconds']:.0f} s; device {record['device']}; torch {record['torch']}"
             f" (CUDA {record['cuda']}); commit {record['commit']}"
             + ("; **smoke run (toy sizes, CPU): not GPU figures**" if record["smoke"] else "")]
    if record["commands"]:
        lines += ["", "Commands:", "", *[f"    {line}" for c in record["commands"] for line in wrapped(c)]]
    lines += ["", *[f"Note: {n}" for n in record["notes"]]] if record["notes"] else []
    if record.get("table"):
        lines += ["", record["table"]]
    return "\n".join(lines) + "\n"


def append(out: Path, record: dict) -> None:
    """Add a stage to OUT/results.json (a list) and OUT/report.md, keeping what earlier stages and calls wrote."""
    results = out / "results.json"
    records = json.loads(results.read_text()) if results.exists() else []
    records.append(record)
    temporary = results.with_suffix(".json.tmp")  # a kill mid-write must not lose the earlier stages
    temporary.write_text(json.dumps(records, indent=2) + "\n")
    temporary.replace(results)
    report = out / "report.md"
    with open(report, "a", encoding="utf-8") as f:
        f.write(("" if report.stat().st_size else "# GPU suite report\n") + "\n" + markdown(record))


def run_stage(suite: Suite, stage: Stage) -> dict:
    record = {"stage": stage.name, "status": "ok", "reason": None, "smoke": suite.smoke,
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "device": suite.device_name, **environment(), "commands": [], "notes": [], "figures": {},
              "seconds": 0.0}
    tic = time.monotonic()
    if not suite.smoke and suite.left() < stage.seconds:
        record["status"] = "skipped"
        record["reason"] = (f"not enough time left in --budget: {suite.left():.0f} s, the stage needs about "
                            f"{stage.seconds} s; run it in a call of its own")
    else:
        try:
            record["table"] = stage.run(suite, record)
        except Skip as e:
            record["status"], record["reason"] = "skipped", str(e)
        if record.pop("timed_out", False) and record["status"] == "ok":
            record["status"] = "interrupted"
    record["seconds"] = round(time.monotonic() - tic, 1)
    return record


def publish(results: Path, page: Path) -> int:
    """Put the stages of ``results`` (a results.json) on ``page`` between its markers; returns how many were new."""
    records = json.loads(results.read_text())
    text = page.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"--page {page} must contain the markers {BEGIN} and {END}")
    before, rest = text.split(BEGIN, 1)
    inside, after = rest.split(END, 1)
    inside = inside.replace(NO_RUN_YET + "\n", "")
    new = 0
    for record in records:
        key = f"<!-- {record['stage']} {record['date']} -->"
        if record["smoke"] or key in inside:  # smoke runs are not results; a published stage is there once
            continue
        inside += f"\n{key}\n" + markdown(record).replace("## ", "### ", 1)
        new += 1
    page.write_text(before + BEGIN + (inside if inside.strip() else f"\n{NO_RUN_YET}\n") + END + after)
    return new


def parse_stages(text: str) -> list[str]:
    names = list(STAGES) if text == "all" else [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in STAGES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"expected stage names separated by commas, or all; valid stages: "
                                         f"{', '.join(STAGES)}; got {text!r}")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"each stage once, got {text!r}")
    return names


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stages", type=parse_stages, help=f"comma-separated, or all: {', '.join(STAGES)}")
    p.add_argument("--out", type=Path, help="folder for report.md, results.json and log.txt (appended to)")
    p.add_argument("--smoke", action="store_true", help="every stage at toy sizes on the CPU (a check of this "
                   "driver, not figures)")
    p.add_argument("--budget", type=float, default=570.0, help="seconds this call may take (default: 570, one run "
                   "of 9.5 minutes)")
    p.add_argument("--enwik8-data", type=Path, help="data for the enwik8 stage (e.g. the Wikipedia stand-in)")
    p.add_argument("--enwik8-minutes", type=float, default=7.5, help="training time of the enwik8 stage "
                   "(default 7.5: the one 8-minute GPU run so far took 561 s in all, more than the 555 s a "
                   "570 s budget leaves a command)")
    p.add_argument("--long-context-minutes", type=float, default=1.5, help="training time of each of the three "
                   "runs of the long-context-enwik8 stage (default 1.5; above about 2 the three no longer fit in "
                   "one 570 s budget)")
    p.add_argument("--imdb-data", type=Path, help="folder with the IMDb data for the imdb stage")
    p.add_argument("--ablation", type=Path, default=ROOT / "examples" / "ablations" / "enwik8-gpu.toml",
                   help="the ablation file of the ablation stage (default examples/ablations/enwik8-gpu.toml)")
    p.add_argument("--publish", type=Path, metavar="DIR", help="no stages: copy DIR/results.json into --page")
    p.add_argument("--page", type=Path, default=PAGE, help="the results page for --publish")
    args = p.parse_args(argv)
    if args.publish is not None:
        if not (args.publish / "results.json").is_file():
            p.error(f"--publish expects a folder with a results.json written by this script, got {args.publish}")
        print(f"{publish(args.publish / 'results.json', args.page)} new stage(s) on {args.page}")
        return []
    if args.stages is None or args.out is None:
        p.error("give --stages (and --out), or --publish DIR")
    if not args.budget > 0:
        p.error(f"--budget must be a positive number of seconds, got {args.budget}")
    for flag in ("enwik8_minutes", "long_context_minutes"):
        if not getattr(args, flag) > 0:
            p.error(f"--{flag.replace('_', '-')} must be a positive number, got {getattr(args, flag)}")
    if not args.smoke and not torch.cuda.is_available():
        p.error("no CUDA GPU here: the stages measure a GPU. Use --smoke to check the driver on the CPU")
    args.out.mkdir(parents=True, exist_ok=True)
    suite = Suite(args)
    print(f"GPU suite: stages {', '.join(args.stages)} on {suite.device_name}, torch {torch.__version__}, budget "
          f"{args.budget:.0f} s{' (smoke: toy sizes)' if args.smoke else ''}; writing to {args.out}", flush=True)
    records = []
    try:
        for name in args.stages:
            print(f"\n[{time.monotonic() - suite.start:.0f} s] stage {name}: {STAGES[name].about}", flush=True)
            record = run_stage(suite, STAGES[name])
            append(args.out, record)
            records.append(record)
            print(markdown(record), flush=True)  # stdout survives even if the files do not
    finally:
        shutil.rmtree(suite.work, ignore_errors=True)  # the examples' models: hundreds of MB
    return records


if __name__ == "__main__":
    main()
