"""The unlabelled IMDb reviews: every form reads the same texts in id order; de-duplication against held-out texts."""

import gzip
import json
import random
import tarfile
from pathlib import Path

import pytest

from torchformer.data.download import DataFileError
from torchformer.data.imdb_unlabelled import UNLABELLED_JSONL, deduplicate, imdb_unlabelled

# id -> text; ids 2 and 10 check a numeric sort, the texts keep <br /> and non-ASCII characters.
UNSUP = {10: "Ten.<br />Café 🎬", 2: "Two, a repeat of a test review.", 0: "Zero.", 7: "Seven."}
LABELLED = {"aclImdb/train/pos/3_8.txt": "A labelled review, never returned."}


def write_folder(parent: Path) -> Path:
    unsup = parent / "aclImdb" / "train" / "unsup"
    unsup.mkdir(parents=True)
    for id_, text in UNSUP.items():
        (unsup / f"{id_}_0.txt").write_bytes(text.encode("utf-8"))
    for name, text in LABELLED.items():
        (parent / name).parent.mkdir(parents=True, exist_ok=True)
        (parent / name).write_text(text, encoding="utf-8")
    (unsup.parent / "urls_unsup.txt").write_text("http://example.invalid/\n")
    return parent / "aclImdb"


def write_jsonl(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    records = [{"text": text, "id": id_} for id_, text in UNSUP.items()]
    random.Random(0).shuffle(records)  # the reader sorts by id
    with gzip.open(folder / UNLABELLED_JSONL, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return folder


@pytest.fixture
def forms(tmp_path):
    folder = write_folder(tmp_path / "extracted")
    archive = tmp_path / "aclImdb_v1.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname="aclImdb")
    jsonl = write_jsonl(tmp_path / "jsonl")
    return {"folder": folder, "parent": folder.parent, "archive": archive, "jsonl folder": jsonl,
            "jsonl file": jsonl / UNLABELLED_JSONL}


def test_every_form_gives_the_texts_in_id_order(forms):
    expected = [UNSUP[i] for i in sorted(UNSUP)]
    for name, path in forms.items():
        assert imdb_unlabelled(path) == expected, name


def test_missing_and_damaged_data_are_named(tmp_path, forms):
    with pytest.raises(FileNotFoundError, match="imdb_unsup.jsonl.gz"):
        imdb_unlabelled(tmp_path / "nothing here")
    data = bytearray(forms["jsonl file"].read_bytes())
    bad = tmp_path / "bad" / UNLABELLED_JSONL
    bad.parent.mkdir()
    bad.write_bytes(bytes(data[: len(data) // 2]))  # truncated
    with pytest.raises(DataFileError, match=UNLABELLED_JSONL):
        imdb_unlabelled(bad.parent)
    with gzip.open(bad, "wt", encoding="utf-8") as f:
        f.write('{"text": "fine", "id": 1}\n{"id": 2}\n')
    with pytest.raises(DataFileError, match="line 2"):
        imdb_unlabelled(bad)
    empty = tmp_path / "empty" / "train" / "unsup"
    empty.mkdir(parents=True)
    with pytest.raises(DataFileError, match="no unlabelled review"):
        imdb_unlabelled(empty.parent.parent)


def test_the_unlabelled_reader_checks_what_the_labelled_one_checks(tmp_path, forms):
    """The same rules as imdb(): a BOM is skipped, a lone surrogate is an error naming file and line, a file of
    another kind or a damaged archive is named, and a folder where a file belongs (or the reverse) is named."""
    jsonl = tmp_path / "bom" / UNLABELLED_JSONL
    jsonl.parent.mkdir()
    with gzip.open(jsonl, "wb") as f:
        f.write(b'\xef\xbb\xbf{"text": "first", "id": 2}\n{"text": "second", "id": 1}\n')
    assert imdb_unlabelled(jsonl) == ["second", "first"]
    with gzip.open(jsonl, "wt", encoding="utf-8") as f:
        f.write('{"text": "fine", "id": 1}\n{"text": "half \\ud800 a pair", "id": 2}\n')
    with pytest.raises(DataFileError, match=r"line 2: text is not valid Unicode: lone surrogate"):
        imdb_unlabelled(jsonl)
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(forms["archive"].read_bytes()[:15])  # tarfile.is_tarfile raised a bare EOFError on it
    with pytest.raises(DataFileError, match=r"cut\.tar\.gz: is neither imdb_unsup\.jsonl\.gz nor a tar archive"):
        imdb_unlabelled(cut)
    (tmp_path / "folder_as_file" / UNLABELLED_JSONL).mkdir(parents=True)
    with pytest.raises(DataFileError, match=r"imdb_unsup\.jsonl\.gz: is a folder, expected a file"):
        imdb_unlabelled(tmp_path / "folder_as_file")
    (tmp_path / "file_as_folder" / "train").mkdir(parents=True)
    (tmp_path / "file_as_folder" / "train" / "unsup").write_text("x")
    with pytest.raises(DataFileError, match=r"unsup: is a file, expected a folder of reviews"):
        imdb_unlabelled(tmp_path / "file_as_folder")


def test_deduplicate_removes_held_out_texts_and_repeats_in_order():
    corpus = ["a", "test review", "b", "a", "val review", "c", "test review", "b"]
    result = deduplicate(corpus, exclude=["test review", "val review", "never in corpus"])
    assert result.texts == ["a", "b", "c"]
    assert result.overlapping == 3  # both copies of the test review, and the validation one
    assert result.repeated == 2  # the second "a" and the second "b"
    assert not set(result.texts) & {"test review", "val review"}
    assert len(result.texts) + result.overlapping + result.repeated == len(corpus)


def test_deduplicate_checks_its_arguments():
    with pytest.raises(TypeError, match="texts"):
        deduplicate("one text", exclude=[])
    with pytest.raises(TypeError, match=r"exclude\[1\]"):
        deduplicate(["a"], exclude=["b", 3])


def test_texts_digest_is_the_same_for_the_same_texts_in_any_order_only():
    from torchformer.data.imdb_unlabelled import texts_digest

    texts = ["a fine film", "dull", "é \ud83c\udfac"]
    assert texts_digest(texts) == texts_digest(reversed(texts)) == texts_digest(list(texts))
    assert len(texts_digest(texts)) == 64
    assert texts_digest(texts) != texts_digest(texts[:2])
    assert texts_digest(["ab", "c"]) != texts_digest(["a", "bc"])  # where one text ends counts
    assert texts_digest(["x"]) != texts_digest(["x", "x"])
    with pytest.raises(TypeError, match=r"texts\[1\] must be a str, got int"):
        texts_digest(["ok", 3])
