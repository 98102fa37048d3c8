import gzip
import hashlib
import json
import random
import tarfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import torchformer.data.imdb_dataset as imdb_module
from torchformer.data.download import ChecksumError
from torchformer.data.imdb_dataset import imdb, train_val_split

# (split, sentiment, id, rating) -> text. Ids 2 and 10 check a numeric (not string) sort;
# the texts carry <br /> and non-ASCII characters, which must come back unchanged.
REVIEWS = {
    ("train", "neg", 10, 1): "Dreadful.<br /><br />Avoid it.",
    ("train", "neg", 2, 3): "Boring plot, wooden acting.",
    ("train", "neg", 0, 4): "Not great — not terrible either.",
    ("train", "pos", 7, 10): "Loved it! Café scene 🎬 is perfect.",
    ("train", "pos", 3, 8): "A fine film.<br />Recommended.",
    ("test", "neg", 5, 2): "Worst movie this year.",
    ("test", "neg", 11, 1): "I walked out.",
    ("test", "pos", 1, 9): "Brilliant<br />and moving.",
    ("test", "pos", 4, 7): "Pretty good overall.",
}
UNSUP = {"0_0.txt": "UNSUP review that must be ignored."}


def expected_split(split):
    rows = sorted(
        (sentiment == "pos", id_, text)
        for (s, sentiment, id_, _), text in REVIEWS.items()
        if s == split
    )
    return [(text, int(label)) for label, _, text in rows]


def write_folder(parent: Path) -> Path:
    base = parent / "aclImdb"
    for (split, sentiment, id_, rating), text in REVIEWS.items():
        folder = base / split / sentiment
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{id_}_{rating}.txt").write_bytes(text.encode("utf-8"))
    (base / "train" / "unsup").mkdir()
    for name, text in UNSUP.items():
        (base / "train" / "unsup" / name).write_text(text, encoding="utf-8")
    (base / "train" / "urls_pos.txt").write_text("http://example.invalid/\n")
    (base / "README").write_text("Large Movie Review Dataset (fixture)\n")
    return base


def write_tar(folder: Path, dest: Path) -> Path:
    with tarfile.open(dest, "w:gz") as tar:
        tar.add(folder, arcname="aclImdb")
    return dest


def write_jsonl(dest_dir: Path) -> Path:
    dest_dir.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        records = [
            {"text": text, "label": int(sentiment == "pos"), "rating": rating, "id": id_}
            for (s, sentiment, id_, rating), text in REVIEWS.items()
            if s == split
        ]
        random.Random(0).shuffle(records)  # the reader must not depend on line order
        with gzip.open(dest_dir / f"imdb_{split}.jsonl.gz", "wt", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    return dest_dir


@pytest.fixture
def forms(tmp_path):
    folder = write_folder(tmp_path / "extracted")
    archive = write_tar(folder, tmp_path / "aclImdb_v1.tar.gz")
    jsonl = write_jsonl(tmp_path / "jsonl")
    return {"folder": folder, "parent": folder.parent, "tar": archive, "jsonl": jsonl}


def test_all_forms_give_the_same_pairs_in_the_same_order(forms):
    expected = (expected_split("train"), expected_split("test"))
    for name, path in forms.items():
        assert imdb(path) == expected, name
        assert imdb(str(path)) == expected, name


def test_labels_and_contents(forms):
    train, test = imdb(forms["tar"])
    assert [label for _, label in train] == [0, 0, 0, 1, 1]
    assert [label for _, label in test] == [0, 0, 1, 1]
    texts = {text: label for text, label in train + test}
    assert texts["Loved it! Café scene 🎬 is perfect."] == 1
    assert texts["Dreadful.<br /><br />Avoid it."] == 0  # raw text, tags kept
    assert not any("UNSUP" in text for text in texts)
    assert not set(t for t, _ in train) & set(t for t, _ in test)


@pytest.mark.parametrize("form", ["parent", "tar", "jsonl"])
def test_root_lookup(forms, tmp_path, form):
    root = tmp_path / f"root_{form}"
    root.mkdir()
    source = forms[form]
    if form == "parent":
        write_folder(root)
    elif form == "tar":
        (root / "aclImdb_v1.tar.gz").write_bytes(source.read_bytes())
    else:
        write_jsonl(root)
    assert imdb(root=root) == (expected_split("train"), expected_split("test"))


def test_default_root_comes_from_environment(forms, monkeypatch):
    monkeypatch.setenv("TORCHFORMER_HOME", str(forms["jsonl"]))
    assert imdb() == (expected_split("train"), expected_split("test"))


def point_download_at(monkeypatch, archive: Path, md5: str):
    monkeypatch.setattr(imdb_module, "IMDB_URL", archive.resolve().as_uri())
    monkeypatch.setattr(imdb_module, "IMDB_MD5", md5)


def test_download_fetches_checks_and_caches(forms, tmp_path, monkeypatch):
    md5 = hashlib.md5(forms["tar"].read_bytes()).hexdigest()
    point_download_at(monkeypatch, forms["tar"], md5)
    cache = tmp_path / "cache"
    assert imdb(root=cache, download=True) == imdb(forms["tar"])
    assert (cache / "aclImdb_v1.tar.gz").read_bytes() == forms["tar"].read_bytes()
    # Cached now: found without download, and download=True does not fetch again.
    forms["tar"].unlink()
    assert imdb(root=cache) == (expected_split("train"), expected_split("test"))
    assert imdb(root=cache, download=True) == (expected_split("train"), expected_split("test"))


def test_corrupt_download_leaves_nothing_cached(forms, tmp_path, monkeypatch):
    good_md5 = hashlib.md5(forms["tar"].read_bytes()).hexdigest()
    data = bytearray(forms["tar"].read_bytes())
    data[len(data) // 2] ^= 0xFF
    corrupt = tmp_path / "corrupt.tar.gz"
    corrupt.write_bytes(bytes(data))
    point_download_at(monkeypatch, corrupt, good_md5)
    cache = tmp_path / "cache"
    with pytest.raises(ChecksumError):
        imdb(root=cache, download=True)
    assert not cache.exists() or list(cache.iterdir()) == []
    with pytest.raises(FileNotFoundError):
        imdb(root=cache)


def test_missing_data_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"aclImdb_v1\.tar\.gz.*aclImdb/.*imdb_train\.jsonl\.gz"):
        imdb(root=tmp_path)
    with pytest.raises(FileNotFoundError, match="download=True"):
        imdb(root=tmp_path / "does-not-exist")
    with pytest.raises(FileNotFoundError, match="no IMDb data at"):
        imdb(tmp_path / "nothing-here")
    (tmp_path / "notes.txt").write_text("not an archive")
    with pytest.raises(FileNotFoundError):
        imdb(tmp_path / "notes.txt")


def test_download_needs_path_none(forms):
    with pytest.raises(ValueError, match="download"):
        imdb(forms["tar"], download=True)


def test_bad_label_and_empty_split_are_rejected(tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    for split, label in (("train", 2), ("test", 0)):
        with gzip.open(folder / f"imdb_{split}.jsonl.gz", "wt", encoding="utf-8") as f:
            f.write(json.dumps({"text": "x", "label": label, "id": 0}) + "\n")
    with pytest.raises(ValueError, match="label must be 0 or 1, got 2"):
        imdb(folder)

    with gzip.open(folder / "imdb_train.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write("")
    with pytest.raises(ValueError, match="train split .* is empty"):
        imdb(folder)


def test_jsonl_without_id_keeps_line_order_within_label(tmp_path):
    folder = tmp_path / "noid"
    folder.mkdir()
    rows = [("b", 1), ("a", 0), ("c", 1), ("d", 0)]
    for split in ("train", "test"):
        with gzip.open(folder / f"imdb_{split}.jsonl.gz", "wt", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": t, "label": y}) + "\n" for t, y in rows)
    train, _ = imdb(folder)
    assert train == [("a", 0), ("d", 0), ("b", 1), ("c", 1)]


@settings(max_examples=50, deadline=None)
@given(n=st.integers(2, 300), data=st.data(), seed=st.integers(0, 2**32))
def test_train_val_split_is_disjoint_covering_and_seeded(n, data, seed):
    val_size = data.draw(st.integers(1, n - 1))
    examples = [(f"review {i}", i % 2) for i in range(n)]
    train, val = train_val_split(examples, val_size=val_size, seed=seed)
    assert len(val) == val_size and len(train) == n - val_size
    assert set(train).isdisjoint(val)
    assert sorted(train + val) == sorted(examples)
    # Relative order is kept, and the same seed gives the same split.
    assert train == sorted(train, key=examples.index) and val == sorted(val, key=examples.index)
    assert train_val_split(examples, val_size=val_size, seed=seed) == (train, val)


def test_train_val_split_seed_changes_the_split_and_bad_sizes_fail():
    examples = list(range(1000))
    splits = {tuple(train_val_split(examples, val_size=100, seed=s)[1]) for s in range(5)}
    assert len(splits) == 5
    for bad in (0, 1000, 1001, -1, 2.5, True):
        with pytest.raises(ValueError, match="val_size"):
            train_val_split(examples, val_size=bad)
    with pytest.raises(TypeError, match="seed"):
        train_val_split(examples, val_size=10, seed="0")


REAL = Path("/work/shared/data")


@pytest.mark.skipif(not (REAL / "imdb_train.jsonl.gz").is_file(), reason="real IMDb data not present")
def test_real_data_counts():  # about 1.5 s
    train, test = imdb(REAL)
    assert len(train) == len(test) == 25000
    assert sum(label for _, label in train) == sum(label for _, label in test) == 12500
    assert train[0][0].startswith("Story of a man who has unnatural feelings for a pig")
