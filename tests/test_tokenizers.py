import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchformer.data.tokenizers import ByteTokenizer, WordTokenizer, tokenizer_from_state_dict

TRAIN = [
    "This movie was GREAT!<br /><br />I loved it.",
    "A great cast, but a weak plot... I didn't love it.",
    "Great fun; the cast loved it (mostly).",
]
TEST_ONLY = "Dreadful script, great cast."  # "dreadful" and "script" never occur in TRAIN


@pytest.fixture
def tok():
    return WordTokenizer.build(TRAIN, vocab_size=1000)


def test_tokenize_lowercases_splits_punctuation_and_drops_breaks(tok):
    assert tok.tokenize("GREAT!<br /><br />I loved it.") == ["great", "!", "i", "loved", "it", "."]
    assert tok.tokenize("end<BR/>start<br>x") == ["end", "start", "x"]  # a break separates words
    assert tok.tokenize("didn't (mostly)...") == ["didn't", "(", "mostly", ")", ".", ".", "."]
    assert tok.tokenize("  \n\t ") == []


def test_specials_and_frequency_order(tok):
    vocab = tok.state_dict()["vocab"]
    assert vocab[:2] == ["<pad>", "<unk>"] and (tok.PAD, tok.UNK) == (0, 1)
    counts = {}
    for text in TRAIN:
        for word in tok.tokenize(text):
            counts[word] = counts.get(word, 0) + 1
    assert set(vocab[2:]) == set(counts)
    # Most frequent first, ties alphabetical.
    assert vocab[2:] == sorted(counts, key=lambda w: (-counts[w], w))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(["great", "movie", "the", "!", ",", "didn't", "cast", "."]), max_size=30))
def test_round_trip_of_in_vocabulary_text(words):
    tok = WordTokenizer.build(TRAIN + ["the movie"], vocab_size=1000)
    text = " ".join(w.upper() if i % 3 == 0 else w for i, w in enumerate(words)).replace(" ! ", "!<br />")
    ids = tok.encode(text)
    assert tok.UNK not in ids
    assert tok.decode(ids) == " ".join(tok.tokenize(text))
    assert tok.tokenize(tok.decode(ids)) == tok.tokenize(text)


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_tokenize_is_idempotent_on_arbitrary_text(text):
    tok = WordTokenizer([WordTokenizer.PAD_TOKEN, WordTokenizer.UNK_TOKEN])
    tokens = tok.tokenize(text)
    assert all(token and not any(c.isspace() for c in token) for token in tokens)
    assert tok.tokenize(" ".join(tokens)) == tokens


def test_unknown_words_and_train_only_vocab(tok):
    tokens = tok.tokenize(TEST_ONLY)
    ids = tok.encode(TEST_ONLY)
    assert len(ids) == len(tokens)
    for token, i in zip(tokens, ids):
        assert (i == tok.UNK) == (token in {"dreadful", "script"})
    assert tok.decode(ids) == "<unk> <unk> , great cast ."


def test_vocab_size_is_total_size_and_respected():
    empty = WordTokenizer([WordTokenizer.PAD_TOKEN, WordTokenizer.UNK_TOKEN])
    all_words = {w for t in TRAIN for w in empty.tokenize(t)}
    for size in (2, 3, 7):
        small = WordTokenizer.build(TRAIN, vocab_size=size)
        assert len(small) == size
        assert max(small.encode(" ".join(TRAIN))) < size
    big = WordTokenizer.build(TRAIN, vocab_size=10_000)
    assert len(big) == len(all_words) + 2  # fewer words than asked for: the real size
    only_specials = WordTokenizer.build(TRAIN, vocab_size=2)
    assert set(only_specials.encode(TRAIN[0])) == {WordTokenizer.UNK}


def test_ties_are_broken_alphabetically_whatever_the_input_order():
    texts = ["zeta beta alpha", "alpha beta zeta gamma"]
    a = WordTokenizer.build(texts, vocab_size=5)
    b = WordTokenizer.build(list(reversed(texts)), vocab_size=5)
    assert a.state_dict() == b.state_dict()
    assert a.state_dict()["vocab"] == ["<pad>", "<unk>", "alpha", "beta", "zeta"]


def test_max_length_truncates(tok):
    full = tok.encode(TRAIN[1])
    assert tok.encode(TRAIN[1], max_length=4) == full[:4]
    assert tok.encode(TRAIN[1], max_length=10_000) == full
    for bad in (0, -3, 2.0, True):
        with pytest.raises(ValueError, match="max_length"):
            tok.encode("x", max_length=bad)


def test_decode_skips_padding_and_rejects_out_of_range(tok):
    ids = tok.encode("great movie")
    assert tok.decode(ids + [tok.PAD] * 3) == "great movie"
    assert tok.decode(torch.tensor(ids)) == "great movie"
    with pytest.raises(ValueError, match=r"ids must be in \[0, "):
        tok.decode([len(tok)])


def test_build_rejects_bad_arguments():
    with pytest.raises(ValueError, match="vocab_size"):
        WordTokenizer.build(TRAIN, vocab_size=1)
    with pytest.raises(TypeError, match="single string"):
        WordTokenizer.build("a whole review", vocab_size=10)
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        WordTokenizer.build(["ok", 3], vocab_size=10)


def test_state_dict_round_trips_through_json_and_torch_save(tok, tmp_path):
    state = tok.state_dict()
    again = WordTokenizer.from_state_dict(json.loads(json.dumps(state)))
    assert again.encode(TEST_ONLY) == tok.encode(TEST_ONLY) and len(again) == len(tok)

    path = tmp_path / "tok.pt"
    torch.save({"word": state, "byte": ByteTokenizer().state_dict()}, path)
    loaded = torch.load(path, weights_only=True)
    word = tokenizer_from_state_dict(loaded["word"])
    byte = tokenizer_from_state_dict(loaded["byte"])
    assert isinstance(word, WordTokenizer) and isinstance(byte, ByteTokenizer)
    assert word.encode(TRAIN[0]) == tok.encode(TRAIN[0])
    assert word.decode(word.encode(TRAIN[2])) == tok.decode(tok.encode(TRAIN[2]))


def test_state_dict_validation():
    with pytest.raises(ValueError, match="kind"):
        tokenizer_from_state_dict({"kind": "sentencepiece"})
    with pytest.raises(ValueError, match="kind='word'"):
        WordTokenizer.from_state_dict({"kind": "byte"})
    with pytest.raises(ValueError, match="must start with"):
        WordTokenizer.from_state_dict({"kind": "word", "vocab": ["a", "b"]})
    with pytest.raises(ValueError, match="duplicate"):
        WordTokenizer.from_state_dict({"kind": "word", "vocab": ["<pad>", "<unk>", "a", "a"]})


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_byte_tokenizer_round_trips_any_unicode(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert len(ids) == len(text.encode("utf-8"))
    assert all(1 <= i < len(tok) for i in ids)  # 0 is left free for padding
    assert tok.decode(ids) == text
    assert tok.decode(ids + [tok.PAD] * 2) == text


def test_byte_tokenizer_details():
    tok = ByteTokenizer()
    assert len(tok) == 257
    assert tok.encode("A\u00e9") == [ord("A") + 1, 0xC3 + 1, 0xA9 + 1]
    assert tok.encode("A\u00e9", max_length=2) == [ord("A") + 1, 0xC3 + 1]
    assert tok.decode(tok.encode("A\u00e9", max_length=2)) == "A\ufffd"  # half a character
    with pytest.raises(ValueError, match=r"\[0, 257\)"):
        tok.decode([257])
    with pytest.raises(ValueError, match="max_length"):
        tok.encode("x", max_length=0)


# ------------------------------------------------------------------ wrong types


@settings(max_examples=100, deadline=None)
@given(st.binary())
def test_byte_tokenizer_encodes_bytes_as_they_are(data):
    tok = ByteTokenizer()
    ids = tok.encode(data)
    assert ids == [b + 1 for b in data]
    assert tok.encode(bytearray(data)) == ids and tok.encode(memoryview(data)) == ids
    assert tok.encode(data, max_length=3) == ids[:3]


def test_byte_tokenizer_bytes_and_str_agree():
    tok = ByteTokenizer()
    assert tok.encode("café".encode("utf-8")) == tok.encode("café")


@pytest.mark.parametrize("text", [5, None, ["a", "b"], 2.5])
def test_byte_tokenizer_rejects_other_types(text):
    with pytest.raises(TypeError, match=f"text must be a str or bytes, got {type(text).__name__}"):
        ByteTokenizer().encode(text)


@pytest.mark.parametrize(
    "text, hint",
    [(b"bytes", r"decode them first"), (["a", "b"], "one text at a time"), (None, ""), (7, "")],
)
def test_word_tokenizer_rejects_other_types(tok, text, hint):
    pattern = f"text must be a str, got {type(text).__name__}.*{hint}"
    for method in (tok.encode, tok.tokenize):
        with pytest.raises(TypeError, match=pattern):
            method(text)


@pytest.mark.parametrize("tokenizer", [ByteTokenizer(), WordTokenizer.build(TRAIN, vocab_size=100)], ids=repr)
@pytest.mark.parametrize(
    "ids, match",
    [
        ("abc", "ids must be a sequence of ints, got str"),
        (b"ab", "ids must be a sequence of ints, got bytes"),
        (5, "ids must be a sequence of ints, got int"),
        ({3, 2}, "ids must be a sequence of ints, got set"),  # no order: the text would come out shuffled
        ({3: "x"}, "ids must be a sequence of ints, got dict"),
        (None, "ids must be a sequence of ints, got NoneType"),
        ([2, 2.7], r"ids\[1\] must be an int, got float 2.7"),
        (["3"], r"ids\[0\] must be an int, got str '3'"),
        ([True], r"ids\[0\] must be an int, got bool True"),
        ([[2, 3]], r"ids\[0\] must be an int, got list"),
        (torch.tensor([[2, 3]]), r"ids\[0\] must be an int, got list"),
        (torch.tensor([2.5]), r"ids\[0\] must be an int, got float 2.5"),
    ],
)
def test_decode_rejects_what_is_not_a_sequence_of_ints(tokenizer, ids, match):
    with pytest.raises(TypeError, match=match):
        tokenizer.decode(ids)


def test_decode_accepts_integer_arrays_and_scalars(tok):
    import numpy as np

    ids = tok.encode("great movie")
    for same in (torch.tensor(ids), np.array(ids), [np.int64(i) for i in ids], [torch.tensor(i) for i in ids]):
        assert tok.decode(same) == "great movie"
    assert ByteTokenizer().decode(np.array([ord("h") + 1, ord("i") + 1], dtype=np.uint8)) == "hi"


def test_constructors_and_state_dicts_name_what_is_wrong():
    with pytest.raises(TypeError, match=r"vocab must be a sequence of str in id order \(a list\), got NoneType"):
        WordTokenizer(None)
    # A {token: id} dict would be numbered by its key order, whatever ids it gives: "great" would get id 3.
    with pytest.raises(TypeError, match=r"vocab must be a sequence of str in id order \(a list\), got dict"):
        tokenizer_from_state_dict({"kind": "word", "vocab": {"<pad>": 0, "<unk>": 1, "film": 3, "great": 2}})
    with pytest.raises(TypeError, match="got set"):
        WordTokenizer({"<pad>", "<unk>"})
    with pytest.raises(TypeError, match="vocab must be a sequence of str, got a single str"):
        WordTokenizer("<pad><unk>")
    with pytest.raises(TypeError, match="texts must be an iterable of strings, got NoneType"):
        WordTokenizer.build(None, vocab_size=10)
    with pytest.raises(ValueError, match="state has no 'vocab'"):
        WordTokenizer.from_state_dict({"kind": "word"})
    with pytest.raises(TypeError, match="vocab must be a sequence of str in id order"):
        WordTokenizer.from_state_dict({"kind": "word", "vocab": None})
    for bad in (None, [], "word"):
        with pytest.raises(TypeError, match=f"state must be a dict, got {type(bad).__name__}"):
            tokenizer_from_state_dict(bad)
        with pytest.raises(TypeError, match=f"state must be a dict, got {type(bad).__name__}"):
            ByteTokenizer.from_state_dict(bad)


def test_byte_tokenizer_names_a_lone_surrogate():
    # json.loads('"\\ud800"') gives such a str: it is not valid Unicode and has no UTF-8 bytes.
    with pytest.raises(ValueError, match=r"text is not valid Unicode: lone surrogate '\\ud800' at index 2"):
        ByteTokenizer().encode("ab\ud800c")


def test_build_tokenizer_makes_each_kind_from_the_training_texts():
    from torchformer.data.tokenizers import build_tokenizer

    texts = ["a good film", "a bad film"] * 5
    word = build_tokenizer("word", texts, vocab_size=10)
    assert isinstance(word, WordTokenizer) and word.decode(word.encode("a good film")) == "a good film"
    assert isinstance(build_tokenizer("byte", texts, vocab_size=10), ByteTokenizer)
    with pytest.raises(ValueError, match="kind must be one of 'word', 'bpe', 'byte'"):
        build_tokenizer("char", texts, vocab_size=10)
