"""The version of torchformer, in a module of its own so that any module can read it without importing the package."""

__version__ = "0.4.0"  # keep equal to pyproject.toml's version
