"""Tests for torchformer.train.inspection: captured attention weights are the ones the model really used."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from torch import nn

from torchformer.train.inspection import attention_weights, capture_attention, plot_attention
from torchformer.models import CTransformer, GTransformer, Seq2SeqTransformer


def classifier(prenorm: bool, depth: int = 2) -> CTransformer:
    torch.manual_seed(0)
    return CTransformer(16, 4, depth, 12, 30, 2, prenorm=prenorm).eval()


def batch():
    ids = torch.randint(1, 30, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.arange(9) < torch.tensor([9, 5, 2])[:, None]
    return ids, mask


@pytest.mark.parametrize("prenorm", [False, True])
@pytest.mark.parametrize("layer", [0, -1])
def test_weights_recombine_into_the_blocks_actual_attention_output(prenorm, layer):
    model = classifier(prenorm)
    ids, mask = batch()
    attention = model.encoder.blocks[layer].attention
    seen = {}

    def record_input(module, args):
        seen["input"] = args[0]  # (a hook that returned a value would replace the layer's arguments)

    def record_output(module, args, out):
        seen["output"] = out

    pre = attention.register_forward_pre_hook(record_input)
    post = attention.register_forward_hook(record_output)
    with torch.no_grad():
        model(ids, mask)  # the ordinary (fast, SDPA) forward pass
    pre.remove(), post.remove()

    weights = attention_weights(model, ids, mask, layer=layer)
    assert weights.shape == (3, 4, 9, 9)
    # out == unifyheads(merge(weights @ v)), with v computed from the input the block really fed the layer.
    _, v = attention.project_keys_values(seen["input"])
    with torch.no_grad():
        rebuilt = attention.unifyheads(attention.merge_heads(weights @ v))
    torch.testing.assert_close(rebuilt, seen["output"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("prenorm", [False, True])
def test_captured_input_is_what_the_first_block_saw(prenorm):
    model = classifier(prenorm, depth=1)
    ids, mask = batch()
    block = model.encoder.blocks[0]
    with torch.no_grad():
        x = model.embedding(ids)
        seen_by_attention = block.norm1(x) if prenorm else x  # pre-norm normalises before attention
        _, expected = block.attention(seen_by_attention, mask, return_weights=True)
    torch.testing.assert_close(attention_weights(model, ids, mask), expected)


def test_rows_sum_to_one_and_padding_gets_zero_and_changes_nothing():
    model = classifier(prenorm=False)
    ids, mask = batch()
    weights = attention_weights(model, ids, mask)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 4, 9))
    assert (weights * ~mask[:, None, None, :]).abs().max() == 0  # padded keys get exactly zero weight
    for row, n in enumerate([9, 5, 2]):  # the same review alone, unpadded: the same weights
        alone = attention_weights(model, ids[row : row + 1, :n])
        torch.testing.assert_close(weights[row : row + 1, :, :n, :n], alone, atol=1e-6, rtol=1e-5)


def test_generator_weights_are_causal():
    torch.manual_seed(0)
    model = GTransformer(16, 2, 2, 10, 20).eval()
    ids = torch.randint(0, 20, (2, 10))
    weights = attention_weights(model, ids, layer=1)
    assert weights.shape == (2, 2, 10, 10)
    assert weights.triu(diagonal=1).abs().max() == 0  # no query looks into the future
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2, 10))


def test_cross_attention_of_an_encoder_decoder():
    torch.manual_seed(0)
    model = Seq2SeqTransformer(16, 2, 1, 12, 20, 25).eval()
    src, tgt = torch.randint(1, 20, (2, 7)), torch.randint(1, 25, (2, 4))
    src_mask = torch.arange(7) < torch.tensor([7, 3])[:, None]
    weights = capture_attention(model, model.decoder.blocks[-1].cross_attention, src, tgt, src_mask)
    assert weights.shape == (2, 2, 4, 7)  # (b, h, t, u): every target position over the source
    assert weights[1, :, :, 3:].abs().max() == 0
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2, 4))


def test_bad_arguments():
    model = classifier(prenorm=False)
    ids, mask = batch()
    with pytest.raises(ValueError, match="layer"):
        attention_weights(model, ids, mask, layer=2)
    with pytest.raises(TypeError, match="self_attention_layers.*CTransformer and GTransformer"):
        attention_weights(torch.nn.Linear(2, 2), ids)
    with pytest.raises(TypeError, match="SelfAttention or CrossAttention"):
        capture_attention(model, model.encoder.blocks[0], ids, mask)
    with pytest.raises(ValueError, match="called exactly once"):
        capture_attention(model, CTransformer(16, 4, 1, 12, 30, 2).encoder.blocks[0].attention, ids, mask)


def test_plot_attention_writes_a_png_of_any_shape(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "deep" / "cross.png"
    weights = torch.rand(3, 5)  # (t, u): not square, as for cross-attention
    assert plot_attention(weights, x_labels=list("abcde"), y_labels=["x", "y", "z"], path=path, title="t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="x_labels 5"):
        plot_attention(weights, x_labels=list("abc"), y_labels=list("xyz"), path=path)
    with pytest.raises(ValueError, match="2-D"):
        plot_attention(torch.rand(1, 3, 5), x_labels=list("abcde"), y_labels=list("xyz"), path=path)


def test_plot_attention_without_matplotlib_returns_false(tmp_path, monkeypatch):
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)  # makes `import name` raise ImportError
    path = tmp_path / "a.png"
    assert plot_attention(torch.rand(2, 2), x_labels=["a", "b"], y_labels=["a", "b"], path=path) is False
    assert not path.exists()


# ---------------------------------------------------------------------------------------------------------
# Hostile inputs: each error names the argument, what was expected and what was received


def test_a_generators_padding_mask_keeps_its_attention_off_the_padding():
    torch.manual_seed(0)
    model = GTransformer(16, 2, 2, 10, 20).eval()
    ids = torch.randint(0, 20, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 4:] = False  # row 1: two padding tokens at the end
    weights = attention_weights(model, ids, mask)  # (b, h, t, t)
    assert weights[1, :, :, 4:].abs().max() == 0 and weights[0, :, 5, 5].abs().min() > 0
    torch.testing.assert_close(weights[1, :, :4].sum(-1), torch.ones(2, 4))  # the real queries' rows sum to 1
    behind = attention_weights(torch.compile(model, backend="eager"), ids, mask)  # also behind the wrapper
    torch.testing.assert_close(behind, weights)

    class NoMask(nn.Module):  # a model whose forward takes no mask: passing one is named
        def __init__(self):
            super().__init__()
            self.inner = model

        def self_attention_layers(self):
            return self.inner.self_attention_layers()

        def forward(self, ids):
            return self.inner(ids)

    with pytest.raises(TypeError, match=r"mask must be None for a NoMask: its forward\(\) takes no padding "
                                        r"mask, got a Tensor; call attention_weights\(model, ids\)"):
        attention_weights(NoMask(), ids, mask)
    assert attention_weights(model, ids, layer=np.int64(0)).shape == (2, 2, 6, 6)  # a NumPy int
    with pytest.raises(TypeError, match="model must be a torch.nn.Module .*got str"):
        capture_attention("model", model.blocks.blocks[0].attention, ids)


def test_plot_attention_writes_exactly_at_path_or_refuses_it(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "plots"
    folder.mkdir()
    weights, labels = torch.rand(3, 4), dict(x_labels=list("abcd"), y_labels=list("xyz"))
    for path, message in [(folder, "path must name a file, got the existing folder"),
                          ("", "path must name a file, got an empty path"),
                          (tmp_path / "attention", "path must name a .png file"),  # matplotlib would add .png
                          (tmp_path / "attention.jpg", "path must name a .png file")]:
        with pytest.raises(ValueError, match=message):
            plot_attention(weights, **labels, path=path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plots"]  # no plots.png, no .png, no attention.png
    with pytest.raises(TypeError, match="path must be a str or os.PathLike naming a file, got NoneType"):
        plot_attention(weights, **labels, path=None)
    with pytest.raises(TypeError, match="x_labels must be a sequence of labels, got NoneType"):
        plot_attention(weights, x_labels=None, y_labels=list("xyz"), path=folder / "a.png")
    with pytest.raises(ValueError, match=r"at least one row and one column, got shape \(0, 4\)"):
        plot_attention(torch.rand(0, 4), x_labels=list("abcd"), y_labels=[], path=folder / "a.png")
    with pytest.raises(TypeError, match="weights must hold real numbers, got dtype torch.complex64"):
        plot_attention(weights.to(torch.complex64), **labels, path=folder / "a.png")
    assert plot_attention(weights, x_labels=iter("abcd"), y_labels="xyz", path=folder / "A.PNG")  # any iterable
    assert (folder / "A.PNG").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
