import errno
import gzip
import hashlib
import json
import os
import pickle
import random
import tarfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import torchformer.data.imdb_dataset as imdb_module
from torchformer.data.download import ChecksumError, DataFileError, DataNotFoundError
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
def test_root_lookup(forms, tmp_path, form, monkeypatch):
    root = tmp_path / f"root_{form}"
    root.mkdir()
    source = forms[form]
    if form == "parent":
        write_folder(root)
    elif form == "tar":
        (root / "aclImdb_v1.tar.gz").write_bytes(source.read_bytes())
        # The archive in root is the cache's copy, checked against the official md5: make the fixture "official".
        monkeypatch.setattr(imdb_module, "IMDB_MD5", hashlib.md5(source.read_bytes()).hexdigest())
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
    with pytest.raises(DataNotFoundError, match="download=True") as info:
        imdb(root=tmp_path / "does-not-exist")
    # Its parts, for a script to say the problem with its own flags: what is missing, and the API's remedy.
    assert info.value.problem.startswith("no IMDb data in") and "download=True" not in info.value.problem
    assert str(info.value) == f"{info.value.problem}; {info.value.advice}"
    copy = pickle.loads(pickle.dumps(info.value))
    assert (copy.problem, copy.advice, str(copy)) == (info.value.problem, info.value.advice, str(info.value))
    assert info.value.errno == errno.ENOENT and isinstance(info.value, FileNotFoundError)
    with pytest.raises(FileNotFoundError, match="no IMDb data at"):
        imdb(tmp_path / "nothing-here")
    (tmp_path / "notes.txt").write_text("not an archive")
    with pytest.raises(DataFileError, match=r"notes\.txt: is not a tar archive.*expects the official archive"):
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
    with pytest.raises(ValueError, match=r"imdb_train\.jsonl\.gz: holds no reviews"):
        imdb(folder)


def test_empty_split_names_where_its_reviews_should_be(tmp_path):
    folder = tmp_path / "aclImdb"
    for split in ("train", "test"):
        for sentiment in ("pos", "neg"):
            (folder / split / sentiment).mkdir(parents=True)
    (folder / "train" / "pos" / "1_9.txt").write_text("Only train has a review.")
    with pytest.raises(DataFileError, match=r"holds no reviews \(\[id\]_\[rating\]\.txt") as info:
        imdb(folder)
    assert info.value.path == str(folder / "test")
    archive = write_tar(folder, tmp_path / "partial.tar.gz")
    with pytest.raises(DataFileError, match=r"holds no reviews under test/pos/ or test/neg/") as info:
        imdb(archive)
    assert info.value.path == str(archive)


def test_jsonl_without_id_keeps_line_order_within_label(tmp_path):
    folder = tmp_path / "noid"
    folder.mkdir()
    rows = [("b", 1), ("a", 0), ("c", 1), ("d", 0)]
    for split in ("train", "test"):
        with gzip.open(folder / f"imdb_{split}.jsonl.gz", "wt", encoding="utf-8") as f:
            f.writelines(json.dumps({"text": t, "label": y}) + "\n" for t, y in rows)
    train, _ = imdb(folder)
    assert train == [("a", 0), ("d", 0), ("b", 1), ("c", 1)]


def test_jsonl_with_ids_on_some_lines_only_is_named(tmp_path):
    """Line 2 without an id stood in as id 2, the same as line 1's real id: the sort mixed them up silently."""
    folder = write_jsonl(tmp_path / "jsonl")
    with gzip.open(folder / "imdb_train.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write('{"text": "x", "label": 1, "id": 2}\n{"text": "y", "label": 0}\n')
    with pytest.raises(DataFileError, match=r"imdb_train\.jsonl\.gz, line 2: has no \"id\" while other lines have "
                                            r"one; give every line an id, or none"):
        imdb(folder)


# ------------------------------------------------------------------ the cached archive is verified


def test_non_official_cached_archive_is_a_clear_error(forms, tmp_path):
    root = tmp_path / "cache"
    root.mkdir()
    archive = root / "aclImdb_v1.tar.gz"
    archive.write_bytes(forms["tar"].read_bytes())  # a well-formed archive, but not the official one
    with pytest.raises(ChecksumError) as info:
        imdb(root=root)
    message = str(info.value)
    assert str(archive) in message and imdb_module.IMDB_MD5 in message
    assert hashlib.md5(archive.read_bytes()).hexdigest() in message
    assert "download=True" in message and "path=" in message
    assert imdb(archive) == (expected_split("train"), expected_split("test"))  # path= uses it as it is


@pytest.mark.parametrize("damage", ["truncated", "non-official"])
def test_bad_cached_archive_is_replaced_with_download(forms, tmp_path, monkeypatch, damage):
    official = forms["tar"].read_bytes()
    point_download_at(monkeypatch, forms["tar"], hashlib.md5(official).hexdigest())
    root = tmp_path / "cache"
    root.mkdir()
    archive = root / "aclImdb_v1.tar.gz"
    if damage == "truncated":
        archive.write_bytes(official[: len(official) // 2])
    else:  # a readable archive of other bytes (the zeros are padding gzip ignores)
        archive.write_bytes(official + bytes(512))
    with pytest.warns(UserWarning, match="checksum mismatch.*Downloading it again"):
        result = imdb(root=root, download=True)
    assert result == (expected_split("train"), expected_split("test"))
    assert archive.read_bytes() == official


# ------------------------------------------------------------------ damaged files name themselves


def _flip(data, index):
    data = bytearray(data)
    data[index] ^= 0xFF
    return bytes(data)


ARCHIVE_DAMAGE = {
    "truncated": lambda data: data[: len(data) // 2],
    "bad CRC": lambda data: _flip(data, -6),  # only reading the stream to its end notices this one
    "garbage": lambda data: data[:10] + bytes(len(data) - 10),
}


@pytest.mark.parametrize("damage", sorted(ARCHIVE_DAMAGE))
def test_damaged_archive_is_named(forms, tmp_path, damage):
    path = tmp_path / "damaged.tar.gz"
    path.write_bytes(ARCHIVE_DAMAGE[damage](forms["tar"].read_bytes()))
    with pytest.raises(DataFileError) as info:
        imdb(path)
    assert info.value.path == str(path) and "damaged" in str(info.value)


JSONL_DAMAGE = {
    "truncated": lambda gz: gz[: len(gz) - 10],
    "bad CRC": lambda gz: _flip(gz, -6),
    "a PNG renamed": lambda gz: b"\x89PNG\r\n\x1a\n" + bytes(100),
    "not gzipped": lambda gz: gzip.decompress(gz),
}


@pytest.mark.parametrize("damage", sorted(JSONL_DAMAGE))
def test_damaged_jsonl_is_named(forms, damage):
    path = forms["jsonl"] / "imdb_train.jsonl.gz"
    path.write_bytes(JSONL_DAMAGE[damage](path.read_bytes()))
    with pytest.raises(DataFileError) as info:
        imdb(forms["jsonl"])
    assert info.value.path == str(path)
    assert "gzip" in str(info.value) and ("damaged" in str(info.value) or "not gzip" in str(info.value))


# One policy for text that is not valid UTF-8, whatever the form: an error naming the file (and the line),
# never a silent replacement (the official files are valid UTF-8, so such bytes mean damage).
def test_invalid_utf8_is_an_error_in_every_form(tmp_path):
    bad = b"Caf\xe9 (Latin-1, not UTF-8)"
    folder = write_folder(tmp_path / "folder")
    (folder / "train" / "pos" / "99_9.txt").write_bytes(bad)
    with pytest.raises(DataFileError, match=r"99_9\.txt: is not valid UTF-8.*byte 3") as info:
        imdb(folder)
    assert info.value.path == str(folder / "train" / "pos" / "99_9.txt")

    archive = write_tar(folder, tmp_path / "bad.tar.gz")
    with pytest.raises(DataFileError, match=r"member aclImdb/train/pos/99_9\.txt is not valid UTF-8") as info:
        imdb(archive)
    assert info.value.path == str(archive)

    jsonl = write_jsonl(tmp_path / "jsonl")
    with gzip.open(jsonl / "imdb_test.jsonl.gz", "ab") as f:
        f.write(b'{"text": "' + bad + b'", "label": 1, "id": 99}\n')
    with pytest.raises(DataFileError, match="not valid UTF-8") as info:
        imdb(jsonl)
    assert info.value.path == str(jsonl / "imdb_test.jsonl.gz") and info.value.line == 5


@pytest.mark.parametrize(
    "record, match",
    [
        ({"text": "x", "label": 0, "id": "7"}, "id must be an int, got '7'"),
        ({"text": "x", "label": 0, "id": None}, "id must be an int, got None"),
        ({"text": "x", "label": 0, "id": True}, "id must be an int, got True"),
        ({"text": "x", "label": 0, "id": 1.5}, "id must be an int, got 1.5"),
        ({"text": "x", "label": "1", "id": 3}, "label must be 0 or 1, got '1'"),
        ({"text": None, "label": 1, "id": 3}, "text must be a string, got NoneType"),
        ([1, 2], "expected a JSON object"),
    ],
)
def test_bad_jsonl_records_name_file_and_line(tmp_path, record, match):
    folder = write_jsonl(tmp_path / "jsonl")
    path = folder / "imdb_train.jsonl.gz"
    with gzip.open(path, "at", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
    with pytest.raises(DataFileError, match=match) as info:
        imdb(folder)
    assert info.value.path == str(path) and info.value.line == 6
    assert f"{path}, line 6" in str(info.value)


def test_lone_surrogate_in_jsonl_is_invalid_text(tmp_path):
    folder = write_jsonl(tmp_path / "jsonl")
    path = folder / "imdb_train.jsonl.gz"
    with gzip.open(path, "at", encoding="utf-8") as f:
        f.write('{"text": "half a character: \\ud800", "label": 1, "id": 99}\n')  # valid JSON, not valid Unicode
    with pytest.raises(DataFileError, match=r"line 6: text is not valid Unicode.*'\\ud800' at index 18"):
        imdb(folder)


@pytest.mark.parametrize("mode", ["w:xz", "w:bz2"])
def test_damaged_archives_of_other_compressions_are_named(tmp_path, mode):
    folder = write_folder(tmp_path / "folder")
    path = tmp_path / "archive.tar"
    with tarfile.open(path, mode) as tar:
        tar.add(folder, arcname="aclImdb")
    path.write_bytes(_flip(path.read_bytes(), path.stat().st_size // 2))
    with pytest.raises(DataFileError) as info:
        imdb(path)
    assert info.value.path == str(path) and "damaged" in str(info.value)


def test_jsonl_with_a_byte_order_mark(tmp_path):
    folder = write_jsonl(tmp_path / "jsonl")
    path = folder / "imdb_train.jsonl.gz"
    path.write_bytes(gzip.compress("\ufeff".encode() + gzip.decompress(path.read_bytes())))
    assert imdb(folder) == (expected_split("train"), expected_split("test"))


# ------------------------------------------------------------------ wrong arguments, half-present data


def test_half_present_forms_name_what_is_missing(forms, tmp_path):
    (forms["jsonl"] / "imdb_test.jsonl.gz").unlink()
    with pytest.raises(FileNotFoundError, match=r"imdb_train\.jsonl\.gz but not .*imdb_test\.jsonl\.gz"):
        imdb(forms["jsonl"])
    only_train = tmp_path / "only_train"
    (only_train / "aclImdb" / "train" / "pos").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"aclImdb/train/ but not .*aclImdb/test/"):
        imdb(only_train)
    with pytest.raises(DataFileError, match=r"is not a tar archive"):
        imdb(forms["jsonl"] / "imdb_train.jsonl.gz")


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"path": 5}, TypeError, "path must be a str or os.PathLike, got int"),
        ({"path": ""}, ValueError, "path must not be empty"),
        ({"root": 5}, TypeError, "root must be a str or os.PathLike, got int"),
        ({"download": "yes"}, TypeError, "download must be a bool, got 'yes'"),
    ],
)
def test_bad_arguments_are_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        imdb(**kwargs)


def test_root_that_is_a_file(tmp_path):
    (tmp_path / "cache").write_bytes(b"x")
    with pytest.raises(NotADirectoryError, match=r"root .*cache is a file"):
        imdb(root=tmp_path / "cache", download=True)


def test_loading_from_root_removes_dead_temporaries(forms, tmp_path, monkeypatch):
    from torchformer._files import part_file

    root = tmp_path / "cache"
    root.mkdir()
    (root / "aclImdb_v1.tar.gz").write_bytes(forms["tar"].read_bytes())
    monkeypatch.setattr(imdb_module, "IMDB_MD5", hashlib.md5(forms["tar"].read_bytes()).hexdigest())
    fd, leftover = part_file(root / "aclImdb_v1.tar.gz")
    os.close(fd)
    leftover.rename(leftover.with_name(leftover.name.replace(f"-{os.getpid()}-", "-999999999-")))
    imdb(root=root)
    assert [p.name for p in root.iterdir()] == ["aclImdb_v1.tar.gz"]


def test_train_val_split_needs_a_sequence():
    with pytest.raises(TypeError, match="examples must be a sequence.*got generator"):
        train_val_split((i for i in range(10)), val_size=2)
    with pytest.raises(TypeError, match="examples must be a sequence.*got dict"):
        train_val_split({i: i for i in range(10)}, val_size=2)
    with pytest.raises(TypeError, match="examples must be a sequence.*got str"):
        train_val_split("a whole review", val_size=2)


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
