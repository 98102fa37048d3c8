"""examples/classify_imdb.py end to end on a tiny synthetic IMDb: training, resuming, padding, --predict, --help,
--wide, progress bars and calibration.

The corpus follows a trivially separable rule: positive reviews contain "great", negative ones "awful", amid
random filler words. A working pipeline (tokenizer, padding masks, bucketing, model, optimizer) learns it in a
few seconds; a broken one stays near 50 %.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import importlib.util
import json
import random
import re
import sys
from pathlib import Path

import pytest
from script_loader import load_script
import torch

from torchformer.data.batching import pad_batch
from torchformer.data.imdb_dataset import imdb
from torchformer.data.tokenizers import tokenizer_from_state_dict
from torchformer.train.checkpoint import read_checkpoint
from torchformer.scripts.cli import as_flag
from torchformer import load_model
from torchformer.train.metrics import calibration

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "classify_imdb.py"
FILLER = "the a film movie plot actor scene story was is and it of to this that with but very quite".split()


def load_classify_script():
    return load_script(SCRIPT)


def review(rng: random.Random, label: int) -> str:
    words = [rng.choice(FILLER) for _ in range(rng.randint(4, 40))]
    words.insert(rng.randint(0, len(words)), "great" if label else "awful")
    return " ".join(words) + rng.choice([".", "!", " <br /><br />"])


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("imdb")
    rng = random.Random(0)
    for split, n in (("train", 320), ("test", 120)):
        with gzip.open(folder / f"imdb_{split}.jsonl.gz", "wt", encoding="utf-8") as f:
            for i in range(n):
                label = i % 2
                f.write(json.dumps({"text": review(rng, label), "label": label, "id": i}) + "\n")
    return folder


@pytest.fixture(scope="module")
def script():
    return load_classify_script()


def tiny(data_dir: Path, out: Path, *extra: str) -> list[str]:
    return ["--data", str(data_dir), "--out", str(out), "--device", "cpu", "--threads", "1", "-E", "32", "-H", "2",
            "-d", "1", "-M", "32", "-b", "16", "-e", "4", "-l", "1e-2", "--lr-warmup", "64", "--dropout", "0.1",
            "-V", "64", "--val-size", "60", "--eval-every", "7", "--optimizer", "adam", *extra]


@pytest.fixture(scope="module")
def trained(script, data_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run")
    results = script.main(tiny(data_dir, out, "--final", "--checkpoint", str(out / "ckpt")))
    assert results["split"] == "test" and results["count"] == 120
    return out


def test_learns_the_rule_and_writes_its_outputs(trained):
    results = json.loads((trained / "results.json").read_text())
    assert results["accuracy"] >= 0.95, results
    confusion = torch.tensor(results["confusion"])
    assert confusion.sum() == 120 and confusion.sum(dim=1).tolist() == [60, 60]  # rows: the true classes
    assert confusion.trace() / 120 == pytest.approx(results["accuracy"])
    header = (trained / "log.csv").read_text().splitlines()[0].split(",")
    assert header == ["step", "epoch", "lr", "train_loss", "val_loss", "val_accuracy", "seconds"]
    pytest.importorskip("matplotlib")
    for name in ("loss.png", "accuracy.png", "attention.png", "calibration.png"):
        assert (trained / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_padding_never_changes_a_prediction(trained):
    # The final model.pt rebuilds without the script: its config is in the file, the tokenizer in its extra.
    model = load_model(trained / "model.pt")
    tokenizer = tokenizer_from_state_dict(read_checkpoint(trained / "model.pt")["extra"]["tokenizer"])
    texts = ["great film", "the plot was awful and the actor was very quite bad", "awful", "a great great story"]
    encoded = [tokenizer.encode(t) for t in texts]
    with torch.no_grad():
        alone = torch.cat([model(torch.tensor([e])) for e in encoded])  # no padding at all
        ids, mask = pad_batch(encoded)  # padded to the longest, 12 tokens
        batched = model(ids, mask)
        # Much more padding, and padding ids that are real words: the mask alone must hide them.
        wide_ids, wide_mask = pad_batch(encoded, pad=tokenizer.encode("great")[0])
        wide_ids = torch.cat([wide_ids, wide_ids[:, :1].expand(-1, 20)], dim=1)
        wide_mask = torch.cat([wide_mask, torch.zeros(len(texts), 20, dtype=torch.bool)], dim=1)
        wide = model(wide_ids, wide_mask)
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(wide, alone, atol=1e-5, rtol=1e-5)
    assert alone.argmax(-1).tolist() == [1, 0, 0, 1]


def test_resume_reproduces_the_uninterrupted_run(script, data_dir, trained, tmp_path):
    # Interrupt mid-epoch (17 steps: not an epoch end, not a validation step), then run the same command again.
    argv = tiny(data_dir, tmp_path, "--final", "--checkpoint", str(tmp_path / "ckpt"))
    assert script.main([*argv, "--stop-at", "17"]) == {}
    assert not (tmp_path / "model.pt").exists()
    resumed = script.main(argv)
    a = torch.load(trained / "model.pt", weights_only=True)
    b = torch.load(tmp_path / "model.pt", weights_only=True)
    assert a["step"] == b["step"] == 4 * 17  # 260 training reviews / 16 per batch = 17 batches per epoch
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    assert resumed["accuracy"] == json.loads((trained / "results.json").read_text())["accuracy"]
    assert len(list((tmp_path / "ckpt").glob("step_*.pt"))) <= 2  # old checkpoints are pruned


def test_resume_skips_a_truncated_newest_checkpoint_and_logs_each_step_once(script, data_dir, trained, tmp_path):
    argv = tiny(data_dir, tmp_path, "--final", "--checkpoint", str(tmp_path / "ckpt"))
    assert script.main([*argv, "--stop-at", "30"]) == {}  # checkpoints at steps 28 and 30 (validation and stop)
    newest = tmp_path / "ckpt" / "step_00000030.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 3])
    with pytest.warns(UserWarning, match="step_00000030.pt is damaged"):
        resumed = script.main(argv)  # from step 28
    assert resumed["accuracy"] == json.loads((trained / "results.json").read_text())["accuracy"]
    with open(tmp_path / "log.csv", newline="", encoding="utf-8") as f:
        rows = [(r["step"], bool(r["val_loss"])) for r in csv.DictReader(f)]
    assert len(rows) == len(set(rows))  # no step logged twice (steps 29 and 30 were, before the fix)
    assert (tmp_path / "ckpt" / "step_00000030.pt.damaged").exists() and not newest.exists()  # set aside
    with open(tmp_path / "log.csv", newline="", encoding="utf-8") as f:
        seconds = [float(r["seconds"]) for r in csv.DictReader(f)]
    assert seconds == sorted(seconds)  # the resumed run's clock goes on from the checkpoint's (it restarted at 0)
    with open(trained / "log.csv", newline="", encoding="utf-8") as f:
        assert rows == [(r["step"], bool(r["val_loss"])) for r in csv.DictReader(f)]  # the uninterrupted run's


def test_predict_prints_class_probabilities(script, trained, tmp_path, capsys):
    reviews = tmp_path / "reviews.txt"
    reviews.write_text("what an awful movie\n\nthe story was great\n", encoding="utf-8")
    script.main(["--predict", "a great film, great actor", "--predict", str(reviews), "--out", str(trained)])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3  # the text, then one line per non-empty line of the file
    for line, expected in zip(lines, ["positive", "negative", "positive"]):
        p_neg = float(line.split("P(negative)=")[1].split()[0])
        p_pos = float(line.split("P(positive)=")[1].split()[0])
        assert p_neg + p_pos == pytest.approx(1.0, abs=2e-3)
        assert f"-> {expected}" in line
    # --checkpoint may name the checkpoint folder of the run as well: same model, same output.
    script.main(["--predict", "a great film, great actor", "--checkpoint", str(trained / "ckpt")])
    assert capsys.readouterr().out.strip() == lines[0]
    # A misspelt file name is an error, not a review (its "words" would be classified with confidence).
    for name in ("reviewz.txt", str(tmp_path / "nosuchfile"), "data/new_reviews.csv"):
        with pytest.raises(SystemExit, match="no such file"):
            script.main(["--predict", name, "--out", str(trained)])
    script.main(["--predict", "Great.", "--out", str(trained)])  # one word without a path's marks is a review
    assert "-> " in capsys.readouterr().out


def test_packed_training_learns_the_rule_resumes_exactly_and_keeps_its_checkpoints_to_itself(script, data_dir,
                                                                                            tmp_path, capsys):
    # Rows of 64 positions hold about 2.6 of these reviews: 6 rows per batch for -b 16, 17 steps per epoch.
    argv = tiny(data_dir, tmp_path / "whole", "--pack", "-M", "64", "--final")
    whole = script.main(argv)
    assert "rows of 64 positions" in capsys.readouterr().out
    assert whole["accuracy"] >= 0.95 and whole["count"] == 120  # evaluated padded, on every test review
    ckpt = str(tmp_path / "ckpt")
    cut = tiny(data_dir, tmp_path / "cut", "--pack", "-M", "64", "--final", "--checkpoint", ckpt)
    assert script.main([*cut, "--stop-at", "10"]) == {}  # mid-epoch, between validations
    with pytest.raises(SystemExit, match=re.escape("--pack True (now False)")):
        script.main(tiny(data_dir, tmp_path / "cut", "-M", "64", "--final", "--checkpoint", ckpt))
    resumed = script.main(cut)
    a = torch.load(tmp_path / "whole" / "model.pt", weights_only=True)
    b = torch.load(tmp_path / "cut" / "model.pt", weights_only=True)
    assert a["step"] == b["step"] and a["extra"]["run"]["pack"] is True
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    assert resumed["accuracy"] == whole["accuracy"]


def test_clear_errors(script, tmp_path, monkeypatch):
    missing = tmp_path / "nowhere"
    with pytest.raises(SystemExit):
        script.main(["--data", str(missing)])
    monkeypatch.setenv("TORCHFORMER_HOME", str(tmp_path / "empty_home"))
    with pytest.raises(SystemExit, match="--data.*--download") as info:
        script.main(["--out", str(tmp_path / "out"), "--device", "cpu"])
    assert "no IMDb data in" in str(info.value) and "path=" not in str(info.value)  # the flags, not the Python API
    with pytest.raises(SystemExit, match=r"no trained model at .*untrained.model\.pt: train first \(the final model "
                                         r"goes to --out\), or pass --out or --checkpoint to point at one"):
        script.main(["--predict", "fine", "--out", str(tmp_path / "untrained")])
    with pytest.raises(SystemExit):
        script.main(["-b", "0", "--device", "cpu"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-V", "1"], "--vocab-size must be an int >= 3 (<pad>, <unk> and at least one word), got 1"),
        (["-e", "0"], "--num-epochs must be a positive int, got 0"),
        (["-M", "-4"], "--max-length must be a positive int, got -4"),
        (["--val-size", "0"], "--val-size must be a positive int, got 0"),
        (["--threads", "-1"], "--threads must be a positive int, got -1"),
        (["--seed", "-1"], "--seed must be an int in [0, 2**32), got -1"),
        (["--seed", str(2**40)], "--seed must be an int in [0, 2**32), got 1099511627776"),
        (["--checkpoint", "{file}"], "--checkpoint must be a folder"),
        (["--out", "{file}"], "--out must be a folder"),
        (["--eval-every", "0"], "--eval-every must be a positive int, got 0"),
        (["--eval-every", "-1"], "--eval-every must be a positive int, got -1"),
        (["--stop-at", "-1", "--checkpoint", "{folder}/ckpt"], "--stop-at must be a positive int, got -1"),
        (["--stop-at", "3"], "--stop-at needs --checkpoint"),
        (["-l", "nan"], "--learn-rate must be a positive number below 1e30, got nan"),
        (["-l", "0"], "--learn-rate must be a positive number below 1e30, got 0.0"),
        (["--lr-warmup", "-1"], "--lr-warmup must be an int >= 0, got -1"),
        (["--gradient-clipping", "nan"], "--gradient-clipping must be a number >= 0 (0: off), got nan"),
        (["--dropout", "1"], "--dropout must be a number in [0, 1), got 1.0"),
        (["-E", "15", "-H", "2"], "--embedding must be divisible by --heads, got 15 and 2 (or pass --wide"),
        (["--data", "{folder}/nowhere"], "--data must be an existing folder or file"),
        (["--data", "{folder}", "--download"], "--download"),
        (["--device", "gpu"], "--device"),
    ],
)
def test_bad_flags_are_usage_errors_naming_the_flag(script, argv, message, tmp_path, capsys):
    (tmp_path / "a_file").write_text("x")
    argv = [a.replace("{file}", str(tmp_path / "a_file")).replace("{folder}", str(tmp_path)) for a in argv]
    with pytest.raises(SystemExit) as info:  # in parse_args: before any data is read or any step is trained
        script.main([*argv, "--device", "cpu"] if "--device" not in argv else argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_val_size_must_leave_training_reviews(script, data_dir, tmp_path):
    with pytest.raises(SystemExit, match="--val-size must be less than the 320 training reviews, got 320"):
        script.main(tiny(data_dir, tmp_path, "--val-size", "320"))


@pytest.mark.parametrize(
    "changed, message",
    [
        (["-b", "8"], "--batch-size 16 (now 8)"),  # would skip the wrong batches and bend the schedule
        (["-E", "64"], "--embedding 32 (now 64)"),
        (["--max-pool"], "--max-pool False (now True)"),
        (["--wide"], "--wide False (now True)"),  # other attention weights
        (["--tokenizer", "byte"], "--tokenizer word (now byte)"),  # the checkpoint's vocabulary would be used
        (["-V", "500"], "--vocab-size 64 (now 500)"),
        (["--gradient-clipping", "0.5"], "--gradient-clipping 1.0 (now 0.5)"),
        (["-e", "5", "-l", "3e-3"], "--num-epochs 4 (now 5), --learn-rate 0.01 (now 0.003)"),
        (["--optimizer", "muon"], "--optimizer adam (now muon)"),
    ],
)
def test_resume_with_other_flags_is_refused_naming_them(script, data_dir, tmp_path, changed, message):
    ckpt = str(tmp_path / "ckpt")
    assert script.main(tiny(data_dir, tmp_path, "--checkpoint", ckpt, "--stop-at", "2")) == {}
    with pytest.raises(SystemExit) as info:
        script.main(tiny(data_dir, tmp_path, "--checkpoint", ckpt, *changed))
    assert message in str(info.value) and str(info.value).startswith("cannot resume")


def test_a_checkpoint_from_before_the_optimizer_flag_resumes_only_with_adam(script, data_dir, tmp_path, monkeypatch):
    ckpt = str(tmp_path / "ckpt")
    with monkeypatch.context() as m:  # the script before --optimizer: its run records no optimizer
        m.setattr(script, "RUN_KEYS", tuple(k for k in script.RUN_KEYS if k not in script.RUN_DEFAULTS))
        assert script.main(tiny(data_dir, tmp_path, "--checkpoint", ckpt, "--stop-at", "2")) == {}
    with pytest.raises(SystemExit, match=re.escape("--optimizer adam (now muon)")):  # the cpu preset's now
        script.main(tiny(data_dir, tmp_path, "--checkpoint", ckpt, "--optimizer", "muon"))
    args = script.parse_args(tiny(data_dir, tmp_path, "--checkpoint", ckpt))
    script.check_resumable(script.latest_intact_checkpoint(ckpt), args)  # with adam it resumes
    assert script.PRESETS["cpu"]["optimizer"] == "muon"


def test_the_preset_trains_a_transformer_with_muon_and_the_lstm_with_adam(script, data_dir, tmp_path):
    base = ["--data", str(data_dir), "--out", str(tmp_path), "--device", "cpu", "--preset", "cpu"]
    assert script.parse_args(base).optimizer == "muon"
    assert script.parse_args([*base, "--model", "lstm"]).optimizer == "adam"
    assert script.parse_args([*base, "--optimizer", "adam"]).optimizer == "adam"
    assert script.parse_args([*base, "--preset", "gpu"]).optimizer == "adam"
    assert script.parse_args([*base, "--model", "lstm", "--optimizer", "adam"]).optimizer == "adam"


def test_the_vocabulary_size_does_not_block_resuming_bytes(script, data_dir, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    byte = ("--tokenizer", "byte", "-e", "1", "--checkpoint", ckpt)
    assert script.main(tiny(data_dir, tmp_path, *byte, "--stop-at", "2")) == {}
    args = script.parse_args(tiny(data_dir, tmp_path, *byte, "-V", "500"))  # -V means nothing to bytes
    script.check_resumable(script.latest_intact_checkpoint(ckpt), args)


def test_predict_with_a_checkpoint_of_another_script_is_a_clear_error(script, tmp_path):
    from torchformer.models import CTransformer
    from torchformer.train.checkpoint import save_checkpoint

    save_checkpoint(tmp_path / "bare.pt", model=CTransformer(16, 2, 1, 16, 30, 2), step=1)  # no tokenizer
    with pytest.raises(SystemExit, match="holds no tokenizer"):
        script.main(["--predict", "fine", "--checkpoint", str(tmp_path / "bare.pt")])
    # A damaged file is called damaged (it was "holds no tokenizer, so it was not written by this script").
    (tmp_path / "cut.pt").write_bytes((tmp_path / "bare.pt").read_bytes()[:300])
    with pytest.raises(SystemExit, match=r"error: checkpoint .*cut\.pt is damaged \(truncated\?\)"):
        script.main(["--predict", "fine", "--checkpoint", str(tmp_path / "cut.pt")])


def test_predict_with_a_folder_is_a_clear_error(script, trained, tmp_path):
    with pytest.raises(SystemExit, match=r"--predict .*: a folder; pass a text file with one review per line"):
        script.main(["--predict", str(tmp_path), "--out", str(trained)])  # it said "no such file"


@pytest.mark.parametrize("text", ["", "   "])
def test_predict_with_an_empty_text_is_a_clear_error_not_a_folder(script, trained, text):
    with pytest.raises(SystemExit, match=r"--predict needs a non-empty review text"):
        script.main(["--predict", text, "--out", str(trained)])  # "" said "a folder" (Path("") is ".")


def test_predict_with_text_that_is_not_utf8_is_a_clear_error(script, trained):
    with pytest.raises(SystemExit, match=r"--predict: not valid UTF-8 text: the byte 0xff at character 6"):
        script.main(["--predict", "great \udcff", "--out", str(trained)])  # argv's bytes b"great \xff"


def test_predict_with_a_binary_file_is_a_clear_error(script, trained, tmp_path):
    (tmp_path / "blob.bin").write_bytes(b"\xd0\xff\x00")
    with pytest.raises(SystemExit, match="cannot read it as UTF-8 text"):
        script.main(["--predict", str(tmp_path / "blob.bin"), "--out", str(trained)])


def test_nan_weights_with_finite_losses_stop_at_the_validation(script, data_dir, tmp_path):
    # The loss of step 1 is finite (computed before its update); the update breaks the weights and the validation
    # right after finds NaN: a divergence exit, not a traceback, and nothing is saved.
    ckpt = tmp_path / "ckpt"
    with pytest.raises(SystemExit, match="validation at step 1 failed.*lower learning rate"):
        script.main(tiny(data_dir, tmp_path, "--checkpoint", str(ckpt), "-l", "1e10", "--lr-warmup", "0",
                         "--gradient-clipping", "0", "--eval-every", "1"))
    assert not list(ckpt.glob("*.pt"))


def test_help_says_what_each_preset_sets(script, capsys):
    with pytest.raises(SystemExit) as info:
        script.main(["--help"])
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines at the terminal's width
    assert "tokens kept per review (the rest is cut) (--preset cpu: 512; --preset gpu: 2048)" in text
    assert "peak learning rate (of Adam, and of Muon if --optimizer muon) (--preset cpu: 0.003; --preset gpu: 0.003)" in text
    assert "(default: runs/classify_imdb)" in text and "(default: 5000)" in text
    assert "default: the cores other programs leave idle" in text  # --threads
    # The epilog: each preset as the flags it stands for, in a form that can be typed.
    for name, preset in script.PRESETS.items():
        assert f"--preset {name} means " + " ".join(as_flag(k, v) for k, v in preset.items()) in text
    assert "--max-length 2048" in text and "--no-max-pool" in text
    actions = script.build_parser()._actions
    for action in actions:  # every flag says what it does
        assert action.help and action.help != argparse.SUPPRESS, action.option_strings
    assert set(script.PRESETS["cpu"]) <= {action.dest for action in actions}  # a preset sets flags only


def test_embedding_and_heads_are_checked_before_any_data_is_read(script, data_dir, tmp_path, monkeypatch, capsys):
    def no_data(*args, **kwargs):
        raise AssertionError("the data were read before the flags were checked")

    monkeypatch.setattr(script, "imdb", no_data)
    with pytest.raises(SystemExit) as info:
        script.main(tiny(data_dir, tmp_path, "-E", "100", "-H", "3"))
    assert info.value.code == 2
    assert "--embedding must be divisible by --heads, got 100 and 3 (or pass --wide" in capsys.readouterr().err


def test_wide_heads_need_no_divisible_embedding_and_are_saved(script, data_dir, tmp_path, capsys):
    script.main(tiny(data_dir, tmp_path, "-E", "30", "-H", "4", "--wide", "-e", "1"))
    model = load_model(tmp_path / "model.pt")  # rebuilt from the file's config alone
    assert (model.config.wide, model.config.emb, model.config.heads) == (True, 30, 4)
    assert read_checkpoint(tmp_path / "model.pt")["extra"]["config"]["wide"] is True
    capsys.readouterr()
    script.main(["--predict", "a great film", "--out", str(tmp_path)])
    assert "P(positive)=" in capsys.readouterr().out


def test_predict_chooses_the_threads_and_checks_the_flag(script, trained, monkeypatch, capsys):
    asked = []

    def choose(requested):
        asked.append(requested)
        return 1, "spy"

    monkeypatch.setattr(script, "choose_threads", choose)
    script.main(["--predict", "a great film", "--out", str(trained)])
    script.main(["--predict", "a great film", "--out", str(trained), "--threads", "1"])
    assert asked == [None, 1]  # None: the script measures the idle cores
    with pytest.raises(SystemExit) as info:
        script.main(["--predict", "a great film", "--out", str(trained), "--threads", "0"])
    assert info.value.code == 2 and "--threads must be a positive int, got 0" in capsys.readouterr().err


def test_every_evaluation_shows_progress_and_calibration_needs_no_matplotlib(script, data_dir, tmp_path,
                                                                             monkeypatch, capsys):
    bars = []
    real_progress = script.progress

    def recording(*args, **kwargs):
        bar = real_progress(*args, **kwargs)
        bars.append((kwargs.get("desc"), kwargs.get("total"), bar))
        return bar

    monkeypatch.setattr(script, "progress", recording)
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)  # as if matplotlib were not installed
    results = script.main(tiny(data_dir, tmp_path, "-e", "1", "--final"))
    # 17 steps, validations at steps 7, 14 and 17 (60 reviews, 2 batches of 32), then the test split (120: 4 batches);
    # each bar went through every batch.
    assert [(desc, total, bar.n) for desc, total, bar in bars if desc != "train"] == \
        [("validation", 2, 2)] * 3 + [("test", 4, 4)]
    out, err = capsys.readouterr()
    assert out.startswith("device: cpu, 1 CPU thread(s) (--threads)\n")
    if importlib.util.find_spec("tqdm") is not None:  # tqdm draws the bars on stderr
        assert "validation: 100%" in err and "test: 100%" in err
    assert "no calibration.png" in out and not (tmp_path / "calibration.png").exists()
    assert results["calibration"] == json.loads((tmp_path / "results.json").read_text())["calibration"]
    assert "expected calibration error" in out


def test_calibration_in_results_is_that_of_the_saved_model(trained, data_dir):
    # Recomputed without the script: the saved model on every test review in one padded batch.
    saved = json.loads((trained / "results.json").read_text())
    model = load_model(trained / "model.pt").eval()
    tokenizer = tokenizer_from_state_dict(read_checkpoint(trained / "model.pt")["extra"]["tokenizer"])
    _, test = imdb(str(data_dir))
    ids, mask = pad_batch([tokenizer.encode(text, max_length=model.config.seq_length) or [1] for text, _ in test])
    with torch.no_grad():
        probabilities = model(ids, mask).exp()
    expected = calibration(probabilities, [label for _, label in test]).to_dict()
    got = saved["calibration"]
    assert got["count"] == 120 and [b["count"] for b in got["bins"]] == [b["count"] for b in expected["bins"]]
    assert [(b["from"], b["to"]) for b in got["bins"]][0] == (0.5, 0.55)  # 10 bins over [1/2, 1]
    assert got["ece"] == pytest.approx(expected["ece"], abs=1e-5)
    for key in ("mean_confidence_right", "mean_confidence_wrong"):  # (None when there are no such answers)
        assert got[key] == expected[key] or got[key] == pytest.approx(expected[key], abs=1e-5)
    # The bins' accuracies add up to the accuracy printed with them.
    right = sum(b["count"] * b["accuracy"] for b in got["bins"] if b["count"])
    assert right / 120 == pytest.approx(saved["accuracy"])


def load_word_order_script():
    return load_script(SCRIPT.parent / "word_order_imdb.py")


def test_word_order_script_scores_the_written_reviews_as_classify_imdb_did(trained, data_dir, tmp_path, capsys):
    """examples/word_order_imdb.py: its accuracy on the reviews as written is the --final test accuracy of the run
    (same model, same tokenization and cut); the shuffle keeps each review's tokens; the rule of the tiny corpus
    ("great" or "awful" anywhere) ignores order, so the shuffled reviews are classified about as well."""
    word_order = load_word_order_script()
    result = word_order.main(["--data", str(data_dir), "--out", str(trained), "--threads", "1"])
    assert result["reviews"] == 120
    assert result["accuracy_as_written"] == pytest.approx(json.loads((trained / "results.json").read_text())["accuracy"])
    assert result["accuracy_words_shuffled"] >= 0.9 and 0 <= result["predictions_changed"] <= 0.1
    assert json.loads((trained / "word_order.json").read_text()) == json.loads(json.dumps(result))
    assert "with each review's words shuffled" in capsys.readouterr().out

    encoded = [[5, 6, 7, 8, 9, 10], [3], [4, 4, 2]]
    once = word_order.shuffle_each(encoded, torch.Generator().manual_seed(0))
    assert [sorted(a) for a in once] == [sorted(b) for b in encoded]  # the same tokens, as often
    assert once == word_order.shuffle_each(encoded, torch.Generator().manual_seed(0))  # seeded
    assert once[0] != encoded[0]
    with pytest.raises(SystemExit, match="no trained model at .*model.pt"):
        word_order.main(["--data", str(data_dir), "--out", str(tmp_path), "--threads", "1"])


# -M 160 for BPE: with 43 merges most words are several pieces, and a cut at 32 tokens would often drop the word
# that carries the label.
@pytest.mark.parametrize("extra", [["--model", "lstm", "--hidden", "24"], ["--tokenizer", "bpe", "-V", "300", "-M", "160"]],
                         ids=["lstm", "bpe"])
def test_the_lstm_baseline_and_bpe_run_through_the_same_pipeline(script, data_dir, tmp_path, capsys, extra):
    pytest.importorskip("tokenizers") if "bpe" in extra else None
    out = tmp_path / "run"
    results = script.main(tiny(data_dir, out, "--final", *extra))
    assert results["split"] == "test" and results["accuracy"] >= 0.95, results
    saved = read_checkpoint(out / "model.pt")
    assert saved["extra"]["config"]["model"] == extra[1] if extra[0] == "--model" else saved["extra"]["config"]
    tokenizer = tokenizer_from_state_dict(saved["extra"]["tokenizer"])
    assert type(tokenizer).__name__ == ("BPETokenizer" if "bpe" in extra else "WordTokenizer")
    # --predict rebuilds the model from the file, an LSTM too, and agrees with the model that was evaluated.
    capsys.readouterr()
    script.main(["--predict", "a great film", "--predict", "an awful film", "--out", str(out)])
    lines = capsys.readouterr().out.strip().splitlines()
    assert "-> positive" in lines[0] and "-> negative" in lines[1]
    if "lstm" in extra:  # word_order_imdb.py measures transformers: it says what the file holds instead
        with pytest.raises(SystemExit, match=r"model\.pt is classify_imdb\.py's LSTM \(--model lstm\); this script "
                                             r"measures a transformer"):
            load_word_order_script().main(["--data", str(data_dir), "--out", str(out), "--threads", "1"])


@pytest.mark.parametrize("argv, message", [
    (["--model", "lstm", "--wide"], "--model lstm does not take"),
    (["--model", "lstm", "--positions", "rotary"], "--model lstm does not take"),
    (["--model", "lstm", "--prenorm"], "--model lstm does not take"),
    (["--model", "lstm", "--pack"], "--model lstm does not take"),
    (["--hidden", "8"], "--hidden sets the LSTM's size: it needs --model lstm"),
    (["--hidden", "0", "--model", "lstm"], "--hidden must be a positive int"),
])
def test_lstm_flag_errors(script, tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        script.main([*argv, "--device", "cpu", "--data", str(tmp_path)])
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_positions_and_prenorm_build_that_model_and_predict_reloads_it(script, data_dir, tmp_path, capsys):
    script.main(tiny(data_dir, tmp_path, "--positions", "alibi", "--prenorm", "-e", "1"))
    saved = read_checkpoint(tmp_path / "model.pt")
    assert (saved["config"].positions, saved["config"].prenorm) == ("alibi", True)
    capsys.readouterr()
    script.main(["--predict", "a great film", "--out", str(tmp_path)])  # rebuilt from the saved flags
    assert "a great film" in capsys.readouterr().out


def test_the_lstm_takes_an_embedding_that_heads_do_not_divide(script, data_dir, tmp_path):
    results = script.main(tiny(data_dir, tmp_path, "--model", "lstm", "-E", "15", "-H", "2", "-e", "1"))
    assert results["count"] == 60


def test_muon_fine_tunes_resumes_exactly_and_is_refused_where_it_cannot_work(script, data_dir, tmp_path, capsys):
    whole = tmp_path / "whole"
    script.main(tiny(data_dir, whole, "--optimizer", "muon", "-e", "2"))
    argv = tiny(data_dir, tmp_path / "b", "--optimizer", "muon", "-e", "2", "--checkpoint", str(tmp_path / "ckpt"))
    assert script.main([*argv, "--stop-at", "9"]) == {}
    script.main(argv)
    a = torch.load(whole / "model.pt", weights_only=True)
    b = torch.load(tmp_path / "b" / "model.pt", weights_only=True)
    newest = sorted((tmp_path / "ckpt").glob("step_*.pt"))[-1]
    assert torch.load(newest, weights_only=True)["optimizer_class"] == "MuonWithAdam"
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    capsys.readouterr()
    with pytest.raises(SystemExit):
        script.main(tiny(data_dir, tmp_path / "c", "--optimizer", "muon", "--model", "lstm"))
    assert "--model lstm trains with --optimizer adam" in capsys.readouterr().err
