"""The public names of torchformer, listed once for the site's API reference and for the docstring test.

Public means: every name in ``torchformer.__all__``, and in every non-private module of the package (``_checks``
and the like are private) the classes and functions the module defines whose names do not start with ``_``, with
the public methods those classes define. ``mkdocs_hooks.py`` builds one API page per module from this list and fails
the strict build on a name without a docstring; ``tests/test_docstrings.py`` fails on the same names.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Iterator

# Methods every torch.nn.Module, or every torch.autograd.Function, may override, which torch calls with arguments of
# its own: their contract is torch's, and the class docstring says what they do (forward's shapes included).
INHERITED_ROLES = {"forward", "extra_repr", "reset_parameters", "setup_context", "backward", "jvp", "vmap"}


def modules(package: str = "torchformer") -> list[str]:
    """The dotted names of the package's non-private modules, subpackages included, in a stable order."""
    root = importlib.import_module(package)
    names = [package]
    for info in pkgutil.walk_packages(root.__path__, prefix=package + "."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return sorted(names)


def defined_names(module_name: str) -> list[str]:
    """The public classes and functions that module ``module_name`` defines itself (not the ones it imports)."""
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None) if module_name.count(".") == 0 else None
    found = []
    for name, value in vars(module).items():
        if name.startswith("_") or not (inspect.isclass(value) or inspect.isfunction(value)):
            continue
        if getattr(value, "__module__", None) == module_name and (names is None or name in names):
            found.append(name)
    return sorted(found)


def public_objects() -> Iterator[tuple[str, object]]:
    """``(dotted path, object)`` for every public module, class, function and method, the top level's names too."""
    import torchformer

    for name in torchformer.__all__:
        yield f"torchformer.{name}", getattr(torchformer, name)
    for module_name in modules():
        module = importlib.import_module(module_name)
        yield module_name, module
        for name in defined_names(module_name):
            value = getattr(module, name)
            yield f"{module_name}.{name}", value
            if inspect.isclass(value):
                for attr, member in vars(value).items():
                    if attr.startswith("_") or attr in INHERITED_ROLES:
                        continue
                    if isinstance(member, (staticmethod, classmethod)):
                        member = member.__func__
                    if inspect.isfunction(member) or isinstance(member, property):
                        yield f"{module_name}.{name}.{attr}", member


def missing_docstrings() -> list[str]:
    """The dotted paths of the public objects without a docstring of their own."""
    missing = []
    for path, value in public_objects():
        doc = value.__doc__ if not inspect.isclass(value) else value.__dict__.get("__doc__")
        if not (doc and doc.strip()):
            missing.append(path)
    return sorted(set(missing))
