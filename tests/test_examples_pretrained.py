"""examples/pretrained.py on a tiny GPT-2 folder with a tokenizer.json, both written here.

Its printed log-probabilities are the model's, recomputed here independently; its continuation is ``generate``'s;
it draws the attention picture; and bad input stops it with a message, before anything is loaded where it can.
"""

from __future__ import annotations

import re

import pytest
import torch
from script_loader import ROOT, load_script

from torchformer import GTransformer, from_huggingface, generate, to_huggingface

pytest.importorskip("safetensors")
tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("matplotlib")

from test_pretrained_tokenizer import byte_level_bpe  # noqa: E402  (after the skips: it needs tokenizers)


@pytest.fixture(scope="module")
def script():
    return load_script(ROOT / "examples" / "pretrained.py", "pretrained_example")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-gpt2")
    tokenizer = byte_level_bpe(folder)
    torch.manual_seed(0)
    model = GTransformer(32, 4, 2, 24, tokenizer.get_vocab_size(), prenorm=True, qkv_bias=True,
                         activation="gelu_tanh", tie_weights=True, head_bias=False).eval()
    to_huggingface(model, folder)
    return folder


def test_it_prints_the_models_log_probabilities_and_generates_what_generate_does(script, folder, tmp_path, capsys):
    script.main([str(folder), "--prompt", "the cat sat on", "-n", "5", "--threads", "1", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    model = from_huggingface(folder)
    ids = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json")).encode("the cat sat on").ids
    with torch.no_grad():
        logp = model(torch.tensor([ids]))[0]
    prompt_part = out.split("prompt (")[1].split("continuation")[0]
    printed = [float(x) for x in re.findall(r"  (-?\d+\.\d{3})$", prompt_part, flags=re.M)]
    expected = [logp[i - 1, ids[i]].item() for i in range(1, len(ids))]
    assert printed == pytest.approx(expected, abs=1e-3)  # printed with 3 decimals
    greedy = generate(model, torch.tensor([ids]), 5, temperature=0)[0, len(ids):].tolist()
    continuation = out.split("continuation")[1].split("text:")[0]
    assert len(re.findall(r"  (-?\d+\.\d{3})$", continuation, flags=re.M)) == 5
    text = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json")).decode(ids + greedy)
    assert f"text: {text!r}" in out
    assert (tmp_path / "attention.png").stat().st_size > 0


def test_ids_work_without_a_tokenizer_and_bad_input_is_named(script, folder, tmp_path, capsys):
    script.main([str(folder), "--ids", "1", "2", "3", "-n", "2", "--threads", "1", "--out", str(tmp_path),
                 "--layer", "0", "--temperature", "0.5"])
    assert "temperature 0.5" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"--ids must be in \[0, "):
        script.main([str(folder), "--ids", "99999", "--threads", "1", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        script.main([str(folder), "--prompt", "x", "--temperature", "-1", "--out", str(tmp_path)])
    assert "--temperature must be 0 (greedy) or positive" in capsys.readouterr().err


def test_generated_ids_beyond_the_tokenizers_vocabulary_are_named_not_printed_as_empty_text(script, tmp_path,
                                                                                           capsys):
    # A vocabulary padded past the tokenizer's (as released models pad to a multiple of 64), and an output layer
    # that prefers two of the padding ids (its rows for real tokens zero, for those two w and -w): greedy decoding
    # then picks one of them at every step.
    folder = tmp_path / "padded"
    tokenizer = byte_level_bpe(folder)
    size = tokenizer.get_vocab_size()
    torch.manual_seed(0)
    model = GTransformer(32, 4, 1, 24, size + 8, prenorm=True, qkv_bias=True, activation="gelu_tanh",
                         head_bias=False).eval()
    with torch.no_grad():
        w = torch.randn(32)
        model.head.toprobs.weight.zero_()
        model.head.toprobs.weight[size + 3], model.head.toprobs.weight[size + 5] = 10 * w, -10 * w
    to_huggingface(model, folder)
    script.main([str(folder), "--prompt", "the cat", "-n", "3", "--threads", "1", "--out", str(tmp_path / "o")])
    out = capsys.readouterr().out
    continuation = out.split("continuation")[1].split("text:")[0]
    assert len(re.findall(rf"<id {size + 3}: no token>|<id {size + 5}: no token>", continuation)) == 3
    assert f"are not in the tokenizer's {size} tokens" in out
    assert "text: 'the cat'" in out  # the ids without text are left out of it
