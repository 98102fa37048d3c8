"""Checkpoints carry the model's config: mismatches are refused by name, and a model is rebuilt from its file alone.

Covers ``save_checkpoint``/``load_checkpoint`` with a :class:`TransformerModel`, ``read_checkpoint``, ``load_model``
(``model_class=``) and ``export_model`` (safetensors + config.json).
"""

from __future__ import annotations

import json
import random
import sys

import pytest
import torch
from torch import nn

import torchformer
from torchformer import CTransformer, GTransformer, Seq2SeqTransformer, TransformerModel
from torchformer.train.checkpoint import CheckpointError, load_checkpoint, read_checkpoint, save_checkpoint
from torchformer import export_model, load_model

KINDS = ("CTransformer", "GTransformer", "Seq2SeqTransformer")


class MyGPT(GTransformer):
    """A user's subclass: torchformer does not know its name."""


class Wrapper(nn.Module):
    """Stands in for what torch.compile returns: the real model as ``_orig_mod``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self._orig_mod = model


def make(kind: str, cls: type[TransformerModel] | None = None, **options) -> TransformerModel:
    """A tiny model of ``kind`` whose weights are not those of a fresh initialisation."""
    vocabulary = {
        "CTransformer": dict(num_tokens=11, num_classes=3),
        "GTransformer": dict(num_tokens=11),
        "Seq2SeqTransformer": dict(src_tokens=11, tgt_tokens=13),
    }[kind]
    arguments = dict(emb=16, heads=2, depth=1, seq_length=8, **vocabulary)
    model = (cls or torchformer.models.MODEL_CLASSES[kind])(**{**arguments, **options})
    with torch.no_grad():  # as if trained: a freshly built model cannot match these weights by chance
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    return model.eval()


def outputs(model: nn.Module) -> torch.Tensor:
    """The model's output on a fixed batch (source and target ids for the encoder-decoder)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 11, (2, 8), generator=g)
    with torch.no_grad():
        if isinstance(model, Seq2SeqTransformer):
            return model(x, torch.randint(0, 13, (2, 6), generator=g))
        return model(x)


def parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


# ---------------------------------------------------------------------------------------------------------
# The config in a checkpoint


def test_checkpoint_stores_class_and_config_as_plain_data(tmp_path):
    model = make("GTransformer", dropout=0.1)
    path = save_checkpoint(tmp_path / "c.pt", model=Wrapper(model), step=4, extra={"note": "x"})
    raw = torch.load(path, weights_only=True)  # plain data: weights_only loading reads it
    assert raw["model_class"] == "GTransformer" and raw["config"] == model.config.to_dict()
    info = read_checkpoint(path)
    assert info == {"step": 4, "extra": {"note": "x"}, "config": model.config, "model_class": "GTransformer",
                    "model_class_path": "torchformer.models:GTransformer"}


def test_other_heads_are_refused_naming_both_values_and_nothing_changes(tmp_path):
    path = save_checkpoint(tmp_path / "step_00000010.pt", model=make("GTransformer"), step=10)
    target = make("GTransformer", heads=4)
    # Narrow heads split emb=16 either way: every weight has the same shape, so only the config can tell.
    saved_shapes = {k: v.shape for k, v in torch.load(path, weights_only=True)["model"].items()}
    assert saved_shapes == {k: v.shape for k, v in target.state_dict().items()}
    before = parameters(target)
    with pytest.raises(ValueError) as error:
        load_checkpoint(path, model=target)
    message = str(error.value)
    assert str(path) in message and "another architecture" in message
    assert "heads: 2 (checkpoint) vs 4 (model)" in message
    after = parameters(target)
    assert all(torch.equal(before[name], after[name]) for name in before)


def test_every_differing_field_is_named(tmp_path):
    path = save_checkpoint(tmp_path / "c.pt", model=make("GTransformer", activation="gelu"), step=0)
    with pytest.raises(ValueError) as error:
        load_checkpoint(path, model=make("GTransformer", heads=4, activation="relu"))
    message = str(error.value)
    assert "activation: 'gelu' (checkpoint) vs 'relu' (model)" in message
    assert "heads: 2 (checkpoint) vs 4 (model)" in message
    assert "emb:" not in message  # fields that agree are not listed


def test_dropout_and_attention_path_do_not_block_loading(tmp_path):
    source = make("GTransformer", dropout=0.3)
    path = save_checkpoint(tmp_path / "c.pt", model=source, step=0)
    same_path = make("GTransformer", dropout=0.0)
    load_checkpoint(path, model=same_path)
    assert torch.equal(outputs(same_path), outputs(source))
    reference = make("GTransformer", dropout=0.0, impl="reference")  # another kernel: equal up to rounding
    load_checkpoint(path, model=reference)
    torch.testing.assert_close(outputs(reference), outputs(source), atol=1e-5, rtol=1e-5)


def test_a_plain_module_saves_and_loads_as_before(tmp_path):
    source = nn.Linear(3, 2)
    path = save_checkpoint(tmp_path / "c.pt", model=source, step=2)
    assert not {"config", "model_class"} & set(torch.load(path, weights_only=True))
    assert read_checkpoint(path) == {"step": 2, "extra": {}, "config": None, "model_class": None,
                                     "model_class_path": None}
    target = nn.Linear(3, 2)
    assert load_checkpoint(path, model=target) == {"step": 2, "extra": {}}
    assert torch.equal(target.weight, source.weight) and torch.equal(target.bias, source.bias)
    with pytest.raises(ValueError, match="holds no model config.*load_checkpoint"):
        load_model(path)
    # Other programs' checkpoints may have a "config" of their own (nanoGPT's do): it is not taken for ours.
    torch.save({"model": source.state_dict(), "config": {"n_layer": 12}}, tmp_path / "theirs.pt")
    assert read_checkpoint(tmp_path / "theirs.pt")["config"] is None
    load_checkpoint(tmp_path / "theirs.pt", model=target)


# ---------------------------------------------------------------------------------------------------------
# Rebuilding a model from its checkpoint


@pytest.mark.parametrize("kind", KINDS)
def test_load_model_rebuilds_the_model_exactly(kind, tmp_path):
    source = make(kind, dropout=0.2, prenorm=True)  # dropout: the rebuilt model must be in eval mode
    path = save_checkpoint(tmp_path / "c.pt", model=source, step=7)
    expected = outputs(source)
    cls = torchformer.models.MODEL_CLASSES[kind]
    for model in (torchformer.load_model(path), load_model(path, model_class=cls)):
        assert type(model) is cls and model.config == source.config and not model.training
        assert torch.equal(outputs(model), expected)


def test_tied_weights_stay_tied_after_loading_a_checkpoint(tmp_path):
    source = make("GTransformer", tie_weights=True)
    path = save_checkpoint(tmp_path / "c.pt", model=source, step=0)
    model = load_model(path)
    assert model.head.toprobs.weight is model.embedding.tokens.weight
    assert torch.equal(outputs(model), outputs(source))


def test_load_model_leaves_the_global_random_numbers_alone(tmp_path):
    path = save_checkpoint(tmp_path / "c.pt", model=make("GTransformer"), step=0)
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    load_model(path)  # building the model draws initial weights; they must not come from the caller's stream
    assert torch.equal(torch.rand(4), expected)


def test_user_subclasses_load_by_their_import_path_or_when_named(tmp_path):
    path = save_checkpoint(tmp_path / "c.pt", model=make("GTransformer", cls=MyGPT), step=0)
    assert read_checkpoint(path)["model_class"] == "MyGPT"
    assert read_checkpoint(path)["model_class_path"] == f"{__name__}:MyGPT"
    for model in (load_model(path), load_model(path, classes={"MyGPT": MyGPT}), load_model(path, model_class=MyGPT),
                  load_model(path, model_class=TransformerModel)):
        assert type(model) is MyGPT

    class Local(GTransformer):  # defined in a function: no import path reaches it
        pass

    local = save_checkpoint(tmp_path / "l.pt", model=make("GTransformer", cls=Local), step=0)
    with pytest.raises(ValueError, match=r"holds a Local, defined at .*<locals>\.Local, which is not a torchformer "
                                         r"model class of that name there .*classes=\{'Local': Local\}"):
        load_model(local)
    assert type(load_model(local, classes={"Local": Local})) is Local
    # A subclass of the saved class is fine; an unrelated class is not.
    gpt_path = save_checkpoint(tmp_path / "g.pt", model=make("GTransformer"), step=0)
    assert type(load_model(gpt_path, model_class=MyGPT)) is MyGPT
    assert type(load_model(gpt_path, model_class=TransformerModel)) is GTransformer  # the base class: whatever was saved
    with pytest.raises(ValueError, match="holds a GTransformer, and a CTransformer was asked for: a CTransformer cannot be built from it"):
        load_model(gpt_path, model_class=CTransformer)
    with pytest.raises(TypeError, match="model_class must be a TransformerModel subclass"):
        load_model(gpt_path, model_class=nn.Linear)
    with pytest.raises(TypeError, match=r"classes\['x'\] must be a TransformerModel subclass"):
        load_model(gpt_path, classes={"x": 3})


def test_a_variant_s_checkpoint_is_not_loaded_as_its_base_class(tmp_path):
    # MyGPT's weights fit a plain GTransformer exactly, but a variant computes something else (e.g. an attend
    # override with no parameters of its own): the class must match, not only the shapes.
    path = save_checkpoint(tmp_path / "v.pt", model=make("GTransformer", cls=MyGPT), step=0)
    for load in (lambda: load_model(path, model_class=GTransformer),
                 lambda: load_checkpoint(path, model=make("GTransformer"))):
        with pytest.raises(ValueError, match="holds a MyGPT.*GTransformer"):
            load()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_an_unavailable_device_is_a_clear_error(tmp_path):
    path = save_checkpoint(tmp_path / "c.pt", model=make("GTransformer"), step=0)
    with pytest.raises(ValueError, match="map_location.*CUDA is not available"):
        load_model(path, map_location="cuda")


@pytest.mark.parametrize("content", ["missing", "empty", "random bytes", "truncated", "foreign pickle"])
def test_a_file_that_is_no_checkpoint_is_one_clear_error(content, tmp_path):
    path = tmp_path / "model.pt"
    if content == "empty":
        path.write_bytes(b"")
    elif content == "random bytes":
        path.write_bytes(random.Random(0).randbytes(2000))
    elif content == "truncated":
        whole = save_checkpoint(tmp_path / "whole.pt", model=make("GTransformer"), step=0).read_bytes()
        path.write_bytes(whole[: len(whole) // 2])
    elif content == "foreign pickle":
        torch.save({"model": Wrapper(nn.Linear(2, 2))}, path)  # a pickled module: weights_only refuses it
    expected = FileNotFoundError if content == "missing" else CheckpointError  # a ValueError
    for read in (read_checkpoint, load_model, lambda p: load_checkpoint(p, model=make("GTransformer"))):
        with pytest.raises(expected) as error:
            read(path)
        assert type(error.value) is expected and str(path) in str(error.value)


# ---------------------------------------------------------------------------------------------------------
# Export as safetensors + config.json


@pytest.mark.parametrize("kind", KINDS)
def test_export_and_load_round_trip(kind, tmp_path):
    pytest.importorskip("safetensors")
    source = make(kind)
    folder = export_model(Wrapper(source), tmp_path / "export")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]  # no temporary files
    description = json.loads((folder / "config.json").read_text())
    assert description["model_class"] == kind and description["config"] == source.config.to_dict()
    assert description["torchformer_version"] == torchformer.__version__
    model = load_model(folder)
    assert type(model) is type(source) and not model.training
    assert torch.equal(outputs(model), outputs(source))


def test_tied_weights_survive_export(tmp_path):
    pytest.importorskip("safetensors")
    source = make("GTransformer", tie_weights=True)
    model = load_model(export_model(source, tmp_path / "export"), model_class=GTransformer)
    tied, embedding = model.head.toprobs.weight, model.embedding.tokens.weight
    assert tied is embedding and tied.data_ptr() == embedding.data_ptr()
    assert torch.equal(outputs(model), outputs(source))


def test_exported_folders_fail_clearly(tmp_path):
    pytest.importorskip("safetensors")
    with pytest.raises(TypeError, match="model must be a torchformer TransformerModel .*got Linear"):
        export_model(nn.Linear(2, 2), tmp_path / "linear")
    with pytest.raises(FileNotFoundError, match="holds no config.json"):
        load_model(tmp_path)
    folder = export_model(make("GTransformer"), tmp_path / "export")
    description = json.loads((folder / "config.json").read_text())
    description["config"]["emb"] = 32  # weights of emb 16 under a config of emb 32
    del description["config_sha256"]  # changed on purpose (else the edit itself is refused): the shapes still count
    (folder / "config.json").write_text(json.dumps(description))
    with pytest.raises(ValueError, match="model.safetensors do not fit the GTransformer"):
        load_model(folder)
    description["model_class"] = "Unknown"
    (folder / "config.json").write_text(json.dumps(description))
    with pytest.raises(ValueError, match="holds a Unknown, defined at torchformer.models:GTransformer, which is not a "
                                         "torchformer model class of that name there"):
        load_model(folder)
    del description["model_class_path"]  # as folders exported before 0.5 are
    (folder / "config.json").write_text(json.dumps(description))
    with pytest.raises(ValueError, match="holds a Unknown, which is not one of torchformer's model classes"):
        load_model(folder)
    description["model_class_path"] = "no_such_module_xyz:Unknown"
    (folder / "config.json").write_text(json.dumps(description))
    with pytest.raises(ValueError, match="defined in the module no_such_module_xyz, which is not imported"):
        load_model(folder)


def test_without_safetensors_folders_say_how_to_install_it_and_checkpoints_still_work(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "safetensors", None)  # makes `import safetensors` fail
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    model = make("GTransformer")
    with pytest.raises(ImportError, match=r'pip install "torchformer\[safetensors\]"'):
        export_model(model, tmp_path / "export")
    (tmp_path / "export").mkdir(exist_ok=True)
    with pytest.raises(ImportError, match=r'pip install "torchformer\[safetensors\]"'):
        load_model(tmp_path / "export")
    path = save_checkpoint(tmp_path / "c.pt", model=model, step=0)
    assert torch.equal(outputs(load_model(path)), outputs(model))


def test_map_location_places_the_model(tmp_path):
    path = save_checkpoint(tmp_path / "c.pt", model=make("GTransformer"), step=0)
    with pytest.raises(TypeError, match="map_location must be a device"):
        load_model(path, map_location={"cuda:0": "cpu"})
    if torch.cuda.is_available():
        model = load_model(path, map_location="cuda")
        assert next(model.parameters()).device.type == "cuda"


def test_load_model_never_imports_a_module_a_file_names(tmp_path, monkeypatch):
    """A folder could bring a module of its own (a downloaded model with an evil.py beside it): naming it in
    config.json must not run it. The class is looked up in modules already imported, and an edited path is
    refused by config_sha256 anyway."""
    folder = export_model(make("GTransformer", cls=MyGPT), tmp_path / "folder")
    (tmp_path / "evil.py").write_text("import builtins\nbuiltins.EVIL_RAN = True\nclass MyGPT: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    description = json.loads((folder / "config.json").read_text())
    description["model_class_path"] = "evil:MyGPT"
    (folder / "config.json").write_text(json.dumps(description))
    with pytest.raises(ValueError, match="was changed after export_model wrote it"):  # the digest covers the path
        load_model(folder)
    del description["config_sha256"]
    (folder / "config.json").write_text(json.dumps(description))
    with pytest.raises(ValueError, match="defined in the module evil, which is not imported .*never imports"):
        load_model(folder)
    import builtins
    assert not hasattr(builtins, "EVIL_RAN") and "evil" not in sys.modules


def test_a_variant_named_like_a_built_in_is_found_by_its_path(tmp_path):
    """A researcher's own class called CTransformer (in their module) is not loaded as torchformer's."""
    import types

    module = types.ModuleType("my_variants_for_test")
    variant = type("CTransformer", (CTransformer,), {"__module__": module.__name__})
    variant.__qualname__ = "CTransformer"
    module.CTransformer = variant
    sys.modules[module.__name__] = module
    try:
        model = variant(16, 2, 1, 8, 20, 3)
        loaded = load_model(export_model(model, tmp_path / "folder"))
        assert type(loaded) is variant
    finally:
        del sys.modules[module.__name__]


def test_classes_given_win_over_the_recorded_path(tmp_path):
    path = save_checkpoint(tmp_path / "c.pt", model=make("GTransformer", cls=MyGPT), step=0)

    class Replacement(MyGPT):  # e.g. the class moved: the caller names the one to use
        pass

    assert type(load_model(path, classes={"MyGPT": Replacement})) is Replacement


def test_a_class_of_a_module_run_with_python_m_is_recorded_by_its_module_name(tmp_path):
    """``python -m pkg.mod`` runs pkg/mod.py as ``__main__``: its classes are recorded as ``pkg.mod:X``, which another
    program imports, and the same kind of run finds them again in ``__main__``."""
    import subprocess

    package = tmp_path / "variants_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text(
        "import sys, torchformer\n"
        "class MyGPT(torchformer.GTransformer):\n"
        "    pass\n"
        "if __name__ == '__main__':\n"
        "    if sys.argv[1] == 'save':\n"
        "        from torchformer.train.checkpoint import save_checkpoint\n"
        "        save_checkpoint(sys.argv[2], model=MyGPT(16, 2, 1, 8, 10), step=0)\n"
        "    else:\n"
        "        print(type(torchformer.load_model(sys.argv[2])).__name__)\n")
    path = tmp_path / "c.pt"

    def run(*args: str) -> str:
        return subprocess.run([sys.executable, *args], cwd=tmp_path, capture_output=True, text=True,
                              check=True).stdout.strip()

    run("-m", "variants_pkg.mod", "save", str(path))
    assert read_checkpoint(path)["model_class_path"] == "variants_pkg.mod:MyGPT"  # not __main__:MyGPT
    assert run("-m", "variants_pkg.mod", "load", str(path)) == "MyGPT"  # found in __main__, run as that module
    code = f"import torchformer, variants_pkg.mod; print(type(torchformer.load_model({str(path)!r})).__name__)"
    assert run("-c", code) == "MyGPT"  # another program imports it by its name


# ---- the rotary layout of files written before torchformer 0.5 ------------------------------------------------


def _as_written_before_config_versions(payload: dict) -> dict:
    """A payload as torchformer 0.4 wrote it: format 2, no config_version, and "rotary" meaning adjacent pairs."""
    from torchformer.train.checkpoint import _digest

    old = {k: v for k, v in payload.items() if k not in ("integrity", "config_version")}
    old["format_version"] = 2
    old["config"] = {**old["config"], "positions": "rotary"}
    old["integrity"] = {"sha256": _digest(old)}  # intact: what 0.4 wrote verifies
    return old


@pytest.mark.parametrize("kind", KINDS)
def test_a_rotary_checkpoint_of_before_config_versions_loads_in_the_layout_it_was_trained_with(kind, tmp_path):
    """Its "rotary" paired adjacent coordinates: it comes back as "rotary_interleaved", computing what it did."""
    trained = make(kind, positions="rotary_interleaved").eval()
    save_checkpoint(tmp_path / "new.pt", model=trained, step=3)
    torch.save(_as_written_before_config_versions(torch.load(tmp_path / "new.pt", weights_only=True)),
               tmp_path / "old.pt")
    loaded = load_model(tmp_path / "old.pt")
    assert loaded.config.positions == "rotary_interleaved" and loaded.config == trained.config
    torch.testing.assert_close(outputs(loaded), outputs(trained), rtol=0, atol=0)  # the same module, same weights
    # A model built with today's "rotary" would compute something else: refused by name, nothing loaded.
    with pytest.raises(ValueError, match=r"positions: 'rotary_interleaved' \(checkpoint\) vs 'rotary' \(model\)"):
        load_checkpoint(tmp_path / "old.pt", model=make(kind, positions="rotary"))
    assert load_checkpoint(tmp_path / "old.pt", model=make(kind, positions="rotary_interleaved"))["step"] == 3


def test_a_rotary_checkpoint_of_today_keeps_its_layout_and_newer_config_versions_are_refused(tmp_path):
    model = make("GTransformer", positions="rotary")
    path = save_checkpoint(tmp_path / "a.pt", model=model, step=1)
    payload = torch.load(path, weights_only=True)
    assert payload["config_version"] == 3 and payload["format_version"] == 3
    assert load_model(path).config.positions == "rotary"
    from torchformer.train.checkpoint import _digest

    newer = {k: v for k, v in payload.items() if k != "integrity"}
    newer["config_version"] = 4
    torch.save({**newer, "integrity": {"sha256": _digest(newer)}}, tmp_path / "newer.pt")
    with pytest.raises(ValueError, match=r"config_version 4; this torchformer reads versions 1 to 3"):
        load_model(tmp_path / "newer.pt")


def test_an_exported_rotary_folder_of_before_config_versions_loads_in_its_layout(tmp_path):
    pytest.importorskip("safetensors")
    from torchformer.saving import _architecture_digest

    trained = make("GTransformer", positions="rotary_interleaved").eval()
    folder = export_model(trained, tmp_path / "old")
    data = json.loads((folder / "config.json").read_text())
    assert data["format_version"] == 2 and data["config_version"] == 3
    # What 0.4 wrote: format 1, no config_version, "rotary", and its digest of that record.
    del data["config_version"]
    data["format_version"], data["config"]["positions"] = 1, "rotary"
    data["config_sha256"] = _architecture_digest(data["model_class"], data["config"], data["model_class_path"])
    (folder / "config.json").write_text(json.dumps(data))
    loaded = load_model(folder)
    assert loaded.config.positions == "rotary_interleaved"
    x = torch.randint(0, 11, (2, 5))
    torch.testing.assert_close(loaded(x), trained(x), rtol=0, atol=0)
    # Editing the version of a folder written today would read its "rotary" in the other layout: refused.
    today = export_model(make("GTransformer", positions="rotary"), tmp_path / "today")
    data = json.loads((today / "config.json").read_text())
    data["config_version"] = 1
    (today / "config.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="was changed after export_model wrote it"):
        load_model(today)


# ---- the gated networks' width in files written before the multiple-of-16 rule ----------------------------------


def test_a_gated_network_saved_before_the_multiple_of_16_rule_loads_with_the_width_it_was_trained_with(tmp_path):
    """config_version 2 sized a gated unit round(2/3 * ff_mult * emb) = 43 at emb 16; today's default is 48. Such a
    file (no ff_hidden) loads as a model of 43, computing what it did; a model built with today's default is refused
    by name; the checkpoint and the exported folder alike."""
    from torchformer.saving import _architecture_digest
    from torchformer.train.checkpoint import _digest

    trained = make("GTransformer", activation="swiglu", ff_hidden=43)
    assert make("GTransformer", activation="swiglu").blocks.blocks[0].ff.w1.out_features == 48  # today's default
    payload = torch.load(save_checkpoint(tmp_path / "new.pt", model=trained, step=3), weights_only=True)
    old = {k: v for k, v in payload.items() if k != "integrity"}
    old["config_version"], old["config"] = 2, {**old["config"], "ff_hidden": None}  # as version 2 wrote it
    torch.save({**old, "integrity": {"sha256": _digest(old)}}, tmp_path / "old.pt")
    folder = export_model(trained, tmp_path / "folder")
    data = json.loads((folder / "config.json").read_text())
    data["config_version"], data["config"]["ff_hidden"] = 2, None
    data["config_sha256"] = _architecture_digest(data["model_class"], data["config"], data["model_class_path"], 2)
    (folder / "config.json").write_text(json.dumps(data))
    for path in (tmp_path / "old.pt", folder):
        loaded = load_model(path)
        assert loaded.config == trained.config and loaded.config.ff_hidden == 43
        torch.testing.assert_close(outputs(loaded), outputs(trained), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"ff_hidden: 43 \(checkpoint\) vs None \(model\)"):
        load_checkpoint(tmp_path / "old.pt", model=make("GTransformer", activation="swiglu"))
    # Where 2/3 * ff_mult * emb is a multiple of 16 (emb 24: 64) both rules agree: such a file fits today's default.
    same = make("GTransformer", activation="swiglu", emb=24)
    payload = torch.load(save_checkpoint(tmp_path / "same.pt", model=same, step=1), weights_only=True)
    old = {k: v for k, v in payload.items() if k != "integrity"}
    old["config_version"] = 2
    torch.save({**old, "integrity": {"sha256": _digest(old)}}, tmp_path / "same_old.pt")
    assert load_model(tmp_path / "same_old.pt").config.ff_hidden is None
    assert load_checkpoint(tmp_path / "same_old.pt", model=make("GTransformer", activation="swiglu", emb=24))
    # A plain network's width was ff_mult * emb in every version: nothing to convert.
    plain = make("GTransformer")
    payload = torch.load(save_checkpoint(tmp_path / "plain.pt", model=plain, step=1), weights_only=True)
    old = {k: v for k, v in payload.items() if k != "integrity"}
    old["config_version"] = 2
    torch.save({**old, "integrity": {"sha256": _digest(old)}}, tmp_path / "plain_old.pt")
    assert load_model(tmp_path / "plain_old.pt").config.ff_hidden is None
