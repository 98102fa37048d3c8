"""MkDocs hooks for the torchformer site (mkdocs.yml names this file).

* The API reference: ``api/index.md`` (every name of ``torchformer.__all__``) and one page per public module, each
  rendered by mkdocstrings from the docstrings. The pages are generated here, from ``public_api.py``, so a new module
  gets its page without anyone remembering to add one.
* A public name without a docstring is a warning, so ``mkdocs build --strict`` fails on it.
* ``examples/README.md`` and ``benchmarks/RESULTS.md``, which the pages link to, become pages of the site, and the
  links between them and ``docs/`` are rewritten from repository paths to site paths.
* Code in table cells gets a line-break opportunity (``<wbr>``) after each ``.``, ``_``, ``=``, ``,``, ``/`` and
  ``(``, and between the words of a CamelCase name, so a long name wraps at its joints instead of widening the table past the page (or breaking mid-word).
* MathJax is copied into the site from the ``django-static-mathjax`` package (plain MathJax 3 files, no Django
  needed), so the formulas render with no network.
"""

from __future__ import annotations

import importlib
import logging
import pathlib
import re
import shutil
import sys

from mkdocs.structure.files import File

DOCS = pathlib.Path(__file__).resolve().parent
ROOT = DOCS.parent
for path in (str(ROOT / "src"), str(DOCS)):  # document this checkout, whatever torchformer is installed
    if path not in sys.path:
        sys.path.insert(0, path)

import public_api  # noqa: E402  (needs the paths above)

log = logging.getLogger("mkdocs.plugins.torchformer")

# Repository files outside docs/ that the pages link to: they join the site at the same relative path.
REPOSITORY_PAGES = ["examples/README.md", "benchmarks/RESULTS.md"]
LINK = re.compile(r"\]\((?!https?:|#|mailto:)([^)\s]+)\)")
MATHJAX_PARTS = ["tex-svg.js", "input", "ui", "a11y"]


def api_page(module: str) -> str:
    return f"api/{module}.md"


def module_page_markdown(module: str) -> str:
    if hasattr(importlib.import_module(module), "__path__"):
        # A package (torchformer, torchformer.nn, torchformer.data, ...): its docstring; the names it re-exports are
        # documented on the pages of the modules that define them.
        return f"# `{module}`\n\n::: {module}\n    options:\n      members: false\n      show_root_heading: false\n"
    return f"# `{module}`\n\n::: {module}\n    options:\n      show_root_heading: false\n"


def api_index_markdown() -> str:
    import torchformer

    lines = [
        "# API reference",
        "",
        "Generated from the docstrings. Shapes use the letters of [the home page](../index.md#shapes): `b` batch, "
        "`t` sequence length, `u` keys, `e` embedding, `h` heads, `s` head size.",
        "",
        "## The top-level names",
        "",
        "`from torchformer import ...` imports each of these (`torchformer.__all__`):",
        "",
        "| name | defined in | summary |",
        "| --- | --- | --- |",
    ]
    for name in torchformer.__all__:
        value = getattr(torchformer, name)
        module = value.__module__
        summary = (value.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ").replace("|", "\\|")
        summary = re.sub(r":\w+:`~?([\w.]+)`", lambda m: f"`{m.group(1).split('.')[-1]}`", summary)
        lines.append(f"| [`{name}`][{module}.{name}] | [`{module}`]({module}.md) | {summary} |")
    lines += ["", "## Modules", ""]
    for module in public_api.modules():
        doc = (importlib.import_module(module).__doc__ or "").strip().split("\n")[0]
        doc = re.sub(r":\w+:`~?([\w.]+)`", lambda m: f"`{m.group(1).split('.')[-1]}`", doc)
        lines.append(f"* [`{module}`]({module}.md): {doc}")
    return "\n".join(lines) + "\n"


def on_config(config, **kwargs):
    pages = ["api/index.md"] + [api_page(m) for m in public_api.modules()]
    config["nav"] = list(config["nav"] or []) + [{"API reference": pages}]
    for path in public_api.missing_docstrings():
        log.warning(f"{path} is public but has no docstring (docs/public_api.py lists the public names)")
    return config


def on_files(files, config, **kwargs):
    files.append(File.generated(config, "api/index.md", content=api_index_markdown()))
    for module in public_api.modules():
        files.append(File.generated(config, api_page(module), content=module_page_markdown(module)))
    for path in REPOSITORY_PAGES:
        files.append(File.generated(config, path, abs_src_path=str(ROOT / path)))
    return files


def site_link(page_path: str, target: str) -> str:
    """A link written for the repository (relative to the file's place in it) as a link between site pages."""
    repo_page = pathlib.PurePosixPath(page_path if page_path in REPOSITORY_PAGES else f"docs/{page_path}")
    resolved = pathlib.PurePosixPath(*_normalise((repo_page.parent / target).parts))
    inside = None
    if resolved.parts[:1] == ("docs",):
        inside = pathlib.PurePosixPath(*resolved.parts[1:])
    elif str(resolved).split("#")[0] in REPOSITORY_PAGES:
        inside = resolved
    if inside is None:
        return target
    here = pathlib.PurePosixPath(page_path).parent
    ups = len(here.parts)
    return "/".join([".."] * ups + [str(inside)]) if ups else str(inside)


def _normalise(parts):
    out = []
    for part in parts:
        if part == "..":
            if out:
                out.pop()
        elif part != ".":
            out.append(part)
    return out


def on_page_markdown(markdown, page, config, files, **kwargs):
    if page.file.src_uri.startswith("api/"):
        return markdown
    # Only links that leave docs/ (or come from the repository pages) need rewriting; page-to-page links are as-is.
    def rewrite(match):
        target = match.group(1)
        if page.file.src_uri in REPOSITORY_PAGES or target.startswith("../"):
            return f"]({site_link(page.file.src_uri, target)})"
        return match.group(0)

    return LINK.sub(rewrite, markdown)


TABLE_CELL = re.compile(r"<td\b[^>]*>.*?</td>", re.S)
INLINE_CODE = re.compile(r"(<code>)(.*?)(</code>)", re.S)
TAG = re.compile(r"(<[^>]*>)")
# After a joint, or inside a CamelCase name before its next word, unless a tag or a space follows anyway.
JOINT = re.compile(r"(?:(?<=[._=,/(])|(?<=[a-z])(?=[A-Z]))(?=[^<\s])")


def breakable_code(cell: str) -> str:
    """A table cell whose inline code may wrap after its joints (``torchformer.<wbr>nn.<wbr>masks``)."""
    def text_only(code: str) -> str:  # the text between tags (a cross-reference is a tag with a dotted name)
        return "".join(part if part.startswith("<") else JOINT.sub("<wbr>", part) for part in TAG.split(code))

    return INLINE_CODE.sub(lambda m: m.group(1) + text_only(m.group(2)) + m.group(3), cell)


def on_page_content(html, page, config, files, **kwargs):
    return TABLE_CELL.sub(lambda m: breakable_code(m.group(0)), html)


def on_post_build(config, **kwargs):
    import mathjax  # the django-static-mathjax package: MathJax 3's files, no code

    source = pathlib.Path(mathjax.__file__).parent / "static" / "mathjax"
    target = pathlib.Path(config["site_dir"]) / "mathjax"
    for part in MATHJAX_PARTS:
        if (source / "es5" / part).is_dir():
            shutil.copytree(source / "es5" / part, target / part, dirs_exist_ok=True)
        else:
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / "es5" / part, target / part)
    shutil.copy2(source / "LICENSE", target / "LICENSE")
