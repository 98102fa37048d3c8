"""The package's modules depend on each other in a readable shape: nothing private crosses, no cycles, a core that
stands alone.

Read from the source with ``ast`` (nothing is imported), every ``import`` and ``from ... import`` statement at any
depth, those inside functions included, relative imports resolved:

1. No module imports a private name (a leading underscore) from another torchformer module: a helper that two files
   share is public, in a module both can import (``torchformer/_files.py`` is a private *module* with public names).
2. No import cycle among the modules, counting the imports that run when a module is imported (module level; an
   import inside a function, or under ``if TYPE_CHECKING:``, runs later or never).
3. The core (``torchformer.config``, ``torchformer.nn``, ``torchformer.decoding``, ``torchformer.models``,
   ``torchformer.saving``, ``torchformer.pretrained``) imports nothing from ``torchformer.train`` or
   ``torchformer.data``, at any depth: a model needs no training code. And at run time (one test imports, in a fresh process): ``import torchformer`` loads no
   training or data module until one is used.
4. Inside the core, ``torchformer.nn`` imports nothing from ``torchformer.decoding`` and ``torchformer.decoding``
   nothing from ``torchformer.models``, at any depth: the KV cache is part of attention's contract
   (``torchformer.nn.cache``), and decoding drives any model with the generation protocol, so it sits below the
   models, whose ``generate`` methods call it (as transformers' models inherit their generation).
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys
from dataclasses import dataclass
from typing import Iterator

import torchformer

PACKAGE = "torchformer"
ROOT = pathlib.Path(torchformer.__file__).resolve().parent
CORE = ("torchformer.config", "torchformer.nn", "torchformer.decoding", "torchformer.models", "torchformer.saving",
        "torchformer.pretrained")
OUTSIDE_CORE = ("torchformer.train", "torchformer.data")


@dataclass(frozen=True)
class Import:
    """One imported module (and, for ``from m import n``, the name ``n``) as a statement in ``importer`` says it."""

    importer: str
    module: str
    name: str | None
    line: int
    at_import_time: bool  # module level, not under ``if TYPE_CHECKING:``


def module_names() -> dict[str, pathlib.Path]:
    """Every module of the package, by dotted name (a package by its ``__init__.py``)."""
    modules = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join([PACKAGE, *parts])] = path
    return modules


MODULES = module_names()


def is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def resolve(importer: str, node: ast.ImportFrom) -> str:
    """The absolute module a ``from`` statement names (``from .x import y`` in ``a.b.c``: ``a.b.x``)."""
    if node.level == 0:
        return node.module or ""
    base = importer.split(".")
    base = base[: len(base) - node.level + (1 if is_package(importer) else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def statements(tree: ast.AST, at_import_time: bool = True) -> Iterator[tuple[ast.stmt, bool]]:
    """Every import statement under ``tree``, and whether it runs when the module is imported."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, at_import_time
        deferred = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) or (
            isinstance(node, ast.If) and is_type_checking(node))
        # A class body runs at import time, a function body only when called.
        yield from statements(node, at_import_time and not deferred)


def imports(importer: str) -> Iterator[Import]:
    """The torchformer modules (and names) that module ``importer`` imports."""
    tree = ast.parse(MODULES[importer].read_text(encoding="utf-8"), filename=str(MODULES[importer]))
    for node, now in statements(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(importer, alias.name, None, node.lineno, now)
            continue
        module = resolve(importer, node)
        for alias in node.names:
            yield Import(importer, module, alias.name, node.lineno, now)


def torchformer_imports() -> list[Import]:
    return [i for m in MODULES for i in imports(m) if i.module.split(".")[0] == PACKAGE]


def targets(i: Import) -> list[str]:
    """The modules an import depends on: the named module, and ``m.n`` too when ``from m import n`` is a module."""
    found = [i.module] if i.module in MODULES else []
    if i.name is not None and f"{i.module}.{i.name}" in MODULES:
        found.append(f"{i.module}.{i.name}")
    return found


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))  # __version__ is public


def private_names() -> list[str]:
    """``importer:line: from module import _name`` for every private name crossing modules."""
    return [f"{i.importer}:{i.line}: from {i.module} import {i.name}" for i in torchformer_imports()
            if i.name is not None and is_private(i.name) and f"{i.module}.{i.name}" not in MODULES
            and i.module != i.importer]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (or a module importing itself): the cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm; the package is small enough for recursion
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def import_time_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for i in torchformer_imports():
        if i.at_import_time:
            graph[i.importer].update(t for t in targets(i) if t != i.importer)
    return graph


def in_any(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def leaks(importers: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    """``importer:line -> module`` for every import, at any depth, from a module of ``importers`` into ``forbidden``."""
    found = []
    for i in torchformer_imports():
        for target in targets(i) or [i.module]:
            if in_any(i.importer, importers) and in_any(target, forbidden):
                found.append(f"{i.importer}:{i.line} -> {target}")
    return found


def core_leaks() -> list[str]:
    """``importer:line -> module`` for every import of the core that reaches outside it."""
    return leaks(CORE, OUTSIDE_CORE)


def test_the_walk_sees_the_package_and_its_nested_imports():
    # The checks below are only as good as the walk: it must find the modules, resolve names, and see imports
    # inside functions and under TYPE_CHECKING, as well as those at module level.
    assert {"torchformer", "torchformer.models", "torchformer.nn.attention", "torchformer.train.loading"} <= set(MODULES)
    found = {(i.importer, i.module, i.at_import_time) for i in torchformer_imports()}
    assert ("torchformer.scripts.cli", "torchformer.train.checkpoint", False) in found  # inside a function
    assert ("torchformer.nn.attention", "torchformer.nn.cache", True) in found
    assert ("torchformer.models", "torchformer.config", True) in found
    tree = ast.parse("import a\nif TYPE_CHECKING:\n    import b\ndef f():\n    import c\nclass K:\n    import d\n")
    assert [(node.names[0].name, now) for node, now in statements(tree)] == [
        ("a", True), ("b", False), ("c", False), ("d", True)]  # a class body runs at import time


def test_resolve_handles_relative_imports():
    node = ast.parse("from ..checkpoint import x").body[0]
    assert resolve("torchformer.train.loading", node) == "torchformer.checkpoint"
    node = ast.parse("from . import checkpoint").body[0]
    assert resolve("torchformer.train", node) == "torchformer.train"  # a package's "." is the package itself
    assert resolve("torchformer.train.loading", node) == "torchformer.train"


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_private_name_crosses_modules():
    assert private_names() == []


def test_no_import_cycle_at_import_time():
    assert cycles(import_time_graph()) == []


def test_the_core_imports_nothing_from_train_or_data():
    assert core_leaks() == []


def test_importing_the_core_loads_no_experiment_code():
    # The import statements are one thing, what runs another: the package's __init__ imports the core only, and
    # torchformer.load_model, bits_per_byte and data on first use.
    code = ("import sys, torchformer, torchformer.models, torchformer.saving; "
            "print(sorted(m for m in sys.modules if m.startswith(('torchformer.train', 'torchformer.data', "
            "'torchformer.scripts'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    code = "import torchformer; print(torchformer.load_model.__module__, torchformer.data.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["torchformer.train.loading", "torchformer.data"]


def test_the_leak_finder_finds_a_nested_import():
    # torchformer.scripts.cli imports the checkpoint module inside a function: found, though it runs only when called.
    assert any(leak.startswith("torchformer.scripts.cli:") and leak.endswith("-> torchformer.train.checkpoint")
               for leak in leaks(("torchformer.scripts.cli",), ("torchformer.train",)))


def test_decoding_imports_nothing_from_the_models():
    # Decoding drives any model with the generation protocol (a config, new_caches, forward with caches): it needs
    # no model class, so the models' generate methods can call it without a cycle.
    assert leaks(("torchformer.decoding",), ("torchformer.models", "torchformer.families",
                                             "torchformer.pretrained")) == []


def test_nn_imports_nothing_from_decoding():
    # The KV cache is part of attention's contract and lives beside it (torchformer.nn.cache); decoding only drives
    # it, so the modules need no decoding code, not even for a type hint.
    assert leaks(("torchformer.nn",), ("torchformer.decoding",)) == []
