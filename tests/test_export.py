"""Tests for torchformer.saving's exported folders (and torchformer.load_model reading them): exported folders are checked for damage, and models keep their dtype."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from torchformer import GTransformer, export_model, load_model
from torchformer.saving import load_exported
from torchformer.train.checkpoint import CheckpointError, save_checkpoint


def model(**options) -> GTransformer:
    torch.manual_seed(0)
    return GTransformer(16, 2, 2, 10, 20, **options).eval()


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]) for k in sa)


def test_config_records_the_sha256_of_the_weights(tmp_path):
    pytest.importorskip("safetensors")
    folder = export_model(model(), tmp_path / "export")
    recorded = json.loads((folder / "config.json").read_text())["weights_sha256"]
    assert recorded == hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()


def test_one_flipped_byte_in_the_weights_is_named(tmp_path):
    pytest.importorskip("safetensors")
    folder = export_model(model(), tmp_path / "export")
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) - 5] ^= 0x01  # in the last weight: the header still reads, the file still loads without the check
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"{weights} is damaged: it is not the file export_model wrote"):
        load_model(folder)
    assert issubclass(CheckpointError, ValueError)


def test_an_edited_architecture_in_config_json_is_refused(tmp_path):
    """heads 2 -> 4 leaves every weight shape as it was: the weights would load into another model, silently."""
    pytest.importorskip("safetensors")
    source = model()
    folder = export_model(source, tmp_path / "export")
    description = json.loads((folder / "config.json").read_text())
    description["config"]["heads"] = 4
    (folder / "config.json").write_text(json.dumps(description))
    with pytest.raises(ValueError, match=r"config\.json was changed after export_model wrote it: its model_class or "
                                         r"config no longer matches its config_sha256"):
        load_model(folder)
    del description["config_sha256"]  # a change on purpose, as the message says
    (folder / "config.json").write_text(json.dumps(description))
    assert load_model(folder).config.heads == 4


def test_a_folder_exported_without_the_digest_still_loads(tmp_path):
    pytest.importorskip("safetensors")
    source = model()
    folder = export_model(source, tmp_path / "export")
    description = json.loads((folder / "config.json").read_text())
    del description["weights_sha256"]  # as torchformer wrote it before recording the digest
    (folder / "config.json").write_text(json.dumps(description))
    assert same_weights(load_model(folder), source)
    description["weights_sha256"] = 5
    (folder / "config.json").write_text(json.dumps(description))
    with pytest.raises(ValueError, match="config.json has a weights_sha256 that is not a SHA-256 digest"):
        load_model(folder)


def test_a_weights_file_that_is_no_safetensors_file_is_named(tmp_path):
    pytest.importorskip("safetensors")
    folder = export_model(model(), tmp_path / "export")
    description = json.loads((folder / "config.json").read_text())
    del description["weights_sha256"]
    (folder / "config.json").write_text(json.dumps(description))
    (folder / "model.safetensors").write_bytes(b"\xff" * 100)
    with pytest.raises(CheckpointError, match="model.safetensors is not a readable safetensors file"):
        load_model(folder)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("how", ["export", "checkpoint"])
def test_the_model_comes_back_in_its_dtype(dtype, how, tmp_path):
    if how == "export":
        pytest.importorskip("safetensors")
    source = model(tie_weights=True).to(dtype)
    path = export_model(source, tmp_path / "e") if how == "export" else save_checkpoint(tmp_path / "c.pt",
                                                                                          model=source, step=0)
    loaded = load_model(path)
    assert {p.dtype for p in loaded.parameters()} == {dtype}
    assert same_weights(loaded, source)  # float64 weights exactly, not rounded through float32
    assert loaded.head.toprobs.weight is loaded.embedding.tokens.weight  # still tied


def test_parts_in_different_dtypes_keep_theirs(tmp_path):
    pytest.importorskip("safetensors")
    source = model()
    source.head.half()
    loaded = load_model(export_model(source, tmp_path / "e"))
    assert loaded.head.toprobs.weight.dtype == torch.float16 and loaded.embedding.tokens.weight.dtype == torch.float32
    assert same_weights(loaded, source)


def test_paths_that_name_no_folder_are_refused(tmp_path, monkeypatch):
    pytest.importorskip("safetensors")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="directory must not be empty"):
        export_model(model(), "")
    assert list(tmp_path.iterdir()) == []  # nothing written into the current folder
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(NotADirectoryError, match="directory must be a folder .*got the file"):
        export_model(model(), tmp_path / "a_file")
    with pytest.raises(NotADirectoryError, match="a_file is a file, not a folder"):
        export_model(model(), tmp_path / "a_file" / "export")
    with pytest.raises(TypeError, match="directory must be a str or os.PathLike, got NoneType"):
        export_model(model(), None)
    with pytest.raises(ValueError, match="path must not be empty"):
        load_model("")
    with pytest.raises(TypeError, match="path must be a str or os.PathLike, got int"):
        load_model(3)
    with pytest.raises(ValueError, match="map_location must be a device that can run a model, got 'meta'"):
        load_model(export_model(model(), tmp_path / "e"), map_location="meta")


def test_a_missing_path_or_one_file_of_a_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint file or exported folder at .*missing"):
        load_model(tmp_path / "missing")
    folder = export_model(model(), tmp_path / "export")
    for name in ("model.safetensors", "config.json"):
        with pytest.raises(ValueError, match=r"is one file of a folder written by export_model; pass the folder"):
            load_model(folder / name)


def test_the_core_loader_and_load_model_agree(tmp_path):
    source = model()
    folder = export_model(source, tmp_path / "export")
    a, b = load_exported(folder), load_model(folder)
    assert type(a) is type(b) is GTransformer and same_weights(a, source) and same_weights(b, source)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("kind", ["checkpoint", "folder", "huggingface"])
def test_weights_holding_nan_or_infinity_are_refused_by_name_unless_asked(tmp_path, kind, bad):
    from torchformer import from_huggingface, to_huggingface

    if kind != "checkpoint":
        pytest.importorskip("safetensors")
    broken = model(prenorm=True, qkv_bias=True, activation="gelu_tanh", tie_weights=True, head_bias=False)  # GPT-2
    with torch.no_grad():
        broken.blocks.blocks[1].ff.net[0].weight[3, 5] = bad
        broken.blocks.blocks[1].ff.net[0].weight[4, 5] = bad
    if kind == "checkpoint":
        path, load = save_checkpoint(tmp_path / "c.pt", model=broken, step=1), load_model
    elif kind == "folder":
        path, load = export_model(broken, tmp_path / "e"), load_model
    else:
        path, load = to_huggingface(broken, tmp_path / "hf"), from_huggingface
    # Named as the file names it (GPT-2's Conv1D weight for a Hugging Face folder), and how many of its values.
    name = r"transformer\.h\.1\.mlp\.c_fc\.weight" if kind == "huggingface" else r"blocks\.blocks\.1\.ff\.net\.0\.weight"
    with pytest.raises(ValueError, match=rf"the weights hold NaN or infinite values, in 1 tensor\(s\): {name} "
                                         r"\(2 of 1,024\)\. The file is broken .*pass check_finite=False"):
        load(path)
    loaded = load(path, check_finite=False)  # to inspect it, say
    assert not torch.isfinite(loaded.blocks.blocks[1].ff.net[0].weight).all()
    with pytest.raises(TypeError, match="check_finite must be a bool"):
        load(path, check_finite="no")


def test_a_tied_weight_is_named_once_and_a_conversion_that_overflows_is_not_blamed_on_the_file(tmp_path):
    from torchformer import from_huggingface, to_huggingface

    pytest.importorskip("safetensors")
    tied = model(prenorm=True, qkv_bias=True, activation="gelu_tanh", tie_weights=True, head_bias=False)
    with torch.no_grad():
        tied.embedding.tokens.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"in 1 tensor\(s\): embedding\.tokens\.weight \(1 of 320\)\."):
        load_model(save_checkpoint(tmp_path / "c.pt", model=tied, step=1))
    large = model(prenorm=True, qkv_bias=True, activation="gelu_tanh", tie_weights=True, head_bias=False)
    with torch.no_grad():
        large.blocks.blocks[0].ff.net[0].weight[0, 0] = 1e6  # finite in float32, beyond float16's 65504
    folder = to_huggingface(large, tmp_path / "hf")
    assert from_huggingface(folder) is not None
    with pytest.raises(ValueError, match=r"blocks\.blocks\.0\.ff\.net\.0\.weight \(1 of 1,024\)\. The file's "
                                         r"values are finite, but some are beyond the range of dtype=torch\.float16"):
        from_huggingface(folder, dtype=torch.float16)
