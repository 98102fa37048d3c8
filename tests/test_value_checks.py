"""Token ids and positions are checked by value the same way on every device, unless the model turns it off.

A model's ``forward`` reads its inputs' values (ids in ``[0, num_tokens)``, positions in range and consecutive) on
any device: a named ``ValueError``, never "checked on the CPU only". ``model.check_values = False`` skips the reads
(on a GPU each waits for the device); shapes and dtypes are checked either way.
"""

from __future__ import annotations

import pytest
import torch

from torchformer import CTransformer, GTransformer, Seq2SeqTransformer, generate
from torchformer._checks import values_checkable

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def models(device: str) -> dict:
    torch.manual_seed(0)
    return {
        "generator": GTransformer(16, 2, 1, 8, 10).to(device),
        "classifier": CTransformer(16, 2, 1, 8, 10, 3).to(device),
        "seq2seq": Seq2SeqTransformer(16, 2, 1, 8, 10, 10).to(device),
    }


def call(kind: str, model, ids):
    return model(ids, ids) if kind == "seq2seq" else model(ids)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["generator", "classifier", "seq2seq"])
def test_an_id_out_of_range_is_named_on_every_device(device, kind):
    model = models(device)[kind].eval()
    bad = torch.tensor([[1, 2, 10]], device=device)  # 10 is not below num_tokens = 10
    with pytest.raises(ValueError, match=r"must hold token ids in \[0, 10\), got values in \[1, 10\]"):
        call(kind, model, bad)
    good = torch.tensor([[1, 2, 9]], device=device)
    call(kind, model, good)  # in range: runs


@pytest.mark.parametrize("device", DEVICES)
def test_positions_are_checked_by_value_on_every_device(device):
    model = models(device)["generator"].eval()
    caches = model.new_caches()
    x = torch.tensor([[1, 2]], device=device)
    with pytest.raises(ValueError, match="positions must be consecutive"):
        model(x, caches=caches, positions=torch.tensor([0, 2], device=device))
    with pytest.raises(ValueError, match="learned positions for seq_length=8 only"):
        model(x, caches=model.new_caches(), positions=torch.tensor([7, 8], device=device))


def test_check_values_false_skips_the_reads_but_not_the_shapes():
    model = models("cpu")["generator"].eval()
    model.check_values = False
    with pytest.raises(IndexError):  # the embedding's own error: no named check ran
        model(torch.tensor([[1, 10]]))
    with pytest.raises(ValueError, match=r"must have shape \(b, t\)"):  # shapes are still checked
        model(torch.tensor([1, 2]))
    reads = []
    original = torch.Tensor.tolist
    try:
        torch.Tensor.tolist = lambda self: reads.append(self) or original(self)
        model(torch.tensor([[1, 2]]), caches=model.new_caches(), positions=torch.tensor([0, 1]))
        assert reads == []  # nothing read from the device
        model.check_values = True
        model(torch.tensor([[1, 2]]), caches=model.new_caches(), positions=torch.tensor([0, 1]))
        assert len(reads) == 2  # one read for the ids, one for the positions
    finally:
        torch.Tensor.tolist = original


def test_generation_checks_the_prompt_whatever_the_model_says():
    model = models("cpu")["generator"].eval()
    model.check_values = False
    with pytest.raises(ValueError, match=r"prompt must hold token ids in \[0, 10\)"):
        generate(model, torch.tensor([[1, 10]]), 2, temperature=0)


def test_the_value_check_does_not_depend_on_the_device_type():
    # Only a tensor without values (empty, or on the meta device) or a torch.compile trace skips the reads.
    assert values_checkable(torch.zeros(2, dtype=torch.long))
    assert not values_checkable(torch.zeros(0, dtype=torch.long))
    assert not values_checkable(torch.zeros(2, dtype=torch.long, device="meta"))


def value_reads(monkeypatch, run) -> int:
    """How many times the value checks (``_checks.py``) read a tensor on the host while ``run()`` runs."""
    import sys

    reads = []
    original = torch.Tensor.tolist

    def tolist(self):
        if sys._getframe(1).f_code.co_filename.endswith("_checks.py"):
            reads.append(1)
        return original(self)

    monkeypatch.setattr(torch.Tensor, "tolist", tolist)
    run()
    monkeypatch.undo()
    return len(reads)


@pytest.mark.parametrize("use_cache", [True, False])
def test_decoding_checks_values_once_per_call_not_per_token(monkeypatch, use_cache):
    # The prompt is checked once; the later tokens are the model's own samples and the positions the loop's count,
    # so the steps read nothing (on a GPU a read per token would make the host wait at every token).
    from torchformer import beam_search, seq2seq_generate

    m = models("cpu")
    prompt = torch.tensor([[1, 2]])
    g, s = m["generator"].eval(), m["seq2seq"].eval()
    for run in (lambda n: generate(g, prompt, n, temperature=0, use_cache=use_cache),
                lambda n: beam_search(g, prompt, n, beam_size=2, use_cache=use_cache),
                lambda n: seq2seq_generate(s, prompt, n, bos=1, eos=2, use_cache=use_cache)):
        short, long = value_reads(monkeypatch, lambda: run(3)), value_reads(monkeypatch, lambda: run(7))
        assert short == long <= 2, (short, long)  # the prompt (and seq2seq's encoder input), whatever the length
