"""A folder's tokenizer.json behind torchformer's interface (torchformer.pretrained.HuggingFaceTokenizer).

The reference is the file itself, run by ``tokenizers`` directly and, where installed, by ``transformers``'
``PreTrainedTokenizerFast``: the same ids, the special tokens a BERT-style post-processor adds, and the text back.
Tiny tokenizers are trained here; nothing is downloaded.
"""

from __future__ import annotations

import pytest
import torch

from torchformer.pretrained import HuggingFaceTokenizer

tokenizers = pytest.importorskip("tokenizers")

TEXTS = ["the cat sat on the mat", "a dog and a cat", "the meaning of life is 42", "héllo wörld"] * 20


def byte_level_bpe(folder):
    """A GPT-2-style tokenizer (byte-level BPE) trained on TEXTS, saved as folder/tokenizer.json."""
    tokenizer = tokenizers.Tokenizer(tokenizers.models.BPE())
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(TEXTS, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return tokenizer


def wordpiece_with_cls_sep(folder):
    """A BERT-style tokenizer: WordPiece, and [CLS] ... [SEP] put around every text by its post-processor."""
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordPiece(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.decoder = tokenizers.decoders.WordPiece()
    trainer = tokenizers.trainers.WordPieceTrainer(vocab_size=120, special_tokens=["[PAD]", "[UNK]", "[CLS]",
                                                                                   "[SEP]", "[MASK]"])
    tokenizer.train_from_iterator(TEXTS, trainer)
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = tokenizers.processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return tokenizer


def test_byte_level_bpe_encodes_as_the_file_says_and_decodes_back(tmp_path):
    reference = byte_level_bpe(tmp_path)
    ours = HuggingFaceTokenizer.from_folder(tmp_path)
    for text in ["the cat sat on the mat", "an unseen wörd, with punctuation!", ""]:
        ids = ours.encode(text)
        assert ids == reference.encode(text).ids
        assert ours.decode(ids) == text  # byte-level: every text comes back exactly
        assert ours.decode(torch.tensor(ids)) == text
    assert ours.encode("the cat sat", max_length=2) == reference.encode("the cat sat").ids[:2]
    assert len(ours) == reference.get_vocab_size() and ours.token_id("<|endoftext|>") == 0
    assert ours.token_id("no such token") is None
    assert "".join(ours.tokenize("the cat")).replace("Ġ", " ") == "the cat"


def test_a_bert_style_post_processor_adds_cls_and_sep_and_decode_skips_them(tmp_path):
    reference = wordpiece_with_cls_sep(tmp_path)
    ours = HuggingFaceTokenizer.from_folder(tmp_path / "tokenizer.json")  # the file itself works too
    ids = ours.encode("the cat sat")
    cls, sep = ours.token_id("[CLS]"), ours.token_id("[SEP]")
    assert ids[0] == cls and ids[-1] == sep and ids == reference.encode("the cat sat").ids
    assert ours.encode("the cat sat", special_tokens=False) == ids[1:-1]
    assert ours.decode(ids) == "the cat sat"
    assert ours.decode(ids, skip_special_tokens=False).startswith("[CLS]")


@pytest.mark.parametrize("fixture", [byte_level_bpe, wordpiece_with_cls_sep], ids=lambda f: f.__name__)
def test_tokenize_gives_the_tokens_of_encode_without_special_tokens(tmp_path, fixture):
    # The BERT-style fixture is the one that tells: its post-processor adds [CLS] and [SEP], which tokenize must not.
    fixture(tmp_path)
    ours = HuggingFaceTokenizer.from_folder(tmp_path)
    for text in ["the cat sat on the mat", "a dog, and héllo", ""]:
        tokens = ours.tokenize(text)
        assert [ours.token_id(token) for token in tokens] == ours.encode(text, special_tokens=False)
    transformers = pytest.importorskip("transformers")
    theirs = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    assert ours.tokenize("a dog, and héllo") == theirs.tokenize("a dog, and héllo")


def test_transformers_reads_the_same_file_to_the_same_ids(tmp_path):
    transformers = pytest.importorskip("transformers")
    byte_level_bpe(tmp_path / "bpe")
    wordpiece_with_cls_sep(tmp_path / "wp")
    for folder in (tmp_path / "bpe", tmp_path / "wp"):
        theirs = transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
        ours = HuggingFaceTokenizer.from_folder(folder)
        for text in ["the cat sat on the mat", "a dog, and héllo"]:
            assert ours.encode(text) == theirs(text)["input_ids"]
            assert ours.decode(ours.encode(text)) == theirs.decode(theirs(text)["input_ids"], skip_special_tokens=True)


def test_missing_and_damaged_files_and_bad_arguments_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no tokenizer.json; .*save_pretrained"):
        HuggingFaceTokenizer.from_folder(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not a tokenizer the tokenizers package can read"):
        HuggingFaceTokenizer.from_folder(tmp_path)
    byte_level_bpe(tmp_path)
    ours = HuggingFaceTokenizer.from_folder(tmp_path)
    with pytest.raises(TypeError, match="text must be a str, got bytes"):
        ours.encode(b"the cat")
    with pytest.raises(TypeError, match="special_tokens"):
        ours.encode("the cat", special_tokens="no")
