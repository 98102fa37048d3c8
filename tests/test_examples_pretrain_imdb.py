"""examples/pretrain_imdb.py end to end on a tiny synthetic IMDb, and classify_imdb.py --pretrained fine-tuning it.

The unlabelled file plants copies of test and validation reviews, and repeats: none of them may reach the
pretraining corpus, and the counts the script reports must be exactly the planted ones.
"""

from __future__ import annotations

import gzip
import json
import math
import random
import shutil
from pathlib import Path

import pytest
import torch
from script_loader import ROOT, load_script

from torchformer.data.imdb_dataset import imdb, train_val_split
from torchformer.data.imdb_unlabelled import texts_digest
from torchformer.data.tokenizers import tokenizer_from_state_dict
from torchformer.train.checkpoint import read_checkpoint

FILLER = "the a film movie plot actor scene story was is and it of to this that with but very quite".split()
VAL_SIZE, SEED = 40, 1


def review(rng: random.Random, label: int) -> str:
    words = [rng.choice(FILLER) for _ in range(rng.randint(4, 30))]
    words.insert(rng.randint(0, len(words)), "great" if label else "awful")
    return " ".join(words) + rng.choice([".", "!", " <br /><br />"])


def write(path: Path, records: list[dict]) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("imdb")
    rng = random.Random(0)
    train = [{"text": review(rng, i % 2), "label": i % 2, "id": i} for i in range(200)]
    test = [{"text": review(rng, i % 2), "label": i % 2, "id": i} for i in range(60)]
    write(folder / "imdb_train.jsonl.gz", train)
    write(folder / "imdb_test.jsonl.gz", test)
    # 150 fresh unlabelled reviews, then planted: 3 test reviews (one of them twice), 2 repeats of fresh ones.
    unsup = [review(rng, rng.randint(0, 1)) for _ in range(150)]
    unsup += [test[0]["text"], test[1]["text"], test[1]["text"], test[2]["text"], unsup[0], unsup[1]]
    write(folder / "imdb_unsup.jsonl.gz", [{"text": t, "id": i} for i, t in enumerate(unsup)])
    return folder


@pytest.fixture(scope="module")
def pretrain():
    return load_script(ROOT / "examples" / "pretrain_imdb.py")


@pytest.fixture(scope="module")
def classify():
    return load_script(ROOT / "examples" / "classify_imdb.py")


def tiny(data_dir: Path, out: Path, *extra: str) -> list[str]:
    return ["--data", str(data_dir), "--out", str(out), "--device", "cpu", "--threads", "1", "-E", "32", "-H", "2",
            "-d", "1", "-M", "32", "-b", "16", "-e", "2", "-l", "3e-3", "--lr-warmup", "64", "-V", "40",
            "--val-size", str(VAL_SIZE), "--eval-every", "5", *extra]


@pytest.fixture(scope="module")
def pretrained(pretrain, data_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pretrain")
    pretrain.main(tiny(data_dir, out))
    return out


def test_the_corpus_leaves_out_test_and_validation_reviews_and_repeats(pretrain, data_dir, pretrained):
    train, test = imdb(data_dir)
    train_split, val = train_val_split(train, val_size=VAL_SIZE, seed=SEED)
    args = pretrain.parse_args(tiny(data_dir, pretrained))
    texts, _, _, removed = pretrain.corpus(args)
    held_out = {t for t, _ in test} | {t for t, _ in val}
    assert not held_out & set(texts)
    assert len(set(texts)) == len(texts)
    # The 160 train-split reviews are all distinct and new; of the unlabelled ones, 4 rows copy test reviews and
    # 2 repeat earlier ones.
    assert removed == {"unlabelled": 156, "training_split": 160, "overlapping_test_or_validation": 4, "repeats": 2,
                       "kept": 150 + 160, "held_out_sha256": texts_digest([t for t, _ in test] + [t for t, _ in val])}
    results = json.loads((pretrained / "results.json").read_text())
    assert results["corpus"] == removed and results["steps"] == 2 * 20  # 310 reviews in batches of 16, 2 epochs


def test_the_pretrained_file_holds_the_model_vocabulary_and_mask_id(pretrained, data_dir):
    saved = read_checkpoint(pretrained / "pretrained.pt")
    tokenizer = tokenizer_from_state_dict(saved["extra"]["tokenizer"])
    assert saved["model_class"] == "MLMTransformer"
    assert saved["extra"]["mask_id"] == len(tokenizer) and saved["config"].num_tokens == len(tokenizer) + 1
    # The vocabulary is the training split's, as classify_imdb.py builds it: never the test reviews'.
    assert len(tokenizer) <= 40


def test_resume_reproduces_the_uninterrupted_run(pretrain, data_dir, pretrained, tmp_path, capsys):
    argv = tiny(data_dir, tmp_path / "out", "--checkpoint", str(tmp_path / "ckpt"))
    assert pretrain.main(argv + ["--stop-at", "13"]) == {}
    assert "pretraining: 310 reviews, tokenized (kept in OUT/tokenized)" in capsys.readouterr().out
    finished = pretrain.main(argv)
    assert "pretraining: 310 reviews, token ids read from OUT/tokenized" in capsys.readouterr().out  # not again
    # The same command once more finds the run finished: the same model and figures, written again.
    again = pretrain.main(argv)
    assert again["val_masked_loss"] == finished["val_masked_loss"] and math.isfinite(again["val_masked_loss"])
    json.loads((tmp_path / "out" / "results.json").read_text())  # valid JSON: no NaN
    resumed = torch.load(tmp_path / "out" / "pretrained.pt", weights_only=True)["model"]
    whole = torch.load(pretrained / "pretrained.pt", weights_only=True)["model"]
    assert resumed.keys() == whole.keys()
    for key in whole:
        assert torch.equal(resumed[key], whole[key]), key


def test_packed_pretraining_fills_rows_and_resumes_to_the_uninterrupted_run(pretrain, data_dir, tmp_path, capsys):
    whole = pretrain.main(tiny(data_dir, tmp_path / "whole", "--pack"))
    printed = capsys.readouterr().out
    assert "rows of 32 positions" in printed and "length-bucketed batches of 16 reviews: about" in printed
    rows = int(printed.split("batches: ")[1].split(" rows")[0])
    assert whole["steps"] == 2 * math.ceil(rows / 16) and whole["run"]["pack"] is True
    argv = tiny(data_dir, tmp_path / "out", "--pack", "--checkpoint", str(tmp_path / "ckpt"))
    assert pretrain.main(argv + ["--stop-at", "3"]) == {}
    resumed = pretrain.main(argv)
    assert resumed["val_masked_loss"] == whole["val_masked_loss"] and math.isfinite(whole["val_masked_loss"])
    with pytest.raises(SystemExit, match="cannot resume"):  # a packed run's checkpoints are not a padded run's
        pretrain.main(tiny(data_dir, tmp_path / "out2", "--checkpoint", str(tmp_path / "ckpt")))


def test_a_classifier_fine_tunes_from_the_pretrained_encoder(classify, data_dir, pretrained, tmp_path, capsys):
    out = tmp_path / "clf"
    argv = ["--data", str(data_dir), "--out", str(out), "--device", "cpu", "--threads", "1", "-b", "16", "-e", "4",
            "-l", "1e-2", "--lr-warmup", "64", "--val-size", str(VAL_SIZE), "--pretrained",
            str(pretrained / "pretrained.pt"), "--final"]
    assert classify.parse_args(argv).optimizer == "adam"  # fine-tuning was measured with Adam: not the preset's muon
    results = classify.main(argv)
    assert "encoder and embedding from" in capsys.readouterr().out
    assert results["accuracy"] >= 0.95, results
    saved = read_checkpoint(out / "model.pt")
    source = read_checkpoint(pretrained / "pretrained.pt")
    assert saved["extra"]["tokenizer"] == source["extra"]["tokenizer"]  # the pretrained vocabulary, not a new one
    encoder_fields = ("emb", "heads", "depth", "seq_length", "num_tokens")
    assert all(getattr(saved["config"], f) == getattr(source["config"], f) for f in encoder_fields)


def test_a_pretrained_run_starts_from_exactly_the_pretrained_weights(classify, data_dir, pretrained, tmp_path,
                                                                     monkeypatch):
    # Record the classifier's weights right after the script loads the encoder, before any fine-tuning step.
    snapshot = {}
    original = classify.CTransformer.load_encoder

    def spy(self, source):
        original(self, source)
        snapshot.update({k: v.clone() for k, v in self.state_dict().items()})

    monkeypatch.setattr(classify.CTransformer, "load_encoder", spy)
    classify.main(["--data", str(data_dir), "--out", str(tmp_path / "o"), "--device", "cpu", "--threads", "1",
                   "-b", "16", "-e", "1", "--val-size", str(VAL_SIZE), "--pretrained",
                   str(pretrained / "pretrained.pt"), "--checkpoint", str(tmp_path / "c"), "--stop-at", "1"])
    source = torch.load(pretrained / "pretrained.pt", weights_only=True)["model"]
    encoder = [k for k in snapshot if k.startswith(("embedding.", "encoder."))]
    assert len(encoder) > 10 and any(k.startswith("head.") for k in snapshot)
    for key in encoder:
        assert torch.equal(snapshot[key], source[key]), key


@pytest.mark.parametrize("flags, expected", [
    ([], ("rotary", True)),  # the presets'
    (["--positions", "sinusoidal", "--no-prenorm"], ("sinusoidal", False)),
])
def test_positions_and_prenorm_travel_from_pretraining_to_the_classifier(pretrain, classify, data_dir, tmp_path,
                                                                         flags, expected):
    pretrain.main(tiny(data_dir, tmp_path / "p", "-e", "1", *flags))
    source = read_checkpoint(tmp_path / "p" / "pretrained.pt")
    assert (source["config"].positions, source["config"].prenorm) == expected
    classify.main(["--data", str(data_dir), "--out", str(tmp_path / "c"), "--device", "cpu", "--threads", "1",
                   "-b", "16", "-e", "1", "--val-size", str(VAL_SIZE), "--pretrained",
                   str(tmp_path / "p" / "pretrained.pt")])
    saved = read_checkpoint(tmp_path / "c" / "model.pt")
    assert (saved["config"].positions, saved["config"].prenorm) == expected
    assert (saved["extra"]["config"]["positions"], saved["extra"]["config"]["prenorm"]) == expected


def older_pretrained_file(pretrain, source: Path, target: Path, *drop: str) -> Path:
    """``source`` re-saved without the run keys ``drop``, as a file of an earlier version of the script."""
    state = read_checkpoint(source)
    model = pretrain.MLMTransformer(config=state["config"])
    model.load_state_dict(torch.load(source, weights_only=True)["model"])
    extra = {**state["extra"], "run": {k: v for k, v in state["extra"]["run"].items() if k not in drop}}
    return pretrain.save_checkpoint(target, model=model, step=state["step"], extra=extra)


def test_a_pretrained_file_from_before_positions_and_prenorm_is_learned_post_norm(pretrain, classify, data_dir,
                                                                                  tmp_path, capsys):
    pretrain.main(tiny(data_dir, tmp_path / "p", "-e", "1", "--positions", "learned", "--no-prenorm"))
    old = older_pretrained_file(pretrain, tmp_path / "p" / "pretrained.pt", tmp_path / "old.pt",
                                "positions", "prenorm")
    classify.main(["--data", str(data_dir), "--out", str(tmp_path / "c"), "--device", "cpu", "--threads", "1",
                   "-b", "16", "-e", "1", "--val-size", str(VAL_SIZE), "--pretrained", str(old)])
    saved = read_checkpoint(tmp_path / "c" / "model.pt")
    assert (saved["config"].positions, saved["config"].prenorm) == ("learned", False)
    # A file without a key that was always there is not one of this script's.
    broken = older_pretrained_file(pretrain, old, tmp_path / "broken.pt", "embedding")
    with pytest.raises(SystemExit):
        classify.main(["--data", str(data_dir), "--out", str(tmp_path / "d"), "--val-size", str(VAL_SIZE),
                       "--pretrained", str(broken)])
    assert "not a model written by examples/pretrain_imdb.py (KeyError: 'its run has no embedding')" in \
        capsys.readouterr().err


def test_resuming_an_older_checkpoint_takes_the_flags_it_was_trained_with(pretrain, data_dir, tmp_path):
    # A checkpoint written before --positions and --prenorm existed was trained with learned positions, post-norm.
    args = pretrain.parse_args(tiny(data_dir, tmp_path / "o", "--positions", "learned", "--no-prenorm"))
    old_run = {k: getattr(args, k) for k in pretrain.RESUME_KEYS if k not in ("positions", "prenorm")}
    ckpt = pretrain.save_checkpoint(tmp_path / "step_1.pt", model=torch.nn.Linear(2, 2), step=1,
                                    extra={"run": old_run})
    pretrain.check_resumable(ckpt, args)  # no exit: learned and post-norm are what it was trained with
    with pytest.raises(SystemExit, match="--positions learned \\(now rotary\\), --prenorm False \\(now True\\)"):
        pretrain.check_resumable(ckpt, pretrain.parse_args(tiny(data_dir, tmp_path / "o")))  # the preset's


def test_the_vocabulary_size_does_not_block_resuming_bytes(pretrain, data_dir, tmp_path):
    args = pretrain.parse_args(tiny(data_dir, tmp_path / "o", "--tokenizer", "byte"))
    run = {k: getattr(args, k) for k in pretrain.RESUME_KEYS}
    ckpt = pretrain.save_checkpoint(tmp_path / "step_1.pt", model=torch.nn.Linear(2, 2), step=1, extra={"run": run})
    pretrain.check_resumable(ckpt, pretrain.parse_args(tiny(data_dir, tmp_path / "o", "--tokenizer", "byte",
                                                            "-V", "300")))  # -V means nothing to bytes
    with pytest.raises(SystemExit, match="--vocab-size 40"):
        pretrain.check_resumable(ckpt, pretrain.parse_args(tiny(data_dir, tmp_path / "o", "-V", "300")))


@pytest.mark.parametrize("extra, message", [
    (["-E", "64"], "leave out --embedding"),
    (["--prenorm"], "leave out --prenorm"),
    (["--positions", "rotary"], "leave out --positions"),
    (["--seed", "2"], "--seed 1"),
    (["--val-size", "30"], "--val-size 40"),
])
def test_pretrained_flag_errors_name_the_flag(classify, data_dir, pretrained, tmp_path, capsys, extra, message):
    argv = ["--data", str(data_dir), "--out", str(tmp_path), "--pretrained", str(pretrained / "pretrained.pt"),
            "--val-size", str(VAL_SIZE), *extra]
    with pytest.raises(SystemExit):
        classify.main(argv)
    assert message in capsys.readouterr().err


def test_a_file_of_another_script_is_not_a_pretrained_model(classify, data_dir, tmp_path, capsys):
    other = tmp_path / "x.pt"
    torch.save({"model": {}}, other)
    with pytest.raises(SystemExit):
        classify.main(["--data", str(data_dir), "--out", str(tmp_path), "--pretrained", str(other)])
    assert "not a model written by examples/pretrain_imdb.py" in capsys.readouterr().err


def test_a_mask_rate_that_chooses_no_validation_token_is_an_error(pretrain, data_dir, tmp_path):
    with pytest.raises(SystemExit, match=rf"--mask-rate 1e-06 chose no token of the {VAL_SIZE} validation reviews"):
        pretrain.main(tiny(data_dir, tmp_path, "--mask-rate", "1e-6"))
    assert not (tmp_path / "pretrained.pt").exists()


def test_a_corpus_emptied_by_deduplication_is_an_error(pretrain, data_dir, tmp_path):
    """Every pretraining text occurs in the held-out texts when the test file is a copy of the training file."""
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copy(data_dir / "imdb_train.jsonl.gz", copy / "imdb_train.jsonl.gz")
    shutil.copy(data_dir / "imdb_train.jsonl.gz", copy / "imdb_test.jsonl.gz")
    with gzip.open(copy / "imdb_unsup.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(gzip.open(data_dir / "imdb_train.jsonl.gz", "rt", encoding="utf-8").readline())
    with pytest.raises(SystemExit, match=r"no review is left to pretrain on: all 1 unlabelled and \d+ training "
                                         r"reviews occur in the test set or the validation split"):
        pretrain.main(tiny(copy, tmp_path / "out"))


def test_a_classifier_on_other_held_out_reviews_than_pretraining_is_refused(classify, data_dir, pretrained,
                                                                            tmp_path):
    """The pretraining corpus left out the test set and the validation split of its data; fine-tuning on other data
    (here: one test review fewer) could evaluate on reviews the encoder read. The file's digest catches it."""
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(data_dir / "imdb_train.jsonl.gz", other / "imdb_train.jsonl.gz")
    lines = gzip.open(data_dir / "imdb_test.jsonl.gz", "rt", encoding="utf-8").readlines()
    with gzip.open(other / "imdb_test.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(lines[1:])
    flags = ["--data", str(other), "--out", str(tmp_path / "out"), "--device", "cpu", "--threads", "1", "-e", "1",
             "--val-size", str(VAL_SIZE), "--seed", str(SEED), "--pretrained", str(pretrained / "pretrained.pt")]
    with pytest.raises(SystemExit, match=r"was pretrained on a corpus that left out other test and validation "
                                         r"reviews than this run's"):
        classify.main(flags)


def test_pretraining_refuses_torchrun(pretrain, data_dir, tmp_path, monkeypatch, capsys):
    for value in ("2", "abc"):  # "abc" was a ValueError traceback from int()
        monkeypatch.setenv("WORLD_SIZE", value)
        with pytest.raises(SystemExit):
            pretrain.main(tiny(data_dir, tmp_path))
        assert f"pretraining runs in one process, but WORLD_SIZE is '{value}'" in capsys.readouterr().err
