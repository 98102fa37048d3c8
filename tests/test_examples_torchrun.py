"""Both examples under ``torchrun --nproc_per_node 2`` (gloo, CPU) on tiny data: checkpoints move between 2 processes
and 1, and the 2-process final evaluation is the 1-process evaluation of the same saved model.

Each torchrun job runs in its own process group (session) with a timeout: a failing or hanging rank fails the test,
and the whole group is killed, instead of the test hanging.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from script_loader import load_script
import torch

dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available in this build of torch", allow_module_level=True)

from test_examples_enwik8 import corpus, tiny as enwik8_flags  # noqa: E402,F401 - the fixture and its flags
from test_examples_imdb import data_dir, tiny as imdb_flags  # noqa: E402,F401

from torchformer.data import enwik8  # noqa: E402
from torchformer.data.batching import ClassificationBatches  # noqa: E402
from torchformer.data.imdb_dataset import imdb  # noqa: E402
from torchformer.data.tokenizers import tokenizer_from_state_dict  # noqa: E402
from torchformer.train.checkpoint import read_checkpoint  # noqa: E402
from torchformer.train.evaluation import bits_per_byte  # noqa: E402
from torchformer import load_model  # noqa: E402
from torchformer.train.metrics import evaluate_classifier  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 120  # seconds for one torchrun job: 2 processes on one core take about 10


def load(name: str):
    return load_script(ROOT / "examples" / f"{name}.py")


def torchrun(script: str, argv: list[str], logs: Path) -> str:
    """Run ``examples/<script>.py`` on 2 processes; its standard output (rank 0's). Fails on an error or timeout.

    The output goes to files in ``logs``, not pipes: a worker left behind cannot keep the test waiting for a pipe.
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(ROOT / "src"),
                                                                                 os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               str(ROOT / "examples" / f"{script}.py"), *argv]
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / "stdout.txt", "w") as out, open(logs / "stderr.txt", "w") as err:
        job = subprocess.Popen(command, env=env, stdout=out, stderr=err, start_new_session=True)
        try:
            job.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            job.terminate()  # torchrun passes SIGTERM on to its workers (each in a session of its own)
            try:
                job.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
            pytest.fail(f"torchrun {script}.py did not finish within {TIMEOUT} s")
    assert job.returncode == 0, f"torchrun {script}.py failed ({job.returncode}):\n" \
                                f"{(logs / 'stderr.txt').read_text()[-3000:]}"
    return (logs / "stdout.txt").read_text()


def rows(log: Path) -> list[tuple]:
    """(step, loss, lr, val_bpb) of each training row of an enwik8 log."""
    with open(log, newline="", encoding="utf-8") as f:
        return [(r["step"], r["loss"], r["lr"], r["val_bpb"]) for r in csv.DictReader(f) if r["loss"]]


def training_steps(log: Path) -> list[int]:
    with open(log, newline="", encoding="utf-8") as f:
        return [int(r["step"]) for r in csv.DictReader(f) if r.get("loss") or r.get("train_loss")]


@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
def test_enwik8_on_two_fsdp_processes_resumes_exactly_on_two_and_in_one_and_evaluates_as_one(corpus, tmp_path,
                                                                                              capsys):
    # With the cpu preset's Muon: under FSDP2 ShardedMuon, resumed in one process by Muon.
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    flags = [*enwik8_flags(corpus, out, "--checkpoint", str(ckpt), "-N", "4", "--test-every", "2", "--optimizer",
                           "muon")]
    printed = torchrun("generate_enwik8", [*flags, "--strategy", "fsdp", "--checkpoint-blocks"], tmp_path / "logs")
    assert "processes: 2 processes (FSDP over gloo); -b 4 sequences per step in all (2 per process)" in printed
    assert printed.count("validation bits per byte:") == 1  # only rank 0 prints
    assert sorted(p.name for p in ckpt.glob("*.pt")) == ["step_00000002.pt", "step_00000004.pt"]
    assert len(torch.load(ckpt / "step_00000004.pt", weights_only=True)["ranks"]) == 2  # both processes' RNGs
    assert training_steps(out / "log.csv") == [1, 2, 3, 4]  # one writer: each step once

    # The 2-process evaluation is the 1-process evaluation of the saved model, exactly.
    result = json.loads((out / "results.json").read_text())
    assert result["processes"] == 2
    _, val, _ = enwik8(corpus)
    assert bits_per_byte(load_model(out / "model.pt"), val, context=16, batch_size=64) == result["bpb"]

    # Two processes resume the step-2 checkpoint exactly: the same losses, validations and final figure.
    (tmp_path / "ckpt2").mkdir()
    shutil.copy(ckpt / "step_00000002.pt", tmp_path / "ckpt2")
    again = tmp_path / "again"
    flags = enwik8_flags(corpus, again, "--checkpoint", str(tmp_path / "ckpt2"), "-N", "4", "--test-every", "2",
                         "--optimizer", "muon")
    assert "at step 2" in torchrun("generate_enwik8", [*flags, "--strategy", "fsdp", "--checkpoint-blocks"],
                                   tmp_path / "logs2")
    assert rows(again / "log.csv") == rows(out / "log.csv")[2:]  # steps 3 and 4, to the last digit
    assert json.loads((again / "results.json").read_text())["bpb"] == result["bpb"]

    # One process resumes the 2-process checkpoint and carries on counting.
    capsys.readouterr()
    resumed = load("generate_enwik8").main(enwik8_flags(corpus, out, "--checkpoint", str(ckpt), "-N", "6",
                                                        "--test-every", "2", "--optimizer", "muon"))
    printed = capsys.readouterr().out
    assert "at step 4" in printed and "written by 2 process(es), resumed on 1" in printed
    assert resumed["step"] == 6 and resumed["processes"] == 1
    assert training_steps(out / "log.csv") == [1, 2, 3, 4, 5, 6]


def test_imdb_resumes_a_one_process_checkpoint_on_two_and_evaluates_as_one(data_dir, tmp_path):
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    flags = imdb_flags(data_dir, out, "-e", "2", "--final", "--checkpoint", str(ckpt))
    assert load("classify_imdb").main([*flags, "--stop-at", "10"]) == {}  # one process, stopped mid-epoch

    printed = torchrun("classify_imdb", flags, tmp_path / "logs")  # 2 DDP processes: from step 10 to the end (34)
    assert "processes: 2 processes (DDP over gloo); -b 16 reviews per step in all (8 per process)" in printed
    assert "at step 10" in printed and "written by 1 process(es), resumed on 2" in printed
    assert printed.count("test accuracy") == 1  # only rank 0 prints
    assert read_checkpoint(out / "model.pt")["step"] == 34
    with open(out / "log.csv", newline="", encoding="utf-8") as f:
        validations = [int(r["step"]) for r in csv.DictReader(f) if r["val_loss"]]
    assert validations == [7, 10, 14, 21, 28, 34]  # each once (10: the stop), written by one process

    # The 2-process test figures are the 1-process evaluation of the saved model, every one of them.
    results = json.loads((out / "results.json").read_text())
    model = load_model(out / "model.pt")
    tokenizer = tokenizer_from_state_dict(read_checkpoint(out / "model.pt")["extra"]["tokenizer"])
    _, test = imdb(str(data_dir))
    encoded = [tokenizer.encode(text, max_length=32) or [1] for text, _ in test]
    expected = evaluate_classifier(model, ClassificationBatches(encoded, [y for _, y in test], batch_size=32,
                                                                shuffle=False))
    assert (results["accuracy"], results["loss"], results["count"]) == (expected.accuracy, expected.loss, 120)
    assert results["confusion"] == expected.confusion.tolist()
    assert results["calibration"] == expected.calibration.to_dict()
    assert results["accuracy"] >= 0.9  # it learned the tiny corpus's rule


@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
def test_enwik8_with_memory_on_two_ddp_processes_keeps_each_ones_memory_and_resumes_exactly(corpus, tmp_path,
                                                                                            capsys):
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    memory = ["--memory", "8", "--positions", "rotary", "-N", "4", "--test-every", "2"]
    torchrun("generate_enwik8", enwik8_flags(corpus, out, "--checkpoint", str(ckpt), *memory), tmp_path / "logs")
    ranks = torch.load(ckpt / "step_00000002.pt", weights_only=True)["ranks"]
    keys = [rank["state"]["memory"][0]["entries"][0] for rank in ranks]  # block 0's keys, of each process
    assert [k.shape[0] for k in keys] == [2, 2]  # each its 2 of the 4 streams
    assert not torch.equal(keys[0], keys[1])
    (tmp_path / "ckpt2").mkdir()
    shutil.copy(ckpt / "step_00000002.pt", tmp_path / "ckpt2")
    again = tmp_path / "again"
    torchrun("generate_enwik8", enwik8_flags(corpus, again, "--checkpoint", str(tmp_path / "ckpt2"), *memory),
             tmp_path / "logs2")
    assert rows(again / "log.csv") == rows(out / "log.csv")[2:]  # each process got its own memory back
    capsys.readouterr()
    load("generate_enwik8").main(enwik8_flags(corpus, tmp_path / "one", "--checkpoint", str(ckpt), *memory[:-4],
                                              "-N", "6", "--test-every", "2"))
    assert "holds the memory of 2 process(es): this run's memory starts empty" in capsys.readouterr().out


def test_packed_imdb_on_two_ddp_processes_takes_the_steps_of_one(data_dir, tmp_path):
    # Each process divides its documents' summed loss by its share of the batch's reviews (not rows): the averaged
    # gradients are those of the whole batch's mean, so two processes train the weights one process trains.
    flags = ["--pack", "-M", "64", "-e", "1", "--dropout", "0"]  # 6 rows per batch: 3 per process
    one = tmp_path / "one"
    load("classify_imdb").main(imdb_flags(data_dir, one, *flags))
    printed = torchrun("classify_imdb", imdb_flags(data_dir, tmp_path / "two", *flags), tmp_path / "logs")
    assert "6 rows per batch" in printed and "2 processes (DDP over gloo)" in printed
    a = torch.load(one / "model.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "two" / "model.pt", weights_only=True)["model"]
    for key, value in a.items():  # 17 Adam steps; the sums' order differs between 1 and 2 processes
        torch.testing.assert_close(b[key], value, rtol=1e-4, atol=1e-5, msg=key)
