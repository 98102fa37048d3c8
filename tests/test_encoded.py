"""The tokenized-corpus cache: read back equal, keyed by everything the ids depend on, never trusted when damaged."""

from __future__ import annotations

import numpy as np
import pytest

from torchformer.data.encoded import cached_encoding, encoding_key
from torchformer.data.tokenizers import build_tokenizer

TEXTS = ["the cat sat", "on the mat", "", "a dog, a cat, the mat " * 20]


def tokenizer(texts=TEXTS, vocab_size=12):
    return build_tokenizer("word", texts, vocab_size=vocab_size)


def encoder(tok, texts, calls):
    def encode():
        calls.append(1)
        return [tok.encode(t, max_length=16) or [1] for t in texts]
    return encode


def test_the_ids_are_computed_once_then_read_back_equal(tmp_path):
    tok, calls = tokenizer(), []
    key = encoding_key(TEXTS, tok.state_dict(), 16)
    first, read = cached_encoding(tmp_path, "corpus", key, encoder(tok, TEXTS, calls))
    assert not read and calls == [1] and first == encoder(tok, TEXTS, [])()
    again, read = cached_encoding(tmp_path, "corpus", key, encoder(tok, TEXTS, calls))
    assert read and calls == [1] and again == first
    assert all(type(i) is int for row in again for i in row)
    assert [p.name for p in tmp_path.iterdir()] == [f"corpus-{key[:16]}.npz"]


def test_the_key_changes_with_the_texts_their_order_the_tokenizer_and_the_length_limit():
    tok = tokenizer()
    base = encoding_key(TEXTS, tok.state_dict(), 16)
    assert encoding_key(list(TEXTS), tok.state_dict(), 16) == base
    others = [
        encoding_key(TEXTS[::-1], tok.state_dict(), 16),
        encoding_key(TEXTS[:-1] + [TEXTS[-1] + "!"], tok.state_dict(), 16),
        encoding_key(["the ca", "t sat"] + TEXTS[1:], tok.state_dict(), 16),  # the same characters, cut elsewhere
        encoding_key(TEXTS, tokenizer(vocab_size=8).state_dict(), 16),
        encoding_key(TEXTS, tok.state_dict(), 8),
        encoding_key(TEXTS, tok.state_dict(), None),
    ]
    assert len({base, *others}) == 1 + len(others)


def test_another_tokenizer_recomputes_and_replaces_the_old_file(tmp_path):
    calls = []
    small, large = tokenizer(vocab_size=6), tokenizer(vocab_size=12)
    cached_encoding(tmp_path, "corpus", encoding_key(TEXTS, small.state_dict(), 16), encoder(small, TEXTS, calls))
    key = encoding_key(TEXTS, large.state_dict(), 16)
    ids, read = cached_encoding(tmp_path, "corpus", key, encoder(large, TEXTS, calls))
    assert not read and calls == [1, 1] and ids == encoder(large, TEXTS, [])()
    assert [p.name for p in tmp_path.iterdir()] == [f"corpus-{key[:16]}.npz"]  # the stale file is gone


@pytest.mark.parametrize("damage", ["truncate", "garbage", "other_key", "lengths", "npy", "float_lengths"])
def test_a_damaged_file_is_recomputed_not_trusted(tmp_path, damage):
    tok, calls = tokenizer(), []
    key = encoding_key(TEXTS, tok.state_dict(), 16)
    expected, _ = cached_encoding(tmp_path, "corpus", key, encoder(tok, TEXTS, calls))
    path = tmp_path / f"corpus-{key[:16]}.npz"
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:100])
    elif damage == "garbage":
        path.write_bytes(b"not a numpy file")
    elif damage == "npy":  # one array, not an archive of them, under the archive's name
        with open(path, "wb") as f:
            np.save(f, np.arange(3))
    else:
        with np.load(path) as data:
            ids, lengths = data["ids"], data["lengths"]
        with open(path, "wb") as f:
            if damage == "other_key":
                np.savez(f, ids=ids, lengths=lengths, key=np.array("0" * 64))
            elif damage == "float_lengths":
                np.savez(f, ids=ids, lengths=lengths.astype(float), key=np.array(key))
            else:  # lengths that do not add up to the ids
                np.savez(f, ids=ids, lengths=lengths + 1, key=np.array(key))
    ids, read = cached_encoding(tmp_path, "corpus", key, encoder(tok, TEXTS, calls))
    assert not read and calls == [1, 1] and ids == expected
    assert cached_encoding(tmp_path, "corpus", key, encoder(tok, TEXTS, calls)) == (expected, True)  # replaced


def test_bad_names_keys_and_texts_are_refused(tmp_path):
    for name in ("../x", "a-b", "", "a b", "é"):
        with pytest.raises(ValueError, match="name must be ASCII letters, digits and '_'"):
            cached_encoding(tmp_path, name, "0" * 64, list)
    with pytest.raises(TypeError, match="texts must be a sequence of str, got one str"):
        encoding_key("abc", {}, None)


def test_a_corpus_whose_name_begins_like_another_keeps_the_others_file(tmp_path):
    tok, calls = tokenizer(), []
    cached_encoding(tmp_path, "train_small", encoding_key(TEXTS[:2], tok.state_dict(), 16),
                    encoder(tok, TEXTS[:2], calls))
    for size in (8, 16):  # a new key for "train": only train's old file goes
        cached_encoding(tmp_path, "train", encoding_key(TEXTS, tok.state_dict(), size), encoder(tok, TEXTS, calls))
    names = sorted(p.name.split("-")[0] for p in tmp_path.iterdir())
    assert names == ["train", "train_small"]
    with pytest.raises(ValueError, match="key must be a SHA-256 hex digest"):
        cached_encoding(tmp_path, "corpus", "abc", list)
