"""docs/variants.md, the catalogue of config fields, stays complete and its links lead somewhere.

* Every field of ``TransformerConfig`` has a row in the page's tables (its first cell is `` `name` ``), and no row
  names a field that does not exist: a new field fails here until it is catalogued.
* Each row's default is the field's real default, and its setting (`` `name=value` ``) makes a valid config; every
  allowed value of a choice field (``positions``, ``activation``, ...) has a row.
* A measured effect is "—" or quotes its source with a link.
* Every link to another page, or to an anchor, points to a file that exists and a heading it has (``mkdocs build
  --strict`` checks the same; this test needs no MkDocs).
"""

import ast
import dataclasses
import pathlib
import re
import unicodedata

import pytest

from torchformer import config as config_module
from torchformer.config import TransformerConfig

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "variants.md"
FIELDS = {f.name: f for f in dataclasses.fields(TransformerConfig)}
CHOICES = {
    "positions": config_module.POSITIONS,
    "activation": config_module.ACTIVATIONS,
    "norm": config_module.NORMS,
    "pool": config_module.POOLING,
    "impl": config_module.IMPLEMENTATIONS,
    "sparse": config_module.SPARSE_PATTERNS,
}
# Fields that apply only with another setting (the config refuses them alone, rather than ignore them).
NEEDS = {"rotary_base": {"positions": "rotary"}, "rotary_scaling": {"positions": "rotary"},
         "relative_buckets": {"positions": "relative"}, "relative_max_distance": {"positions": "relative"},
         "relative_shared": {"positions": "relative"}, "sparse": {"sparse_stride": 8},
         "sparse_stride": {"sparse": "strided"}, "sparse_summary": {"sparse": "fixed", "sparse_stride": 8}}
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def rows() -> list[dict[str, str]]:
    """Every row of every table on the page, as {column: cell}, the column names from the table's header."""
    result, header = [], None
    for line in FENCE.sub("", PAGE.read_text()).splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if header is None:
            header = [cell.lower() for cell in cells]
        elif not all(set(cell) <= set("-: ") for cell in cells):
            assert len(cells) == len(header), f"a row with {len(cells)} cells under {len(header)} columns: {line}"
            result.append(dict(zip(header, cells)))
    return result


def field_rows() -> list[dict[str, str]]:
    return [row for row in rows() if "field" in row and re.fullmatch(r"`\w+`", row["field"])]


def default_of(field: dataclasses.Field):
    """The field's default, made by its factory where it has one (``extra``'s ``{}``)."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def shown(default) -> str:
    """A default as the page writes it: `None`, `False`, `4`, `0.0`, `"layer"`; a field with none is required."""
    if default is dataclasses.MISSING:
        return "required"
    return f'`"{default}"`' if isinstance(default, str) else f"`{default!r}`"


def test_every_field_is_catalogued():
    named = {row["field"].strip("`") for row in field_rows()}
    assert named - set(FIELDS) == set(), "rows for fields TransformerConfig does not have"
    assert set(FIELDS) - named == set(), "fields of TransformerConfig missing from docs/variants.md"


@pytest.mark.parametrize("row", field_rows(), ids=lambda row: row["setting"].strip("`"))
def test_a_row_shows_the_default_and_a_valid_setting(row):
    name = row["field"].strip("`")
    assert name in FIELDS, f"{name} is not a field of TransformerConfig"
    assert row["default"] == shown(default_of(FIELDS[name]))
    match = re.fullmatch(r"`(\w+)=(.+)`", row["setting"])
    assert match and match.group(1) == name, f"the setting of {name} should be `{name}=value`: {row['setting']}"
    fields = {"emb": 64, "heads": 4, **NEEDS.get(name, {}), name: ast.literal_eval(match.group(2))}
    TransformerConfig(**fields)  # raises if the setting is not a valid value
    effect = row["measured effect"]
    assert effect == "—" or effect.startswith("the baseline") or LINK.search(effect), (
        f"{name}: a measured effect names its source with a link, or is —: {effect}"
    )


def test_every_allowed_value_has_a_row():
    settings = {row["setting"] for row in field_rows()}
    for name, values in CHOICES.items():
        for value in values:
            assert f'`{name}="{value}"`' in settings, f"no row for {name}={value!r}"


def slug(heading: str) -> str:
    """The anchor MkDocs (Python-Markdown's toc extension) gives a heading."""
    text = re.sub(r"`|\*\*?", "", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: pathlib.Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M)}


def test_the_slug_is_mkdocs_own():
    assert slug("The 2/3 sizing") == "the-23-sizing"
    assert slug("Wide heads (`wide=True`)") == "wide-heads-widetrue"
    assert slug("Parts compared on the CPU (2026-11-23): the preset's architecture") == (
        "parts-compared-on-the-cpu-2026-11-23-the-presets-architecture"
    )


def links() -> list[str]:
    return [m.group(1) for m in LINK.finditer(FENCE.sub("", PAGE.read_text()))
            if not re.match(r"[a-z]+:", m.group(1))]


def test_the_page_links_somewhere():
    assert len(links()) > 20


@pytest.mark.parametrize("target", sorted(set(links())))
def test_every_link_leads_to_a_file_and_heading(target):
    path, _, anchor = target.partition("#")
    file = (PAGE.parent / path).resolve() if path else PAGE
    assert file.is_file(), f"{target}: no such file"
    if anchor:
        assert anchor in anchors(file), f"{target}: {file.name} has no heading with that anchor"
