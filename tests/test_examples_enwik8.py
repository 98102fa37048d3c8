"""End-to-end tests of examples/generate_enwik8.py on a tiny synthetic corpus (never the network or shared data)."""

from __future__ import annotations

import csv
import functools
import json
import math
import os
import random
import re
from pathlib import Path

import pytest
from script_loader import load_script
import torch

from torchformer import load_model

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "generate_enwik8.py"


@pytest.fixture(scope="module")
def script():
    return load_script(SCRIPT)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """30 KB of pseudo-English: enough structure to learn from, not enwik8 (so the script warns)."""
    rng = random.Random(0)
    words = ["the", "cat", "sat", "on", "a", "mat", "[[link]]", "and", "<page>", "of", "Wikipedia", "\n"]
    path = tmp_path_factory.mktemp("data") / "tiny.txt"
    path.write_text(" ".join(rng.choice(words) for _ in range(6000)), encoding="utf-8")
    return path


def tiny(corpus: Path, out: Path, *extra: str) -> list[str]:
    """A 20-step run of a tiny model; dropout and accumulation on, so every source of randomness matters. The cpu
    preset's Muon, kqnorm and WSD schedule are off (flags given later win): these tests are of the script, not of
    the preset."""
    return ["-D", str(corpus), "--out", str(out), "--threads", "1", "-N", "20", "-b", "4", "-E", "16", "-H", "2",
            "-d", "2", "-C", "16", "--dropout", "0.1", "--accumulate", "2", "--lr-warmup", "4", "-l", "3e-3",
            "--test-every", "5", "--test-subset", "300", "--sample-length", "8", "--temperature", "1.0",
            "--optimizer", "adam", "--no-kqnorm", "--schedule", "cosine", *extra]  # unless a test says otherwise


def read_log(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def training_rows(rows: list[dict]) -> dict[int, dict]:
    return {int(r["step"]): r for r in rows if r["loss"]}


@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
def test_killed_after_checkpoint_and_resumed_matches_uninterrupted_run(script, corpus, tmp_path, capsys):
    whole = script.main(tiny(corpus, tmp_path / "a", "--checkpoint", str(tmp_path / "a_ckpt")))
    whole_out = capsys.readouterr().out

    stopped = script.main(tiny(corpus, tmp_path / "b", "--checkpoint", str(tmp_path / "b_ckpt"), "--stop-after", "12"))
    assert stopped == {"step": 12}
    assert sorted(p.name for p in (tmp_path / "b_ckpt").glob("*.pt"))[-1] == "step_00000012.pt"
    assert max(training_rows(read_log(tmp_path / "b" / "log.csv"))) == 12
    capsys.readouterr()

    resumed = script.main(tiny(corpus, tmp_path / "b", "--checkpoint", str(tmp_path / "b_ckpt")))
    resumed_out = capsys.readouterr().out
    assert "resumed from" in resumed_out and "at step 12" in resumed_out

    a, b = read_log(tmp_path / "a" / "log.csv"), read_log(tmp_path / "b" / "log.csv")
    steps_a, steps_b = training_rows(a), training_rows(b)
    assert sorted(steps_b) == list(range(1, 21)), "every step logged exactly once across the two runs"
    for step in range(1, 21):  # exact equality: batches, dropout masks, optimizer and schedule all restored
        assert steps_b[step]["loss"] == steps_a[step]["loss"], step
        assert steps_b[step]["lr"] == steps_a[step]["lr"], step
        assert steps_b[step]["val_bpb"] == steps_a[step]["val_bpb"], step
    losses = [float(steps_a[s]["loss"]) for s in range(1, 21)]
    assert len(set(losses)) > 10  # the run really trained (the losses are not all the same number)
    assert resumed["bpb"] == whole["bpb"]
    # The sampling generator is restored too: the samples after the resume are the uninterrupted run's.
    samples = lambda out: [part.split("\n\n")[0] for part in out.split("sample (seed")[1:]]  # noqa: E731
    assert len(samples(whole_out)) == 4 and len(samples(resumed_out)) == 2  # steps 5, 10, 15, 20 and 15, 20
    assert samples(resumed_out) == samples(whole_out)[2:]
    # Only the two newest checkpoints are kept.
    assert sorted(p.name for p in (tmp_path / "b_ckpt").glob("*.pt")) == ["step_00000015.pt", "step_00000020.pt"]


@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
def test_final_reports_test_split_and_learns(script, corpus, tmp_path):
    args = tiny(corpus, tmp_path, "--final", "-N", "40", "--dropout", "0.0")
    result = script.main(args)
    assert result["split"] == "test"
    assert 0 < result["bpb"] < 6.0  # a uniform guess over the 256 byte values costs 8 bits per byte
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["bpb"] == result["bpb"] and saved["data"] == str(corpus)  # which data the figure is of
    assert script.data_name(str(corpus)) == "tiny.txt" and script.data_name("bundled sample (x)").startswith("bundled")
    assert (tmp_path / "loss.png").stat().st_size > 0


@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
def test_resume_skips_a_damaged_newest_checkpoint_and_logs_each_step_once(script, corpus, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    whole = script.main(tiny(corpus, tmp_path / "a"))
    script.main(tiny(corpus, tmp_path / "b", "--checkpoint", str(ckpt), "--stop-after", "12"))
    newest = ckpt / "step_00000012.pt"
    newest.write_bytes(newest.read_bytes()[:1000])  # the newest checkpoint was cut short by the crash
    stale = ckpt / ".step_00000015.pt.tmp-otherhost-1-00"  # and a killed save of another machine, long ago
    stale.write_bytes(b"x")
    os.utime(stale, (0, 0))
    capsys.readouterr()
    with pytest.warns(UserWarning, match="step_00000012.pt is damaged"):
        resumed = script.main(tiny(corpus, tmp_path / "b", "--checkpoint", str(ckpt)))
    out = capsys.readouterr().out
    assert "resumed from" in out and "at step 10" in out and "removed .step_00000015" in out
    assert not stale.exists()
    assert resumed["bpb"] == whole["bpb"]  # resumed from step 10, the run still ends exactly where it would
    rows = training_rows(read_log(tmp_path / "b" / "log.csv"))
    assert sorted(rows) == list(range(1, 21))
    # The damaged file was set aside: the run's own step 15 and 20 are the two checkpoints pruning kept.
    assert sorted(p.name for p in ckpt.iterdir()) == ["step_00000012.pt.damaged", "step_00000015.pt",
                                                       "step_00000020.pt"]
    # Running a finished run again trains nothing and adds no row.
    before = (tmp_path / "b" / "log.csv").read_text()
    assert script.main(tiny(corpus, tmp_path / "b", "--checkpoint", str(ckpt)))["bpb"] == whole["bpb"]
    assert (tmp_path / "b" / "log.csv").read_text() == before


@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
def test_divergence_stops_with_the_step_and_keeps_the_checkpoints(script, corpus, tmp_path, monkeypatch):
    ckpt = tmp_path / "ckpt"
    script.main(tiny(corpus, tmp_path, "--checkpoint", str(ckpt), "--stop-after", "5"))
    saved = sorted(p.name for p in ckpt.glob("*.pt"))
    nll = torch.nn.functional.nll_loss
    calls = []

    def poisoned(*args, **kwargs):  # the loss turns NaN from the 4th micro-batch of the resumed run on (step 7)
        calls.append(1)
        loss = nll(*args, **kwargs)
        return loss * float("nan") if len(calls) > 3 else loss

    monkeypatch.setattr(script.F, "nll_loss", poisoned)
    with pytest.raises(SystemExit, match="diverged at step 7: the loss is nan.*lower learning rate") as info:
        script.main(tiny(corpus, tmp_path, "--checkpoint", str(ckpt)))
    assert "predate it and are kept" in str(info.value)
    assert sorted(p.name for p in ckpt.glob("*.pt")) == saved


@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
def test_checkpoint_of_compiled_model_resumes_uncompiled(script, corpus, tmp_path, monkeypatch):
    # The eager backend still wraps the model (keys gain "_orig_mod."), without a slow C++ compile in the test.
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    ckpt = str(tmp_path / "ckpt")
    script.main(tiny(corpus, tmp_path, "--checkpoint", ckpt, "--compile", "--stop-after", "3"))
    state = torch.load(next(Path(ckpt).glob("*.pt")), weights_only=True)
    assert not any(k.startswith("_orig_mod.") for k in state["model"])
    assert script.main(tiny(corpus, tmp_path, "--checkpoint", ckpt, "-N", "5"))["step"] == 5


@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
def test_resume_with_another_architecture_is_refused(script, corpus, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    script.main(tiny(corpus, tmp_path, "--checkpoint", ckpt, "--stop-after", "2"))
    with pytest.raises(SystemExit, match="--heads 2 \\(now 4\\)"):
        script.main(tiny(corpus, tmp_path, "--checkpoint", ckpt, "-H", "4"))
    # The training flags that fix the batches, the dropout masks and the updates: the resumed run would not be the
    # run it claims to continue (another --lr-warmup ended 0.09 bits/byte away, silently).
    for flags, named in [(["-b", "8"], "--batch-size 4 (now 8)"), (["--accumulate", "1"], "--accumulate 2 (now 1)"),
                         (["--lr-warmup", "8"], "--lr-warmup 4 (now 8)"),
                         (["--dropout", "0.2"], "--dropout 0.1 (now 0.2)"),
                         (["--gradient-clipping", "0.5"], "--gradient-clipping 1.0 (now 0.5)"),
                         (["--seed", "7"], "--seed 1 (now 7)")]:
        with pytest.raises(SystemExit, match=re.escape(named)):
            script.main(tiny(corpus, tmp_path, "--checkpoint", ckpt, *flags))


def test_without_data_uses_bundled_sample_loudly(script, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TORCHFORMER_HOME", str(tmp_path / "empty_cache"))
    result = script.main(["--out", str(tmp_path), "--threads", "1", "-N", "2", "-b", "2", "-E", "16", "-H", "2",
                          "-d", "1", "-C", "16", "--test-subset", "200", "--sample-length", "0"])
    assert "SAMPLE bundled" in capsys.readouterr().err
    assert result["split"] == "validation" and result["bpb"] > 0


def test_presets_fill_only_flags_not_given(script):
    args = script.parse_args(["--preset", "gpu", "-d", "2", "--device", "cpu"])
    assert args.depth == 2  # explicit flag wins
    assert (args.embedding, args.context) == (script.PRESETS["gpu"]["embedding"], script.PRESETS["gpu"]["context"])
    cpu = script.parse_args(["--device", "cpu"])  # no --preset: chosen by device
    assert cpu.embedding == script.PRESETS["cpu"]["embedding"]
    # The training length comes from the preset (--minutes for gpu, -N for cpu) unless either is given.
    assert (args.minutes, args.num_batches) == (script.PRESETS["gpu"]["minutes"], None)
    gpu_steps = script.parse_args(["--preset", "gpu", "-N", "100", "--device", "cpu"])
    assert (gpu_steps.minutes, gpu_steps.num_batches) == (None, 100)
    cpu_minutes = script.parse_args(["--minutes", "2", "--device", "cpu"])
    assert (cpu_minutes.minutes, cpu_minutes.num_batches) == (2.0, None)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-D", "no/such/enwik8.zip"], "--data must be a readable file, got no/such/enwik8.zip"),
        (["-D", "{folder}"], "--data must be a readable file"),
        (["--stop-after", "3"], "--checkpoint"),
        (["--stop-after", "0", "--checkpoint", "{folder}/ckpt"], "--stop-after must be a positive int, got 0"),
        (["-b", "0"], "--batch-size must be a positive int, got 0"),
        (["-C", "-1"], "--context must be a positive int, got -1"),
        (["--accumulate", "0"], "--accumulate must be a positive int, got 0"),
        (["--test-every", "-2"], "--test-every must be a positive int, got -2"),
        (["--log-every", "0"], "--log-every must be a positive int, got 0"),
        (["--minutes", "0"], "--minutes must be a positive number, got 0.0"),
        (["--minutes", "nan"], "--minutes must be a positive number, got nan"),
        (["--minutes", "inf"], "--minutes must be a positive number, got inf"),
        # Each of these used to fail only after training (the sampler at the first evaluation), or with a traceback.
        (["--temperature", "-1"], "--temperature must be 0 (greedy) or a number >= 0.001, got -1.0"),
        (["--temperature", "nan"], "--temperature must be 0 (greedy) or a number >= 0.001, got nan"),
        (["--temperature", "1e-300"], "--temperature must be 0 (greedy) or a number >= 0.001, got 1e-300"),
        (["--temperature", "inf"], "--temperature must be 0 (greedy) or a number >= 0.001, got inf"),
        (["--lr-warmup", "-1"], "--lr-warmup must be an int >= 0, got -1"),
        (["-l", "-1"], "--learn-rate must be a positive number below 1e30, got -1.0"),
        (["-l", "nan"], "--learn-rate must be a positive number below 1e30, got nan"),
        (["-l", "0"], "--learn-rate must be a positive number below 1e30, got 0.0"),
        (["-l", "1e38"], "--learn-rate must be a positive number below 1e30, got 1e+38"),
        (["--seed", "-1"], "--seed must be an int in [0, 2**32), got -1"),
        (["--seed", str(2**32)], "--seed must be an int in [0, 2**32), got 4294967296"),
        (["--threads", "-1"], "--threads must be a positive int, got -1"),
        (["--threads", "0"], "--threads must be a positive int, got 0"),
        (["--checkpoint", "{file}"], "--checkpoint must be a folder"),
        (["--out", "{file}"], "--out must be a folder"),
        (["--out", "{file}/sub"], "--out must be a folder"),
        (["--gradient-clipping", "-1"], "--gradient-clipping must be a number >= 0 (0: off), got -1.0"),
        (["--gradient-clipping", "nan"], "--gradient-clipping must be a number >= 0 (0: off), got nan"),
        (["--sample-length", "-5"], "--sample-length must be an int >= 0 (0: no samples), got -5"),
        (["--peak-tflops", "0"], "--peak-tflops must be a positive number, got 0.0"),
        (["--dropout", "1"], "--dropout must be a number in [0, 1), got 1.0"),
        (["--dropout", "-0.1"], "--dropout must be a number in [0, 1), got -0.1"),
        (["-E", "15", "-H", "2"], "--embedding must be divisible by --heads, got 15 and 2"),
        (["-H", "4", "--kv-heads", "3"], "--kv-heads must divide --heads, got 3 and 4"),
        (["--window", "0"], "--window must be a positive int, got 0"),
        (["--device", "gpu"], "--device"),
        (["--top-k", "0"], "--top-k must be a positive int, got 0"),
        (["--top-p", "1.5"], "--top-p must be a number in (0, 1], got 1.5"),
        (["--generate", ""], "--generate needs a non-empty prompt"),
        (["--generate", "ab\udcfe"], "argument --generate: not valid UTF-8 text: the byte 0xfe at character 2"),
        (["--generate", "x", "--length", "0"], "--length must be a positive int with --generate, got 0"),
        (["--generate", "x", "--temperature", "-1"], "--temperature must be 0 (greedy)"),
        (["-E", "100", "-H", "3"], "or pass --wide"),
    ],
)
def test_bad_flags_are_usage_errors_naming_the_flag(script, argv, message, tmp_path, capsys):
    (tmp_path / "a_file").write_text("x")
    argv = [a.replace("{file}", str(tmp_path / "a_file")).replace("{folder}", str(tmp_path)) for a in argv]
    with pytest.raises(SystemExit) as info:  # in parse_args: before any data is read or any step is trained
        script.main([*argv, "--device", "cpu"] if "--device" not in argv else argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
def test_resume_past_n_or_with_another_learning_rate_is_refused(script, corpus, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    script.main(tiny(corpus, tmp_path, "--checkpoint", ckpt, "-N", "4", "--test-every", "2"))
    (tmp_path / "results.json").unlink()
    # A checkpoint of step 4 must not be reported as a model of 2 steps.
    with pytest.raises(SystemExit, match="step_00000004.pt is at step 4, past -N 2; pass -N 4 or more"):
        script.main(tiny(corpus, tmp_path, "--checkpoint", ckpt, "-N", "2", "--test-every", "2"))
    assert not (tmp_path / "results.json").exists()
    # The optimizer and schedule would come back with the checkpoint's learning rate, ignoring the new one.
    with pytest.raises(SystemExit, match="--learn-rate 0.003 \\(now 0.01\\)"):
        script.main(tiny(corpus, tmp_path, "--checkpoint", ckpt, "-N", "6", "-l", "1e-2"))


@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
def test_nan_weights_with_finite_losses_stop_at_the_evaluation(script, corpus, tmp_path):
    # The loss of step 1 is finite (computed before its update); the update with this learning rate breaks the
    # weights, and the evaluation right after finds NaN: a divergence exit, not a traceback, and nothing is saved.
    ckpt = tmp_path / "ckpt"
    with pytest.raises(SystemExit, match="evaluation at step 1 failed.*lower learning rate") as info:
        script.main(tiny(corpus, tmp_path, "--checkpoint", str(ckpt), "-l", "1e10", "--lr-warmup", "0",
                         "--gradient-clipping", "0", "--test-every", "1"))
    assert "flags -l, --lr-warmup" in str(info.value)
    assert not list(ckpt.glob("*.pt"))


@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
def test_minutes_sets_the_number_of_steps_and_a_resume_keeps_it(script, corpus, tmp_path, capsys):
    # 3 seconds of training; evaluation only at the end (a later --test-every wins over tiny()'s)
    args = list(tiny(corpus, tmp_path, "--checkpoint", str(tmp_path / "ckpt"), "--minutes", "0.05",
                     "--test-every", "100000"))
    del args[args.index("-N"):args.index("-N") + 2]
    stopped = script.main([*args, "--stop-after", "3"])
    printed = capsys.readouterr().out
    steps = int(printed.split("ms per step measured, so -N ")[1].split()[0])
    assert stopped == {"step": 3} and steps >= 3
    resumed = script.main(args)  # no new measurement: the checkpoint's -N is kept, so the schedule is the same
    assert "ms per step measured" not in capsys.readouterr().out
    assert resumed["step"] == steps


def test_minutes_and_num_batches_together_are_refused(script, capsys):
    with pytest.raises(SystemExit):
        script.parse_args(["--minutes", "5", "-N", "100", "--device", "cpu"])
    assert "not both" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
def test_resume_with_other_kqnorm_names_the_flag(script, corpus, tmp_path):
    # With --kqnorm another -H also changes weight shapes; the flag comparison must come first, with its message.
    ckpt = str(tmp_path / "ckpt")
    script.main(tiny(corpus, tmp_path, "--checkpoint", ckpt, "--stop-after", "2", "--kqnorm"))
    with pytest.raises(SystemExit, match="--heads 2 \\(now 4\\)"):
        script.main(tiny(corpus, tmp_path, "--checkpoint", ckpt, "-H", "4", "--kqnorm"))
    with pytest.raises(SystemExit, match="--kqnorm True \\(now False\\)"):
        script.main(tiny(corpus, tmp_path, "--checkpoint", ckpt, "--no-kqnorm"))


@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
def test_resume_continues_the_checkpoints_schedule_unless_n_is_given(script, corpus, tmp_path, capsys):
    ckpt = str(tmp_path / "ckpt")
    script.main(tiny(corpus, tmp_path, "--checkpoint", ckpt, "--stop-after", "3"))  # a run of -N 20
    without_n = list(tiny(corpus, tmp_path, "--checkpoint", ckpt))
    del without_n[without_n.index("-N"):without_n.index("-N") + 2]  # the cpu preset would say -N 2000
    script.main([*without_n, "--stop-after", "5"])
    rows = training_rows(read_log(tmp_path / "log.csv"))
    lr_at_5 = float(rows[5]["lr"])
    reference = tmp_path / "reference"  # the same 5 steps of -N 20, never interrupted
    script.main(tiny(corpus, reference, "--checkpoint", str(reference / "ckpt"), "--stop-after", "5"))
    assert lr_at_5 == float(training_rows(read_log(reference / "log.csv"))[5]["lr"])
    capsys.readouterr()
    assert script.main(tiny(corpus, tmp_path, "--checkpoint", ckpt, "-N", "8"))["step"] == 8  # an explicit -N wins
    assert "was trained with -N 20; with -N 8 the learning-rate schedule changes" in capsys.readouterr().out


@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
def test_a_foreign_file_in_the_checkpoint_folder_is_a_clear_error(script, corpus, tmp_path):
    (tmp_path / "ckpt").mkdir()
    torch.save({"weight": torch.zeros(2)}, tmp_path / "ckpt" / "step_00000005.pt")  # a bare state_dict
    with pytest.raises(SystemExit, match="is not a checkpoint written by this script"):
        script.main(tiny(corpus, tmp_path, "--checkpoint", str(tmp_path / "ckpt")))


@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
def test_the_final_model_is_saved_and_generate_continues_a_prompt_with_it(script, corpus, tmp_path, capsys):
    """Without --checkpoint the trained model still lands in --out; --generate rebuilds it from that file alone and
    samples exactly what torchformer.generate samples with the same seed."""
    from torchformer import generate, load_model

    script.main(tiny(corpus, tmp_path, "-N", "10", "--dropout", "0.0"))
    assert (tmp_path / "model.pt").is_file()
    capsys.readouterr()
    argv = ["--generate", "the cat", "--length", "30", "--temperature", "0.8", "--top-k", "20", "--out",
            str(tmp_path), "--threads", "1", "--seed", "3"]
    text = script.main(argv)
    assert capsys.readouterr().out == text + "\n"
    assert text.startswith("the cat") and script.main(argv) == text  # seeded: the same continuation again

    model = load_model(tmp_path / "model.pt")
    prompt = torch.tensor([list(b"the cat")])
    ids = generate(model, prompt, 30, temperature=0.8, top_k=20, generator=torch.Generator().manual_seed(3))
    assert text == bytes(ids[0].tolist()).decode("utf-8", errors="replace")
    greedy = script.main([*argv[:6], "--temperature", "0", "--out", str(tmp_path), "--threads", "1"])
    assert greedy != text  # the flags reach the sampler


@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
def test_generate_reads_the_latest_checkpoint_and_says_where_a_model_is_missing(script, corpus, tmp_path, capsys):
    with pytest.raises(SystemExit, match="no trained model at .*model.pt: train first .*--out"):
        script.main(["--generate", "x", "--out", str(tmp_path / "nothing"), "--threads", "1"])
    with pytest.raises(SystemExit, match=r"no checkpoint at .*nockpt \(--checkpoint\)"):  # says what was given
        script.main(["--generate", "x", "--checkpoint", str(tmp_path / "nockpt"), "--threads", "1"])
    script.main(tiny(corpus, tmp_path / "run", "--checkpoint", str(tmp_path / "ckpt"), "--stop-after", "5"))
    text = script.main(["--generate", "a", "--length", "5", "--checkpoint", str(tmp_path / "ckpt"), "--threads", "1"])
    assert text.startswith("a") and len(text) > 1
    (tmp_path / "foreign.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(SystemExit, match="error: .*foreign.pt"):
        script.main(["--generate", "x", "--checkpoint", str(tmp_path / "foreign.pt"), "--threads", "1"])


@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
def test_the_log_holds_the_training_loss_in_bits_per_byte_too(script, corpus, tmp_path):
    script.main(tiny(corpus, tmp_path, "-N", "10"))
    rows = [r for r in read_log(tmp_path / "log.csv") if r["loss"]]
    assert len(rows) == 10
    for row in rows:  # nats / ln 2 = bits, and a byte-level model's loss per token is per byte
        assert float(row["train_bpb"]) == pytest.approx(float(row["loss"]) / math.log(2), rel=1e-9)


def test_a_non_enwik8_file_is_a_plain_note_not_a_python_warning(script, corpus, tmp_path, capsys):
    script.load_data(corpus)
    err = capsys.readouterr().err
    assert err.startswith("note: ") and "not the 100,000,000 of the official enwik8" in err
    assert "return enwik8" not in err  # no source line, as warnings.warn prints


def test_help_shows_each_flags_default_and_what_the_presets_set(script, capsys):
    with pytest.raises(SystemExit):
        script.parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    cpu, gpu = script.PRESETS["cpu"], script.PRESETS["gpu"]
    assert f"--preset cpu: {cpu['num_batches']}; --preset gpu: not set" in help_text
    assert f"--preset cpu: {cpu['embedding']}; --preset gpu: {gpu['embedding']}" in help_text
    assert "(default: 600)" in help_text and "(default: 1.0)" in help_text  # --sample-length, --gradient-clipping
    assert "--preset cpu means --num-batches 2000" in help_text and "--no-kqnorm" in help_text


@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
def test_wide_heads_train_when_the_embedding_is_not_divisible(script, corpus, tmp_path, capsys):
    from torchformer import load_model

    script.main(tiny(corpus, tmp_path, "-N", "2", "-E", "18", "-H", "4", "--wide"))
    assert load_model(tmp_path / "model.pt").config.wide
    assert "1 CPU thread(s) (--threads)" in capsys.readouterr().out  # the start-up line names the threads


@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
def test_a_mixture_of_experts_logs_its_balance_loss_and_load_resumes_exactly_and_latent_attention_runs(
        script, corpus, tmp_path, capsys):
    from torchformer import DeepSeekTransformer, MoETransformer
    from torchformer.nn.moe import MoEOptions

    moe = ["--experts", "4", "--activation", "swiglu", "--norm", "rms", "--positions", "rotary"]
    whole = script.main(tiny(corpus, tmp_path / "a", *moe))
    printed = capsys.readouterr().out
    assert "expert load, max/min over the mean, by block:" in printed
    rows = training_rows(read_log(tmp_path / "a" / "log.csv"))
    # the balance loss of the two blocks, each about k = 2 at weight 0.01, averaged over the micro-batches
    assert all(0.02 < float(rows[s]["aux_loss"]) < 0.1 for s in rows)
    model = load_model(tmp_path / "a" / "model.pt")
    assert type(model) is MoETransformer and model.config.options_of(MoEOptions).experts == 4
    ckpt = tmp_path / "ckpt"
    script.main(tiny(corpus, tmp_path / "b", *moe, "--checkpoint", str(ckpt), "--stop-after", "12"))
    assert script.main(tiny(corpus, tmp_path / "b", *moe, "--checkpoint", str(ckpt)))["bpb"] == whole["bpb"]
    latent = script.main(tiny(corpus, tmp_path / "c", *moe, "--latent-rank", "8", "--rope-dim", "4", "-N", "6"))
    assert math.isfinite(latent["bpb"]) and type(load_model(tmp_path / "c" / "model.pt")) is DeepSeekTransformer
    capsys.readouterr()
    with pytest.raises(SystemExit):
        script.main(tiny(corpus, tmp_path / "d", "--latent-rank", "8", "--positions", "learned"))
    assert "--latent-rank needs rotary positions" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
def test_muon_trains_resumes_exactly_and_a_resume_with_the_other_optimizer_is_refused(script, corpus, tmp_path,
                                                                                      capsys):
    whole = script.main(tiny(corpus, tmp_path / "a", "--optimizer", "muon"))
    adam = script.main(tiny(corpus, tmp_path / "adam"))
    assert whole["bpb"] != adam["bpb"]  # another optimizer took the steps
    ckpt = tmp_path / "ckpt"
    script.main(tiny(corpus, tmp_path / "b", "--optimizer", "muon", "--checkpoint", str(ckpt), "--stop-after", "12"))
    resumed = script.main(tiny(corpus, tmp_path / "b", "--optimizer", "muon", "--checkpoint", str(ckpt)))
    assert resumed["bpb"] == whole["bpb"]  # Muon's momenta and Adam's moments both restored
    a, b = training_rows(read_log(tmp_path / "a" / "log.csv")), training_rows(read_log(tmp_path / "b" / "log.csv"))
    assert all(a[s]["loss"] == b[s]["loss"] for s in range(1, 21))
    capsys.readouterr()
    with pytest.raises(SystemExit, match="cannot resume: .* was trained with --optimizer muon \\(now adam\\)"):
        script.main(tiny(corpus, tmp_path / "b", "--checkpoint", str(ckpt), "-N", "30"))


@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
def test_a_run_extended_with_a_larger_n_continues_its_schedule_by_the_documented_rule(script, corpus, tmp_path):
    """Warmup as the run started (min(--lr-warmup, its first -N)), then cosine decay to the new -N, from the first
    resumed step on: neither the old rule's rate at the first step nor a second warmup."""
    ckpt = tmp_path / "ckpt"
    short = [a if a != "20" else "12" for a in tiny(corpus, tmp_path / "run", "--checkpoint", str(ckpt))]
    short[short.index("--lr-warmup") + 1] = "30"  # longer than the run: the warmup is the run's 12 steps
    script.main(short)
    longer = [a if a != "12" else "24" for a in short]
    script.main(longer)
    rows = training_rows(read_log(tmp_path / "run" / "log.csv"))
    assert sorted(rows) == list(range(1, 25))

    def rule(s, warmup, total, base=3e-3, m=0.1):  # warmup_cosine's documented f(s), written out
        if s < warmup:
            return base * (s + 1) / (warmup + 1)
        if s >= total:
            return base * m
        return base * (m + (1 - m) * 0.5 * (1 + math.cos(math.pi * (s - warmup) / (total - warmup))))

    for step in range(1, 13):  # the first run: its own rule (step s trains with the rate after s - 1 updates)
        assert float(rows[step]["lr"]) == pytest.approx(rule(step - 1, 12, 12), rel=1e-6), step
    for step in range(13, 25):  # extended: the same warmup, the decay stretched to 24
        assert float(rows[step]["lr"]) == pytest.approx(rule(step - 1, 12, 24), rel=1e-6), step


def test_overfitting_is_recognised_by_validation_rising_twice_in_a_row(script):
    assert script.rising([2.48, 2.58, 3.11])  # the bundled sample's run of issue 31
    assert not script.rising([2.48, 2.58])  # one rise: noise, not yet a trend
    assert not script.rising([3.0, 2.6, 2.7, 2.5])  # falling again
    assert script.rising([3.0, 2.5, 2.6, 2.7]) and not script.rising([2.5, 2.5, 2.5])


@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
def test_the_bundled_sample_trains_500_steps_unless_told_otherwise(script, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TORCHFORMER_HOME", str(tmp_path / "empty_home"))  # no enwik8 there: the bundled sample
    small = ["--out", str(tmp_path / "a"), "--threads", "1", "-b", "2", "-E", "8", "-H", "2", "-d", "1", "-C", "8",
             "--test-every", "1000", "--test-subset", "50", "--sample-length", "0", "--preset", "cpu"]
    assert script.main([*small, "--stop-after", "1", "--checkpoint", str(tmp_path / "ck")]) == {"step": 1}
    out = capsys.readouterr().out
    assert "note: -N 500 instead of the preset's 2000" in out
    script.main([*small[:1], str(tmp_path / "b"), *small[2:], "-N", "3"])  # -N given: taken as it is
    assert "note: -N 500" not in capsys.readouterr().out


@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
def test_checkpoints_on_the_clock_between_evaluations_and_a_run_killed_after_one_resumes_exactly(
        script, corpus, tmp_path, capsys):
    # One evaluation (at the end, step 20), a log every 2 steps, and a clock always due: every logging step saves.
    clocked = ("--test-every", "100", "--log-every", "2", "--checkpoint-minutes", "1e-9")
    whole = script.main(tiny(corpus, tmp_path / "a", *clocked))
    ckpt = tmp_path / "ckpt"
    script.main(tiny(corpus, tmp_path / "b", *clocked, "--checkpoint", str(ckpt)))
    assert sorted(p.name for p in ckpt.glob("*.pt")) == ["step_00000018.pt", "step_00000020.pt"]
    (ckpt / "step_00000020.pt").unlink()  # as if killed between the clock's save at step 18 and the end
    capsys.readouterr()
    resumed = script.main(tiny(corpus, tmp_path / "b", *clocked, "--checkpoint", str(ckpt)))
    assert "at step 18" in capsys.readouterr().out
    assert resumed["bpb"] == whole["bpb"]
    # The default clock (10 minutes) saves at the evaluations only in a run this short.
    script.main(tiny(corpus, tmp_path / "c", "--checkpoint", str(tmp_path / "ckpt_c"), "--log-every", "2"))
    assert sorted(p.name for p in (tmp_path / "ckpt_c").glob("*.pt")) == ["step_00000015.pt", "step_00000020.pt"]


@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
def test_a_rising_validation_warns_and_best_pt_keeps_the_model_of_the_best_one(script, corpus, tmp_path, capsys,
                                                                             monkeypatch):
    # Validation estimates at steps 5, 10, 15, 20 that fall, then rise twice (as on the bundled sample), then the
    # final figure: the model of step 10 is the one to keep.
    figures = iter([3.0, 2.0, 2.5, 2.7, 2.7])
    monkeypatch.setattr(script, "evaluate", lambda *args, **kwargs: next(figures))
    states = {}
    save = script.save_distributed_checkpoint

    def remember(path, *, model, step, **kwargs):  # the weights at each save of best.pt
        if path.name == "best.pt":
            states[step] = {k: v.clone() for k, v in model.state_dict().items()}
        return save(path, model=model, step=step, **kwargs)

    monkeypatch.setattr(script, "save_distributed_checkpoint", remember)
    script.main(tiny(corpus, tmp_path / "run", "--sample-length", "0"))
    out = capsys.readouterr().out
    assert "warning: validation rose at the last 2 evaluations (2.000 -> 2.500 -> 2.700 bits/byte)" in out
    assert "best.pt keeps the model of the best validation so far (2.000 at step 10)" in out
    assert "best validation estimate: 2.000 at step 10, better than the end's" in out
    assert sorted(states) == [5, 10]  # written at each new best, not after
    best = load_model(tmp_path / "run" / "best.pt", model_class=script.GTransformer)
    for key, value in best.state_dict().items():
        assert torch.equal(value, states[10][key]), key


@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
def test_the_speedrun_tricks_reach_the_model_and_the_schedule_and_a_resume_must_keep_them(script, corpus, tmp_path):
    from torchformer.train.training import warmup_stable_decay

    ckpt = tmp_path / "ckpt"
    tricks = ["--zero-init", "--logit-cap", "5", "--schedule", "wsd"]
    script.main(tiny(corpus, tmp_path / "run", *tricks, "--checkpoint", str(ckpt)))
    config = load_model(tmp_path / "run" / "model.pt").config
    assert config.zero_init_residual and config.logit_cap == 5.0
    rule = warmup_stable_decay(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), warmup_steps=4,
                               total_steps=20).lr_lambdas[0]
    rows = training_rows(read_log(tmp_path / "run" / "log.csv"))
    for step in range(1, 21):  # step s trains with the rate after s - 1 updates
        assert float(rows[step]["lr"]) == pytest.approx(3e-3 * rule(step - 1), rel=1e-6), step
    for flag, value, changed in (("--logit-cap", "6", "--logit-cap 5.0 (now 6.0)"),
                                 ("--schedule", "cosine", "--schedule wsd (now cosine)"),
                                 ("--zero-init", "--no-zero-init", "--zero-init True (now False)")):
        other = list(tricks)
        other[other.index(flag) + (flag != "--zero-init")] = value
        with pytest.raises(SystemExit, match=re.escape(changed)):
            script.main(tiny(corpus, tmp_path / "run", *other, "--checkpoint", str(ckpt), "-N", "30"))


@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
def test_a_sparse_pattern_reaches_every_layer_and_needs_its_stride(script, corpus, tmp_path, capsys):
    script.main(tiny(corpus, tmp_path / "run", "-N", "2", "--sparse", "fixed", "--sparse-stride", "4"))
    model = load_model(tmp_path / "run" / "model.pt")
    assert (model.config.sparse, model.config.sparse_stride) == ("fixed", 4)
    assert all(repr(block.attention.pattern) == "FixedPattern(stride=4, summary=1)" for block in model.blocks.blocks)
    for alone in (["--sparse", "strided"], ["--sparse-stride", "4"]):
        capsys.readouterr()
        with pytest.raises(SystemExit):
            script.main(tiny(corpus, tmp_path / "other", "-N", "2", *alone))
        assert "--sparse and --sparse-stride go together" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
def test_segment_memory_trains_on_streams_resumes_exactly_and_is_kept_by_the_run(script, corpus, tmp_path, capsys):
    from torchformer.train.checkpoint import read_payload

    memory = ["--memory", "8", "--positions", "rotary"]
    whole = script.main(tiny(corpus, tmp_path / "a", *memory))
    plain = script.main(tiny(corpus, tmp_path / "plain", "--positions", "rotary"))
    assert whole["bpb"] != plain["bpb"]  # the memory changed what was learned (and how validation reads)
    ckpt = tmp_path / "ckpt"
    script.main(tiny(corpus, tmp_path / "b", *memory, "--checkpoint", str(ckpt), "--stop-after", "12"))
    saved = read_payload(next(ckpt.glob("*.pt")), map_location="cpu", mmap=False, verify=True)
    kept = saved["ranks"][0]["state"]["memory"]  # the process's memory, one cache per block
    assert len(kept) == 2 and kept[0]["entries"][0].shape[2] == 8 + 16 and kept[0]["written"].any()
    resumed = script.main(tiny(corpus, tmp_path / "b", *memory, "--checkpoint", str(ckpt)))
    assert resumed["bpb"] == whole["bpb"]  # the memory came back with the weights: the same steps, bit for bit
    a, b = training_rows(read_log(tmp_path / "a" / "log.csv")), training_rows(read_log(tmp_path / "b" / "log.csv"))
    assert all(a[s]["loss"] == b[s]["loss"] for s in range(1, 21))
    with pytest.raises(SystemExit, match=re.escape("--memory 8 (now 16)")):
        script.main(tiny(corpus, tmp_path / "b", "--memory", "16", "--positions", "rotary", "--checkpoint",
                         str(ckpt), "-N", "30"))
    with pytest.raises(SystemExit, match="error: --memory: segment memory needs"):
        script.main(tiny(corpus, tmp_path / "c", "--memory", "8", "--positions", "learned"))
    capsys.readouterr()
    with pytest.raises(SystemExit):
        script.main(tiny(corpus, tmp_path / "d", *memory, "--compile"))
    assert "--memory does not run under --compile" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
def test_a_run_recorded_before_the_schedule_flag_resumes_only_with_the_cosine_it_had(script, corpus, tmp_path,
                                                                                       monkeypatch):
    ckpt = tmp_path / "ckpt"
    with monkeypatch.context() as m:  # a checkpoint of the script before --schedule: its run records no schedule
        m.setattr(script, "RUN_KEYS", tuple(k for k in script.RUN_KEYS if k not in script.RUN_DEFAULTS))
        script.main(tiny(corpus, tmp_path / "run", "--checkpoint", str(ckpt), "--stop-after", "12"))
    with pytest.raises(SystemExit, match=re.escape("--schedule cosine (now wsd)")):  # the cpu preset's now
        script.main(tiny(corpus, tmp_path / "run", "--checkpoint", str(ckpt), "--schedule", "wsd"))
    assert script.main(tiny(corpus, tmp_path / "run", "--checkpoint", str(ckpt)))["step"] == 20
    assert script.PRESETS["cpu"]["schedule"] == "wsd"


@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
def test_a_run_of_before_the_multiple_of_16_rule_resumes_exactly_with_its_gated_width(script, corpus, tmp_path,
                                                                                        monkeypatch):
    """Its checkpoints (config_version 2) hold a gated network of round(2/3 * 4 * 16) = 43 units, today's default is
    48: the resumed model is built with the checkpoint's width, and the run continues as if never stopped."""
    from torchformer.nn import feedforward
    from torchformer.train.checkpoint import _digest

    with monkeypatch.context() as m:  # torchformer before the rule
        m.setattr(feedforward, "gated_hidden_size", lambda emb, ff_mult: max(1, round(2 * ff_mult * emb / 3)))
        whole = script.main(tiny(corpus, tmp_path / "a"))
        script.main(tiny(corpus, tmp_path / "b", "--checkpoint", str(tmp_path / "ckpt"), "--stop-after", "12"))
    for path in (tmp_path / "ckpt").glob("*.pt"):  # as config_version 2 wrote them
        payload = {k: v for k, v in torch.load(path, weights_only=True).items() if k != "integrity"}
        assert payload["config_version"] == 3 and payload["model"]["blocks.blocks.0.ff.w1.weight"].shape == (43, 16)
        payload["config_version"] = 2
        torch.save({**payload, "integrity": {"sha256": _digest(payload)}}, path)
    resumed = script.main(tiny(corpus, tmp_path / "b", "--checkpoint", str(tmp_path / "ckpt")))
    assert resumed["bpb"] == whole["bpb"]
    steps_a = training_rows(read_log(tmp_path / "a" / "log.csv"))
    steps_b = training_rows(read_log(tmp_path / "b" / "log.csv"))
    assert [steps_b[s]["loss"] for s in range(13, 21)] == [steps_a[s]["loss"] for s in range(13, 21)]
