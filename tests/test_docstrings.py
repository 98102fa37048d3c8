"""Every public name has a docstring, and the API reference of the documentation site covers every public name.

The public names are listed by ``docs/public_api.py``, which the site's build (``docs/mkdocs_hooks.py``) uses too:
every name of ``torchformer.__all__`` and ``torchformer.data.__all__``, and the classes, functions and public
methods defined by every non-private module. ``mkdocs build --strict`` fails on the same missing docstrings; this
test says so without MkDocs installed.
"""

import importlib
import importlib.util
import inspect
import pathlib
import re

import pytest
import torch

import torchformer
import torchformer.data

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
spec = importlib.util.spec_from_file_location("public_api", DOCS / "public_api.py")
public_api = importlib.util.module_from_spec(spec)
spec.loader.exec_module(public_api)


def test_every_public_name_has_a_docstring():
    assert public_api.missing_docstrings() == []


def test_the_public_names_include_every_module_and_the_exported_names():
    paths = {path for path, _ in public_api.public_objects()}
    assert "torchformer.nn.attention.SelfAttention" in paths
    assert "torchformer.nn.attention.MultiHeadAttention.from_config" in paths  # a classmethod
    assert "torchformer.train.distributed.wrap_model" in paths
    assert not any(part.startswith("_") for path in paths for part in path.split("."))  # no private name
    modules = public_api.modules()
    assert "torchformer.nn.norms" in modules and "torchformer._checks" not in modules


@pytest.mark.parametrize("package", [torchformer, torchformer.data], ids=lambda p: p.__name__)
def test_every_exported_name_has_a_page_in_the_api_reference(package):
    # The site documents each name on the page of the module that defines it: that module must have a page and
    # list the name.
    for name in package.__all__:
        value = getattr(package, name)
        if inspect.ismodule(value):
            continue
        assert value.__module__ in public_api.modules(), f"{name}: defined in {value.__module__}, which has no page"
        assert name in public_api.defined_names(value.__module__), f"{name} is not on {value.__module__}'s page"


def test_a_name_without_a_docstring_is_reported(monkeypatch):
    # The check itself: remove one docstring and it is named.
    from torchformer.nn.norms import RMSNorm

    monkeypatch.setattr(RMSNorm, "__doc__", None)
    assert public_api.missing_docstrings() == ["torchformer.RMSNorm", "torchformer.nn.norms.RMSNorm"]


# The house style of a docstring (docs/index.md, "Shapes and docstrings"): a one-line summary, prose, then the
# sections. ``Args:`` names every argument (a class: its constructor's), one per entry; a module has ``Shapes:``
# (what ``forward`` takes and returns, in the letters b, t, u, e, h, s, ...); a function that returns something has
# ``Returns:``. Checked for the exported names (``torchformer.__all__``, ``torchformer.data.__all__``).
SECTION = re.compile(r"^(\w[\w ]*):\n((?:(?: {4}.*)?\n)+)", re.M)
ENTRY = re.compile(r"^ {4}(\*{0,2}\w+)(?: \([^)]*\))?:", re.M)


def sections(doc: str) -> dict[str, str]:
    return {title: body for title, body in SECTION.findall(inspect.cleandoc(doc) + "\n")}


def arguments(value) -> list[str]:
    if inspect.isclass(value) and value.__init__ is object.__init__:
        return []  # a class that takes no arguments
    function = value.__init__ if inspect.isclass(value) else value
    names = []
    for parameter in inspect.signature(function).parameters.values():
        if parameter.name == "self":
            continue
        star = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}.get(parameter.kind, "")
        names.append(star + parameter.name)
    return names


EXPORTED = [(torchformer, name) for name in torchformer.__all__] + [
    (torchformer.data, name) for name in torchformer.data.__all__
]


@pytest.mark.parametrize("package, name", EXPORTED, ids=[f"{p.__name__}.{n}" for p, n in EXPORTED])
def test_exported_docstrings_have_args_and_shapes_or_returns(package, name):
    value = getattr(package, name)
    found = sections(value.__doc__)
    expected = arguments(value)
    if expected:
        assert "Args" in found, f"{name}: no Args: section"
        documented = ENTRY.findall(found["Args"])
        assert sorted(documented) == sorted(expected), f"{name}: Args: lists {documented}, the signature {expected}"
    if inspect.isclass(value) and issubclass(value, torch.nn.Module):
        assert "Shapes" in found, f"{name}: a module without a Shapes: section"
    if inspect.isfunction(inspect.unwrap(value)) and inspect.signature(value).return_annotation not in (None, "None"):
        assert "Returns" in found, f"{name}: a function without a Returns: section"
