"""Import a script that is not part of the package (an example, a benchmark) as a module, for the tests to call its
functions. Each call executes the file afresh: a new module object with its own state."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_script(path: Path, name: str | None = None) -> ModuleType:
    """The module that ``path`` defines, under ``name`` (default: the file's stem). It is entered in
    ``sys.modules`` before it runs, as an import would, because dataclasses look their module up there."""
    name = name or path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
