"""BPETokenizer: byte-level BPE through the optional ``tokenizers`` package, with the interface of WordTokenizer."""

import hashlib
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchformer.data import BPETokenizer, ByteTokenizer, WordTokenizer, pad_batch, tokenizer_from_state_dict

SRC = pathlib.Path(__file__).resolve().parent.parent / "src"
needs_tokenizers = pytest.mark.skipif(
    importlib.util.find_spec("tokenizers") is None, reason='needs tokenizers: pip install "torchformer[bpe]"'
)
INSTALL_HINT = r'pip install "torchformer\[bpe\]"'

TRAIN = [
    "This movie was wonderful!<br /><br />I loved it.",
    "A wonderful cast, but a weak plot... I didn't love it.",
    "Wonderful fun; the cast loved it (mostly). A wonderful, wonderful film.",
] * 5
VARIED = [
    "",
    " ",
    "plain ascii text",
    "  leading and trailing spaces  ",
    "tabs\tand\nnew\r\nlines",
    "GREAT<br />film<BR/>really<br>",
    "caf\u00e9 na\u00efve \u00fcber \u00c5ngstr\u00f6m",
    "\u65e5\u672c\u8a9e\u306e\u6620\u753b\u30ec\u30d3\u30e5\u30fc",  # Japanese
    "\u0645\u0631\u062d\u0628\u0627 \u05e9\u05dc\u05d5\u05dd",  # Arabic and Hebrew, right to left
    "emoji \U0001f3ac\U0001f37f\U0001f44d\U0001f3fd family \U0001f468\u200d\U0001f469\u200d\U0001f467",
    "combining e\u0301 and \u0130stanbul",  # lower-casing "\u0130" gives two characters
    "control \x00\x07\x7f chars",
    "a literal <pad> and <unk> in a review",
    "!!!???... \u2014 \u201cquotes\u201d",
]


@pytest.fixture(scope="module")
def tok():
    pytest.importorskip("tokenizers")
    return BPETokenizer.build(TRAIN, vocab_size=400)


# ------------------------------------------------------------------ round trips and padding


@needs_tokenizers
@pytest.mark.parametrize("text", VARIED, ids=range(len(VARIED)))
def test_round_trip_gives_the_normalised_text(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == tok.normalize(text)
    # The documented normalisation: IMDb's line breaks become a space, then lower-case.
    assert tok.normalize(text) == text.replace("<br />", " ").replace("<BR/>", " ").replace("<br>", " ").lower()


@needs_tokenizers
@settings(max_examples=200, deadline=None)
@given(st.text())
def test_round_trip_of_any_text(tok, text):
    ids = tok.encode(text)
    assert all(1 <= i < len(tok) for i in ids)  # never 0: <pad> is left for padding
    assert tok.decode(ids) == tok.normalize(text)


@needs_tokenizers
def test_lowercase_false_keeps_case():
    cased = BPETokenizer.build(TRAIN, vocab_size=400, lowercase=False)
    text = "A WONDERFUL<br />Film \u00c9T\u00c9"
    assert cased.normalize(text) == "A WONDERFUL Film \u00c9T\u00c9"
    assert cased.decode(cased.encode(text)) == "A WONDERFUL Film \u00c9T\u00c9"
    assert repr(cased) == f"BPETokenizer(vocab_size={len(cased)}, lowercase=False)"


@needs_tokenizers
def test_id_0_is_padding_only(tok):
    assert (tok.PAD, tok.PAD_TOKEN) == (0, "<pad>")
    for text in VARIED + TRAIN:
        assert 0 not in tok.encode(text)
    # A review that says "<pad>" is text, spelled out in ordinary tokens.
    assert tok.decode(tok.encode("<pad>")) == "<pad>"
    ids = tok.encode("a wonderful film")
    assert tok.decode([0, *ids[:1], 0, *ids[1:], 0, 0]) == "a wonderful film"  # padding is dropped
    assert tok.decode(torch.tensor(ids + [0])) == "a wonderful film"


@needs_tokenizers
def test_the_constructor_reads_pad_as_text_without_changing_the_callers_tokenizer(tok):
    import tokenizers

    raw = tokenizers.Tokenizer.from_str(tok.state_dict()["tokenizer"])
    raw.encode_special_tokens = False
    wrapped = BPETokenizer(raw)
    assert 0 not in wrapped.encode("<pad> a wonderful film")  # the wrapper reads "<pad>" as text
    assert raw.encode_special_tokens is False  # and left the caller's object as it was
    assert raw.encode("<pad>").ids == [0]


# ------------------------------------------------------------------ what BPE learns


@needs_tokenizers
def test_vocabulary_size_is_a_limit(tok):
    for size in (257, 258, 300, 100_000):
        small = BPETokenizer.build(TRAIN, vocab_size=size)
        assert len(small) <= size
        assert max(max(small.encode(t), default=0) for t in TRAIN + VARIED) < len(small)
    # 257 is <pad> and the 256 bytes: no merge, one id per byte.
    bytes_only = BPETokenizer.build(TRAIN, vocab_size=257)
    assert len(bytes_only) == 257
    text = "caf\u00e9 \U0001f3ac"
    assert len(bytes_only.encode(text)) == len(text.encode("utf-8"))
    # The texts hold far fewer repeated pairs than 100,000: training stops when no pair occurs twice.
    assert len(BPETokenizer.build(TRAIN, vocab_size=100_000)) < 1000


@needs_tokenizers
def test_a_frequent_word_becomes_one_token_and_a_rare_one_pieces(tok):
    # "wonderful" occurs 30 times in TRAIN (with and without a space before it), "wondrous" never.
    assert len(tok.encode("wonderful")) == 1
    assert tok.tokenize("a wonderful film") == ["a", " wonderful", " film"]
    assert len(tok.encode("wondrous")) > 1
    # Sequences are shorter than bytes: the point of learning merges.
    text = "I loved this wonderful film, the cast was wonderful."
    assert len(tok.encode(text)) < len(ByteTokenizer().encode(text)) / 2


@needs_tokenizers
def test_max_length_cuts(tok):
    text = TRAIN[1]
    full = tok.encode(text)
    assert len(full) > 5
    for n in (1, 5, len(full), len(full) + 10):
        assert tok.encode(text, max_length=n) == full[:n]
    for bad in (0, -3, 2.0, True):
        with pytest.raises(ValueError, match="max_length"):
            tok.encode(text, max_length=bad)


@needs_tokenizers
def test_training_is_deterministic_for_the_same_texts():
    first = BPETokenizer.build(TRAIN, vocab_size=300).state_dict()
    assert BPETokenizer.build(list(TRAIN), vocab_size=300).state_dict() == first
    assert BPETokenizer.build(iter(TRAIN), vocab_size=300).state_dict() == first  # any iterable, read once


@needs_tokenizers
def test_training_is_deterministic_across_processes_and_thread_counts():
    # Another process (another hash seed) training on one thread gives the same vocabulary as this one's pool.
    script = (
        "import hashlib, json, sys\n"
        "from torchformer.data.bpe import BPETokenizer\n"
        "texts = json.loads(sys.stdin.read())\n"
        "state = BPETokenizer.build(texts, vocab_size=300).state_dict()\n"
        "print(hashlib.sha256(json.dumps(state).encode()).hexdigest())\n"
    )
    env = dict(os.environ, RAYON_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(SRC), *sys.path]))
    result = subprocess.run([sys.executable, "-c", script], input=json.dumps(TRAIN), env=env, capture_output=True,
                            text=True, timeout=120, check=True)
    here = BPETokenizer.build(TRAIN, vocab_size=300).state_dict()
    assert result.stdout.strip() == hashlib.sha256(json.dumps(here).encode()).hexdigest()


# ------------------------------------------------------------------ saving


@needs_tokenizers
def test_state_dict_survives_json_and_torch_save(tok, tmp_path):
    state = tok.state_dict()
    assert set(state) == {"kind", "lowercase", "tokenizer"} and state["kind"] == "bpe"
    assert isinstance(state["tokenizer"], str) and state["lowercase"] is True

    from_json = BPETokenizer.from_state_dict(json.loads(json.dumps(state)))
    path = tmp_path / "tok.pt"
    torch.save({"tokenizer": state}, path)
    from_torch = tokenizer_from_state_dict(torch.load(path, weights_only=True)["tokenizer"])
    assert isinstance(from_torch, BPETokenizer)
    for again in (from_json, from_torch):
        assert len(again) == len(tok) and repr(again) == repr(tok)
        for text in VARIED + TRAIN:
            assert again.encode(text) == tok.encode(text)
        assert again.encode("<pad>") == tok.encode("<pad>")  # the loaded one, too, reads "<pad>" as text
        assert again.state_dict() == state


@needs_tokenizers
def test_tokenizer_from_state_dict_knows_every_kind(tok):
    word = WordTokenizer.build(TRAIN, vocab_size=50)
    for tokenizer in (tok, word, ByteTokenizer()):
        assert type(tokenizer_from_state_dict(tokenizer.state_dict())) is type(tokenizer)


@needs_tokenizers
def test_encodings_batch_like_any_tokenizer(tok):
    # The interface the IMDb example relies on: lists of ids -> a padded batch, len() -> the embedding's size.
    ids, mask = pad_batch([tok.encode(t) for t in TRAIN[:3]])
    assert ids.max() < len(tok) and bool((ids[~mask] == tok.PAD).all()) and bool((ids[mask] != tok.PAD).all())


# ------------------------------------------------------------------ errors


@needs_tokenizers
def test_build_rejects_bad_arguments():
    # Above 2**20 the trainer would reserve memory for the whole size first (a billion aborted the process).
    for bad in (256, 0, 300.0, True, "300", 2**20 + 1, 10**9, 2**64):
        with pytest.raises(ValueError, match=r"vocab_size must be an int from 257 \(it counts <pad> and the 256 "
                                             r"bytes\) to 1,048,576 \(2\*\*20\), got"):
            BPETokenizer.build(TRAIN, vocab_size=bad)
    with pytest.raises(TypeError, match="texts must be an iterable of strings, got a single string"):
        BPETokenizer.build("a whole review", vocab_size=300)
    with pytest.raises(TypeError, match="texts must be an iterable of strings, got NoneType"):
        BPETokenizer.build(None, vocab_size=300)
    with pytest.raises(TypeError, match=r"texts\[1\] must be a str, got int"):
        BPETokenizer.build(["ok", 3], vocab_size=300)
    with pytest.raises(TypeError, match="lowercase must be a bool, got 'yes'"):
        BPETokenizer.build(TRAIN, vocab_size=300, lowercase="yes")
    with pytest.raises(ValueError, match=r"texts\[1\] is not valid Unicode: lone surrogate '\\ud800' at index 2"):
        BPETokenizer.build(["fine", "ab\ud800c"], vocab_size=300)


@needs_tokenizers
def test_encode_and_decode_reject_bad_arguments(tok):
    with pytest.raises(TypeError, match=r"text must be a str, got bytes \(decode them first"):
        tok.encode(b"bytes")
    with pytest.raises(TypeError, match="text must be a str, got list"):
        tok.normalize(["a", "b"])
    with pytest.raises(ValueError, match=r"text is not valid Unicode: lone surrogate '\\ud800' at index 2"):
        tok.encode("ab\ud800c")
    with pytest.raises(ValueError, match=r"at index 9 "):  # of the text as given, before <br /> became a space
        tok.encode("a<br />b \ud800")
    with pytest.raises(ValueError, match=rf"ids must be in \[0, {len(tok)}\), got {len(tok)}"):
        tok.decode([5, len(tok)])
    with pytest.raises(ValueError, match=r"ids must be in \[0, \d+\), got -1"):
        tok.decode([-1])
    with pytest.raises(TypeError, match=r"ids\[1\] must be an int, got float 2.5"):
        tok.decode([3, 2.5])
    with pytest.raises(TypeError, match="ids must be a sequence of ints, got str"):
        tok.decode("abc")


@needs_tokenizers
def test_constructor_and_state_dicts_name_what_is_wrong(tok):
    import tokenizers

    with pytest.raises(TypeError, match="tokenizer must be a tokenizers.Tokenizer, got dict"):
        BPETokenizer({})
    word_level = tokenizers.Tokenizer(tokenizers.models.WordLevel({"<pad>": 0, "a": 1}, unk_token="a"))
    with pytest.raises(ValueError, match=r"must be a byte-level BPE \(its model a BPE\), got model WordLevel"):
        BPETokenizer(word_level)
    no_pad = tokenizers.Tokenizer(tokenizers.models.BPE())
    no_pad.pre_tokenizer, no_pad.decoder = tokenizers.pre_tokenizers.ByteLevel(), tokenizers.decoders.ByteLevel()
    with pytest.raises(ValueError, match="tokenizer must have <pad> at id 0, got id None"):
        BPETokenizer(no_pad)
    with pytest.raises(ValueError, match="kind='bpe'"):
        BPETokenizer.from_state_dict(ByteTokenizer().state_dict())
    with pytest.raises(TypeError, match="state must be a dict, got str"):
        BPETokenizer.from_state_dict("bpe")
    with pytest.raises(ValueError, match=r"state has no 'tokenizer' \(keys: \['kind', 'lowercase'\]\)"):
        BPETokenizer.from_state_dict({"kind": "bpe", "lowercase": True})
    state = tok.state_dict()
    with pytest.raises(TypeError, match=r"state\['tokenizer'\] must be a str \(the tokenizer's JSON\), got bytes"):
        BPETokenizer.from_state_dict({**state, "tokenizer": state["tokenizer"].encode()})
    with pytest.raises(ValueError, match=r"state\['tokenizer'\] is not a tokenizer's JSON"):
        BPETokenizer.from_state_dict({**state, "tokenizer": state["tokenizer"][:100]})
    with pytest.raises(TypeError, match="lowercase must be a bool, got 1"):
        BPETokenizer.from_state_dict({**state, "lowercase": 1})


# ------------------------------------------------------------------ without the package


def test_a_missing_tokenizers_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # `import tokenizers` now raises ImportError
    with pytest.raises(ImportError, match=rf"needs the tokenizers package \(HuggingFace\): {INSTALL_HINT}"):
        BPETokenizer.build(TRAIN, vocab_size=300)
    with pytest.raises(ImportError, match=INSTALL_HINT):
        tokenizer_from_state_dict({"kind": "bpe", "lowercase": True, "tokenizer": "{}"})
    # The other tokenizers never need it.
    assert ByteTokenizer().decode(ByteTokenizer().encode("ok")) == "ok"
    assert isinstance(tokenizer_from_state_dict(WordTokenizer.build(TRAIN, vocab_size=20).state_dict()), WordTokenizer)


def test_a_too_old_tokenizers_package_is_named(monkeypatch):
    old = types.SimpleNamespace(__version__="0.14.1", Tokenizer=type("Tokenizer", (), {}))
    monkeypatch.setitem(sys.modules, "tokenizers", old)
    with pytest.raises(ImportError, match=r"BPETokenizer needs tokenizers >= 0\.15\.1, found 0\.14\.1"):
        BPETokenizer.build(TRAIN, vocab_size=300)


def test_torchformer_imports_without_the_package():
    # A fresh process, where tokenizers cannot be imported: the core library and the other tokenizers work.
    script = (
        "import sys\n"
        "sys.modules['tokenizers'] = None\n"
        "import torchformer, torchformer.data\n"
        "from torchformer.data import BPETokenizer, WordTokenizer\n"
        "assert WordTokenizer.build(['a b'], vocab_size=4).encode('a') == [2]\n"
        "print('ok')\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), *sys.path]))
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
