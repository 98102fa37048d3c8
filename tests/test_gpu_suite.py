"""benchmarks/gpu_suite.py: every stage at toy sizes on the CPU (--smoke), so that the driver cannot rot between the
rare GPU runs; its reports, time budget, skips, publishing; and the batch-size search of benchmarks/step.py."""

from __future__ import annotations

import gzip
import json
import os
import random
import sys
import time
from pathlib import Path

import pytest
from script_loader import load_script
import torch


ROOT = Path(__file__).resolve().parents[1]


def load(name: str, path: Path):
    return load_script(path, name)


@pytest.fixture(scope="module")
def suite():
    return load("gpu_suite", ROOT / "benchmarks" / "gpu_suite.py")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny byte corpus and a tiny IMDb folder (positive reviews say "great", negative ones "awful")."""
    folder = tmp_path_factory.mktemp("data")
    rng = random.Random(0)
    corpus = folder / "tiny.txt"
    corpus.write_text(" ".join(rng.choice(["the", "cat", "sat", "on", "[[link]]", "\n"]) for _ in range(3000)))
    imdb = folder / "imdb"
    imdb.mkdir()
    filler = "the a film movie plot actor scene story was is and it".split()
    for split, n in (("train", 120), ("test", 40)):
        with gzip.open(imdb / f"imdb_{split}.jsonl.gz", "wt", encoding="utf-8") as f:
            for i in range(n):
                words = [rng.choice(filler) for _ in range(10)] + ["great" if i % 2 else "awful"]
                f.write(json.dumps({"text": " ".join(words), "label": i % 2, "id": i}) + "\n")
    with gzip.open(imdb / "imdb_unsup.jsonl.gz", "wt", encoding="utf-8") as f:
        for i in range(60):
            f.write(json.dumps({"text": " ".join(rng.choice(filler) for _ in range(12)), "id": i}) + "\n")
    return corpus, imdb


@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
def test_smoke_runs_every_stage_and_reports_its_figures(suite, data, tmp_path, capsys):
    corpus, imdb = data
    out = tmp_path / "out"
    tic = time.monotonic()
    records = suite.main(["--smoke", "--stages", "all", "--out", str(out), "--enwik8-data", str(corpus),
                          "--imdb-data", str(imdb)])
    seconds = time.monotonic() - tic
    printed = capsys.readouterr().out
    assert [r["stage"] for r in records] == list(suite.STAGES)
    assert sorted(p.name for p in out.iterdir()) == ["log.txt", "report.md", "results.json"]  # few files come back
    assert json.loads((out / "results.json").read_text()) == json.loads(json.dumps(records))
    report = (out / "report.md").read_text()
    for record in records:
        assert record["status"] == "ok", record
        assert record["device"].endswith(f"CPU ({os.cpu_count()} cores)")
        assert record["torch"] == torch.__version__ and record["smoke"] is True
        assert time.strptime(record["date"], "%Y-%m-%d %H:%M UTC")
        section = report.split(f"## {record['stage']}: ")[1].split("\n## ")[0]
        assert record["date"] in section and torch.__version__ in section and record["device"] in section
        assert section in printed  # the report is printed too: it survives in the terminal's output
        for command in record["commands"]:
            assert command.startswith("python ")
            assert all(f"    {line}" in section for line in suite.wrapped(command))  # as the page shows it
    by = {r["stage"]: r for r in records}

    # tests: both pytest runs, with counts from their JUnit XML
    assert by["tests"]["figures"]["whole suite"]["passed"] > 0
    assert by["tests"]["figures"]["CUDA tests (-k cuda)"]["skipped"] > 0  # no GPU here: they skip, not pass
    assert "-k cuda" in by["tests"]["commands"][0]
    # training step: a measured row with the FLOPs of its model, marked best; the compiled path ran in step-small
    for name in ("step-small", "step-enwik8", "step-768"):
        rows = by[name]["figures"]["rows"]
        assert rows and rows[0]["tok_s"] > 0 and rows[0]["flops_per_token"] > 0 and rows[0]["best"]
        assert rows[0]["mfu"] is None  # no MFU without a GPU's peak
    assert "--compile" in by["step-small"]["commands"][0]
    assert "--set positions=rotary" in by["step-enwik8"]["commands"][0]  # the enwik8 preset's architecture
    assert "| 32 | fast | 2 |" in by["step-768"]["table"]
    # the mixture against the dense network of its active width: each expert half its width, 2 of 8 used
    dense, mixture = by["step-moe"]["figures"]["rows"]
    assert (dense["kind"], mixture["kind"]) == ("fast", "moe") and mixture["tok_s"] > 0
    assert mixture["parameters"] > dense["parameters"] and mixture["active_parameters"] < mixture["parameters"]
    command = by["step-moe"]["commands"][0]
    assert "--expert-hidden 16" in command and "--set ff_hidden=32" in command
    # latent attention, absorbed and not, and GQA of the same cache size: all decode the uncached tokens
    latent = by["decode-latent"]["figures"]["rows"]
    assert [row["attention"].split(",")[0] for row in latent] == [
        "latent 28 + rotary key 4 absorbed", "latent 28 + rotary key 4", "1 key/value heads"]
    assert {row["cache_values"] for row in latent} == {32}
    # decoding: every variant, and their tokens agree
    row = by["decode"]["figures"]["rows"][0]
    assert set(row["tok_s"]) == {"no cache", "cache", "static", "compiled"} and min(row["tok_s"].values()) > 0
    assert "--mode" not in by["decode"]["commands"][0]  # CUDA graphs only on the GPU
    # against transformers: both shapes at both toy settings, the same greedy tokens in both libraries
    against = by["decode-hf"]["figures"]["rows"]
    assert [(row["shape"], row["batch"]) for row in against] == [("gpt2", 1), ("gpt2", 2), ("llama", 1), ("llama", 2)]
    assert all(row["same_tokens"] == 1 and row["ratio"] > 0 and row["compiled_ratio"] > 0 for row in against)
    assert "--against transformers" in by["decode-hf"]["commands"][0]
    # the two examples: their results.json figures
    assert by["enwik8"]["figures"]["split"] == "test" and by["enwik8"]["figures"]["bpb"] > 0
    assert "--preset gpu" in by["enwik8"]["commands"][0] and "--final" in by["enwik8"]["commands"][0]
    assert by["imdb"]["figures"]["split"] == "test" and by["imdb"]["figures"]["count"] == 40
    assert 0 <= by["imdb"]["figures"]["accuracy"] <= 1
    pretrained = by["imdb-pretrained"]["figures"]
    assert pretrained["split"] == "test" and pretrained["count"] == 40 and pretrained["corpus"]["kept"] == 60 + 100
    memory = by["memory"]["figures"]["rows"]  # activation checkpointing off, then on
    assert [row["checkpoint_blocks"] for row in memory] == [False, True] and all(row["peak_mb"] > 0 for row in memory)
    long_context = by["long-context"]["figures"]["rows"]  # every kind at both toy contexts, measured
    assert [(row["context"], row["kind"]) for row in long_context] == [
        (n, kind) for n in (128, 256) for kind in ("dense", "fixed-mask", "fixed-flex")]
    assert all(row["ms"] > 0 for row in long_context) and "| 256 | fixed-flex |" in by["long-context"]["table"]
    long_runs = by["long-context-enwik8"]["figures"]["rows"]  # dense, memory, pattern: each trained and scored
    assert [row["run"] for row in long_runs] == [name for name, _, _ in suite.LONG_RUNS]
    assert all(row["split"] == "validation" and row["bpb"] > 0 and row["step"] == 4 for row in long_runs)
    commands = by["long-context-enwik8"]["commands"]
    assert "--memory 16" in commands[1] and "--sparse fixed" in commands[2] and "--memory" not in commands[0]
    packed = by["packed"]["figures"]["rows"]  # padded, then packed through the dense mask (no flex on the CPU)
    assert [row["kind"] for row in packed] == ["padded", "packed-sdpa"] and all(row["tok_s"] > 0 for row in packed)
    assert packed[1]["ratio"] > 0 and "| packed-sdpa |" in by["packed"]["table"]
    ablation = by["ablation"]["figures"]  # the harness's table: the base and one variant, a run each
    assert [row["variant"] for row in ablation["rows"]] == ["base", "learned positions"] and ablation["runs"] == 2
    assert all(row["runs"] == 1 and row["mean"] > 0 for row in ablation["rows"])
    assert ablation["rows"][1]["difference"] == ablation["rows"][1]["mean"] - ablation["rows"][0]["mean"]
    assert "| learned positions |" in by["ablation"]["table"] and "examples/ablate.py" in by["ablation"]["commands"][0]
    assert "===== tests: python -m pytest" in (out / "log.txt").read_text()
    print(f"smoke run of every stage: {seconds:.0f} s")

    # A second call with the same --out adds to the end of both files.
    again = suite.main(["--smoke", "--stages", "memory", "--out", str(out)])
    assert len(json.loads((out / "results.json").read_text())) == len(records) + 1
    assert (out / "report.md").read_text().startswith(report) and again[0]["stage"] == "memory"
    assert (out / "report.md").read_text().count("# GPU suite report") == 1


def test_missing_data_is_a_skip_with_the_reason(suite, tmp_path):
    records = suite.main(["--smoke", "--stages", "enwik8,imdb", "--out", str(tmp_path),
                          "--imdb-data", str(tmp_path / "nowhere")])
    assert [r["status"] for r in records] == ["skipped", "skipped"]
    assert "--enwik8-data is not given" in records[0]["reason"]
    assert f"--imdb-data {tmp_path / 'nowhere'} does not exist" in records[1]["reason"]
    assert records[0]["commands"] == [] and "skipped (no data" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize("stages, message", [
    ("tests,nope", "valid stages: tests, step-small, step-enwik8, step-768, decode, step-moe, decode-latent, "
                   "decode-hf, enwik8, imdb, imdb-pretrained, memory, long-context, long-context-enwik8, packed, "
                   "ablation; "
                   "got 'tests,nope'"),
    ("decode,decode", "each stage once, got 'decode,decode'"),
    (",", "valid stages"),
])
def test_bad_stage_lists_name_the_valid_stages(suite, tmp_path, capsys, stages, message):
    with pytest.raises(SystemExit) as exit_info:
        suite.main(["--smoke", "--stages", stages, "--out", str(tmp_path)])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_without_a_gpu_only_smoke_runs(suite, tmp_path, capsys):
    with pytest.raises(SystemExit):
        suite.main(["--stages", "decode", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert "no CUDA GPU here" in err and "Use --smoke" in err


def suite_with_budget(suite, tmp_path, budget: float, smoke: bool = True):
    args = suite.main.__globals__["argparse"].Namespace(smoke=smoke, out=tmp_path, budget=budget)
    return suite.Suite(args)


def test_a_command_past_the_budget_is_interrupted_and_reported(suite, tmp_path):
    s = suite_with_budget(suite, tmp_path, budget=17.0)  # 15 s are kept back: the command gets 2 s
    record = {"stage": "demo", "commands": [], "notes": []}
    tic = time.monotonic()
    status, output = s.run(record, [sys.executable, "-c", "import time; print('started', flush=True); "
                                                         "time.sleep(60)"])
    assert time.monotonic() - tic < 20
    assert status != 0 and "started" in output and "KeyboardInterrupt" in output  # SIGINT, so it could report
    assert record["timed_out"] and record["notes"][0].startswith("interrupted after 2 s (--budget)")
    assert "exit status" in (tmp_path / "log.txt").read_text()

    late = suite_with_budget(suite, tmp_path, budget=10.0)  # less than the 15 s kept back: not started at all
    record = {"stage": "demo", "commands": [], "notes": []}
    assert late.run(record, [sys.executable, "-c", "pass"]) == (-1, "")
    assert record["notes"][0].startswith("not run, no time left in --budget")


def test_an_interrupted_ablation_reports_the_table_of_the_runs_that_finished(suite, tmp_path):
    """A stand-in script: the base writes its results at once, the variant would take a minute; the budget ends in
    between, and the stage's table has the base's row (the harness itself wrote none)."""
    script = tmp_path / "fake.py"
    script.write_text("import json, sys, time, pathlib\n"
                      "out = pathlib.Path(sys.argv[sys.argv.index('--out') + 1])\n"
                      "if '--slow' in sys.argv: time.sleep(60)\n"
                      "(out / 'results.json').write_text(json.dumps({'bpb': 1.5}))\n")
    file = tmp_path / "a.toml"
    file.write_text(f'script = "{script}"\nbase = []\nseeds = [1]\nmetric = "bpb"\n'
                    f'[[variants]]\nname = "slow"\nflags = ["--slow"]\n')
    s = suite_with_budget(suite, tmp_path, budget=25.0, smoke=False)  # the harness gets 10 s
    s.args.ablation = file
    record = {"stage": "ablation", "status": "ok", "commands": [], "notes": []}
    table = suite.run_ablation(s, record)  # the stage itself: run_stage would skip it (it asks for 540 s)
    assert record["timed_out"] and record["status"] == "ok"  # run_stage reports it as interrupted
    assert "1 of the 2 runs finished in the budget" in record["notes"]
    assert [row["runs"] for row in record["figures"]["rows"]] == [1, 0] and record["figures"]["runs"] == 1
    assert "| base | `(the base)` | 1 | 1.5000 |" in table


def test_a_stage_that_cannot_finish_in_the_budget_is_skipped(suite, tmp_path):
    s = suite_with_budget(suite, tmp_path, budget=100.0, smoke=False)  # the enwik8 stage needs about 535 s
    record = suite.run_stage(s, suite.STAGES["enwik8"])
    assert record["status"] == "skipped" and record["commands"] == []
    assert "not enough time left in --budget" in record["reason"] and "535 s" in record["reason"]


def test_publish_adds_gpu_stages_once_and_never_smoke_runs(suite, tmp_path):
    page = tmp_path / "page.md"
    real = (ROOT / "docs" / "gpu-results.md").read_text()  # the real page, its results taken out
    page.write_text(real[:real.index(suite.BEGIN) + len(suite.BEGIN)] + f"\n{suite.NO_RUN_YET}\n"
                    + real[real.index(suite.END):])
    base = {"status": "ok", "reason": None, "device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130",
            "cuda": "13.0", "python": "3.12", "commit": "abc1234", "commands": ["python benchmarks/step.py"],
            "notes": [], "figures": {}, "seconds": 100.0, "table": "| a |\n| --- |\n| 1 |"}
    records = [{**base, "stage": "decode", "date": "2026-12-01 10:00 UTC", "smoke": False},
               {**base, "stage": "tests", "date": "2026-12-01 10:05 UTC", "smoke": True}]
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps(records))
    assert suite.main(["--publish", str(run), "--page", str(page)]) == []
    text = page.read_text()
    assert suite.NO_RUN_YET not in text and "### decode: ok" in text and "### tests" not in text
    assert "NVIDIA H100 80GB HBM3" in text and "2026-12-01 10:00 UTC" in text and "python benchmarks/step.py" in text
    assert text.index(suite.BEGIN) < text.index("### decode") < text.index(suite.END) < text.index("## Before")
    suite.main(["--publish", str(run), "--page", str(page)])
    assert page.read_text() == text  # publishing again changes nothing


def test_pytest_counts_from_junit_xml_and_from_the_summary_line(suite, tmp_path):
    xml = tmp_path / "r.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="tests.a" name="ok"/>'
                   '<testcase classname="tests.a" name="bad"><failure message="x"/></testcase>'
                   '<testcase classname="tests.b" name="gone"><skipped/></testcase>'
                   '<testcase classname="tests.b" name="broken"><error/></testcase></testsuite></testsuites>')
    assert suite.pytest_counts(xml, "") == {"passed": 1, "failed": 1, "errors": 1, "skipped": 1,
                                            "failing": ["tests.a::bad", "tests.b::broken"]}
    counts = suite.pytest_counts(tmp_path / "missing.xml", "...\n3 failed, 120 passed, 7 skipped, 1 error in 9s")
    assert (counts["passed"], counts["failed"], counts["skipped"], counts["errors"]) == (120, 3, 7, 1)


@pytest.fixture(scope="module")
def step():
    return load("step_benchmark", ROOT / "benchmarks" / "step.py")


def fake_measure(speeds: dict):
    """step.measure standing in for the subprocesses: tokens/s per batch size, or an error."""
    calls = []

    def measure(kind, context, batch, timeout):
        calls.append(batch)
        value = speeds[batch]
        row = {"kind": kind, "context": context, "batch": batch}
        return {**row, "error": value} if isinstance(value, str) else {**row, "tok_s": value, "ms": 1.0}
    return measure, calls


def test_batch_search_stops_at_out_of_memory_and_marks_the_best(step, monkeypatch):
    measure, calls = fake_measure({8: 100.0, 16: 180.0, 32: "out of memory", 64: 500.0})
    monkeypatch.setattr(step, "measure", measure)
    rows = step.search("fast", 1024, [8, 16, 32, 64], deadline=None)
    assert calls == [8, 16, 32]  # nothing after the first size that does not fit
    assert [r.get("best", False) for r in rows] == [False, True, False] and rows[2]["error"] == "out of memory"


def test_batch_search_stops_when_a_larger_batch_is_not_2_percent_faster(step, monkeypatch):
    measure, calls = fake_measure({8: 100.0, 16: 150.0, 32: 152.0, 64: 400.0})
    monkeypatch.setattr(step, "measure", measure)
    rows = step.search("fast", 1024, [8, 16, 32, 64], deadline=None)
    assert calls == [8, 16, 32]  # 152 is 1.3 % above 150: larger batches are not tried
    assert [r.get("best", False) for r in rows] == [False, False, True]  # the fastest measured is the best
    measure, calls = fake_measure({8: 100.0, 16: 150.0, 32: 120.0, 64: 400.0})
    monkeypatch.setattr(step, "measure", measure)
    rows = step.search("fast", 1024, [8, 16, 32, 64], deadline=None)
    assert calls == [8, 16, 32] and [r.get("best", False) for r in rows] == [False, True, False]


def test_batch_search_leaves_out_what_cannot_finish_before_the_deadline(step, monkeypatch):
    def slow(kind, context, batch, timeout):
        time.sleep(0.3)
        return {"kind": kind, "context": context, "batch": batch, "tok_s": float(batch), "ms": 1.0}
    monkeypatch.setattr(step, "measure", slow)
    rows = step.search("fast", 256, [1, 2, 4], deadline=time.monotonic() + 0.5)  # time for one, not two
    assert [r["batch"] for r in rows] == [1, 2] and rows[0]["best"]
    assert rows[1]["error"].startswith("skipped: not enough time left in --time-limit")


def test_a_long_command_is_shown_in_lines_that_fit_the_page_and_join_back_to_it(suite):
    command = "python benchmarks/step.py " + " ".join(f"--flag-{i} value-{i}" for i in range(12)) + " --json /tmp/x.json"
    lines = suite.wrapped(command)
    assert len(lines) > 1 and all(len(line) <= 84 for line in lines)
    assert all(line.endswith(" \\") for line in lines[:-1]) and all(line.startswith("    ") for line in lines[1:])
    assert " ".join(line.removesuffix(" \\").strip() for line in lines) == command  # the same words, in order
    assert suite.wrapped("python short.py") == ["python short.py"]
