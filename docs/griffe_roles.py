"""A griffe extension for the site's API reference: Sphinx roles in docstrings become links or code.

The docstrings name other objects the Sphinx way (``:class:`~torchformer.nn.masks.AttentionMask```,
``:func:`generate```), which reads well in ``help()`` and in the source. mkdocstrings renders Markdown, so this turns
each role into a cross-reference to the named object's entry in the API reference when the object is torchformer's
(a strict build then fails if it names nothing documented), and into plain code otherwise (``torch.nn.LayerNorm``).
"""

from __future__ import annotations

import builtins
import logging
import re

import griffe

log = logging.getLogger("mkdocs.plugins.torchformer")

ROLE = re.compile(r":(?:class|func|meth|attr|mod|data|exc|obj):`(~?)([\w.]+)`")


class SphinxRoles(griffe.Extension):
    def on_package(self, *, pkg, **kwargs) -> None:
        # After the whole package is loaded, so that every name a docstring mentions can be looked up.
        for obj in walk(pkg):
            if obj.docstring is not None:
                obj.docstring.value = ROLE.sub(lambda match: replace(obj, match), obj.docstring.value)


def walk(obj):
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from walk(member)


def replace(obj, match) -> str:
    short, name = match.group(1) == "~", match.group(2)
    shown = name.split(".")[-1] if short else name
    target = resolve(obj, name)
    if target is not None and any(part.startswith("_") for part in target.split(".")):
        return f"`{shown}`"  # a private name: it has no entry in the reference
    if target is None:
        if "." not in name and not hasattr(builtins, name):  # neither torchformer's nor another package's
            log.warning(f"{obj.path}: the docstring names {name!r}, which is nothing in scope")
        return f"`{shown}`"
    return f"[`{shown}`][{target}]"


def resolve(obj, name: str) -> str | None:
    """The full path of ``name`` as seen from ``obj``'s docstring, if it is torchformer's; else None."""
    if name.startswith("torchformer"):
        return name
    scope = obj if obj.is_class or obj.is_module else obj.parent
    while scope is not None:
        head, _, rest = name.partition(".")
        if head in scope.members:
            member = scope.members[head]
            path = member.target_path if member.is_alias else member.path
            full = f"{path}.{rest}" if rest else path
            return full if full.startswith("torchformer") else None
        scope = scope.parent
    return None
