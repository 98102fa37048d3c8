"""The docs' code snippets run, and their pasted outputs hold for what the code prints today, on any CPU.

The outputs were recorded on one machine; another CPU rounds float sums differently, so a fresh run is compared
with a tolerance (``update_snippets.disagreements``; its module docstring states the rules), never exactly. The
second test proves the comparison has that slack and no more: every printed number moved within its tolerance
still holds, and each one moved past it does not.

Outputs are compared only on the torch release they were recorded with: another release may print a repr
differently without anything being wrong. Refresh them with ``python docs/update_snippets.py docs/*.md``.
"""

import importlib.util
import pathlib
import re

import pytest
import torch

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
RECORDED_WITH = "2.13."
PAGES = sorted(DOCS.glob("*.md")) + [DOCS.parent / "README.md"]  # the README's quickstart prints what it shows

spec = importlib.util.spec_from_file_location("update_snippets", DOCS / "update_snippets.py")
update_snippets = importlib.util.module_from_spec(spec)
spec.loader.exec_module(update_snippets)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_snippets_run_and_outputs_hold(page):
    text = page.read_text()
    outputs = update_snippets.fresh_outputs(text)  # raises SystemExit if a snippet fails
    if torch.__version__.startswith(RECORDED_WITH):
        problems = update_snippets.disagreements(text, outputs)
        assert not problems, f"{page.name}: run docs/update_snippets.py {page}\n" + "\n".join(problems)


def moved(number: str, rules: dict, percent: bool, factor: float) -> str:
    """``number`` moved by ``factor`` times the slack its rules allow, printed the way it was printed: within the
    slack for factor 0.5 (rounding to the printed digits adds at most half a unit of the last digit, and the slack
    is at least one unit), past it for factor 2. An integer outside the rules has no slack: it moves by one."""
    value = float(number)
    mantissa, e, exponent = number.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    if percent and rules["points"]:
        new = value + factor * rules["points"]
    elif rules["round-off"] and e:
        new = max(abs(value) * 10 * factor, update_snippets.ROUND_OFF_FLOOR * factor)
        return f"{new:.{decimals}e}"
    elif "." not in number and not e:  # an integer: a count, a size, a step; always exact
        return number if factor < 1 else str(int(value) + 1)
    else:
        slack = max(update_snippets.last_digit(number), rules["decimals"] * abs(value))
        if slack == 0:  # "1." or "2e-04" (no digit after the point), or a zero under a relative rule: exact
            first = next(i for i, c in enumerate(number) if c.isdigit())
            return number if factor < 1 else number[:first] + str((int(number[first]) + 1) % 10) + number[first + 1:]
        new = value + factor * slack
    if e:
        return f"{new:.{decimals}e}"
    return f"{new:.{decimals}f}"


def outputs_of(text: str) -> list[tuple[str, str | None]]:
    return [(m.group(2), m.group(3)) for m in update_snippets.snippets(text) if m.group(2) is not None]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_comparison_allows_the_stated_slack_and_no_more(page):
    for output, rules in outputs_of(page.read_text()):
        parsed = update_snippets.parse_rules(rules)
        if parsed["sample"]:
            assert update_snippets.disagreement(output, "any other text\n", rules) is None
            assert update_snippets.disagreement(output, "\n", rules) is not None
            continue
        if parsed["quotes"]:  # the numbers inside a generated string count for nothing
            output = update_snippets.QUOTED.sub("'sample'", output)
            assert update_snippets.disagreement(output, output.replace("'sample'", "b'other text'"), rules) is None
        spans = [(m, output[m.end():].lstrip().startswith("%")) for m in update_snippets.NUMBER.finditer(output)]
        within = output
        for match, percent in reversed(spans):  # every number at once, from the end so positions stay valid
            within = within[:match.start()] + moved(match.group(), parsed, percent, 0.5) + within[match.end():]
        assert update_snippets.disagreement(output, within, rules) is None, (output, within)
        for match, percent in spans:  # each number alone
            past = output[:match.start()] + moved(match.group(), parsed, percent, 2.0) + output[match.end():]
            assert update_snippets.disagreement(output, past, rules) is not None, (match.group(), past)
    # the text between the numbers counts too
    for output, rules in outputs_of(page.read_text()):
        if not update_snippets.parse_rules(rules)["sample"] and re.search(r"[a-z]", output):
            changed = re.sub(r"[a-z]", lambda m: m.group().upper(), output, count=1)
            assert update_snippets.disagreement(output, changed, rules) is not None


@pytest.mark.parametrize(("recorded", "fresh", "rules", "holds"), [
    # the figures an AVX2 machine printed where this page was recorded on an AVX-512 one
    ("largest difference between the paths: 1.2e-07\n", "largest difference between the paths: 9.7e-08\n",
     "round-off", True),
    ("largest difference between the paths: 1.2e-07\n", "largest difference between the paths: 9.7e-08\n",
     None, False),
    ("held-out accuracy after 300 steps: 95%\n", "held-out accuracy after 300 steps: 96%\n", "points 1", True),
    ("held-out accuracy after 300 steps: 95%\n", "held-out accuracy after 300 steps: 96%\n", None, False),
    ("  210        0.00330        3.54             3.83\n", "  210        0.00330        3.54             3.84\n",
     None, True),  # one unit of the last digit
    (" 3.83\n", " 3.90\n", None, False),
    (" 3.83\n", " 3.90\n", "decimals 2%", True),
    ("torch.Size([2, 5, 16])\n", "torch.Size([2, 5, 17])\n", "decimals 2%", False),  # integers are exact
    ("loss 3.68\n", "Loss 3.68\n", "decimals 2%", False),
    ("a   b 1.0\n", "a b 1.0\n", None, True),  # columns move when a number changes width
    ("a: 1\nb: 2\n", "a: 1 b: 2\n", None, False),  # line breaks are structure
    ("tensor([0., 1., 0.])\n", "tensor([1., 0., 0.])\n", None, False),  # a whole-number float is exact
    ("bits 3.72\n", "bits 4\n", None, False),  # the slack is the recorded number's
    ("1,217 of 8,192\n", "1,218 of 8,192\n", "decimals 3%", False),  # integers stay exact
    ("greedy: b'the the'\n  cached: True\n", "greedy: b\"it's 2\"\n  cached: True\n", "quotes", True),
    ("greedy: b'the the'\n  cached: True\n", "greedy: b'the the'\n  cached: False\n", "quotes", False),
    ("greedy: b'the the'\n", "greedy: b'the then'\n", None, False),
])
def test_known_cases(recorded, fresh, rules, holds):
    assert (update_snippets.disagreement(recorded, fresh, rules) is None) == holds


def test_an_unknown_rule_is_an_error():
    with pytest.raises(ValueError, match="unknown rule 'decimal 2%'"):
        update_snippets.parse_rules("decimal 2%")


def test_the_reading_order_of_index_md_is_the_sidebar_s():
    """The learner's path is the same in the sidebar (mkdocs.yml's nav) and in index.md's "Reading order"."""
    root = DOCS.parent
    nav = (root / "mkdocs.yml").read_text()
    nav = nav[nav.index("\nnav:"):]
    sidebar = [page for page in re.findall(r"([\w/-]+\.md)", nav) if "/" not in page and page != "index.md"]
    index = (DOCS / "index.md").read_text()
    order = re.findall(r"\]\(([\w-]+\.md)\)", index[index.index("## Reading order"):])
    assert order == sidebar


def test_the_home_pages_module_table_names_every_public_module():
    """docs/index.md "Where each concept lives": each public module of the package is in it, as a row
    (``nn/attention.py``) or inside its folder's row (``t5.py`` in the ``pretrained/`` row), so a new module
    cannot be left out of the map (the list once missed t5.py, optimizers.py and masked_lm.py)."""
    package = DOCS.parent / "src" / "torchformer"
    section = (DOCS / "index.md").read_text().split("## Where each concept lives")[1].split("\n## ")[0]
    rows = {}
    for line in section.splitlines():
        cells = line.split(" | ")
        if line.startswith("| `") and len(cells) > 1:
            rows[cells[0].strip("| *`")] = line
    missing = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if path.name.startswith("_"):
            continue
        folder = relative.split("/")[0] + "/" if "/" in relative else None
        if relative not in rows and not (folder in rows and f"`{path.name}`" in rows[folder]):
            missing.append(relative)
    assert not missing, f"docs/index.md's module table does not name {missing}"


# The width of a code block's column on the site at 1280 px, in characters (docs/check_site.py measures the
# rendered pages; this is the same rule without a browser).
CODE_COLUMNS = 84
FENCE = re.compile(r"^ *(```|~~~)")
DISPLAY_FORMULA = re.compile(r"\$\$(.*?)\$\$", re.S)


LIST_ITEM = re.compile(r"^(?:[-*+]|\d+\.) ")


def long_code_lines(text: str) -> list[str]:
    """The lines of code blocks longer than CODE_COLUMNS: fenced blocks (not ``text`` ones, program output, which
    the page wraps), and blocks indented by 4 spaces after a blank line (8 inside a list item)."""
    fenced, output, in_code, in_list, after_blank, found = False, False, False, False, True, []
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            output = fenced and line.strip().strip("`~").strip() == "text"  # program output wraps on the page
        elif fenced:
            if not output and len(line.rstrip()) > CODE_COLUMNS:
                found.append(line)
        elif not line.strip():
            after_blank = True
        else:
            indent = len(line) - len(line.lstrip())
            if indent == 0:
                in_code, in_list = False, bool(LIST_ITEM.match(line))
            else:
                block = 8 if in_list else 4
                in_code = indent >= block and (after_blank or in_code)
                if in_code and len(line.rstrip()) - block > CODE_COLUMNS:
                    found.append(line)
            after_blank = False
    return found


def side_by_side_formulas(text: str) -> list[str]:
    """Display formulas that set two formulas side by side on one line (``\\qquad``, ``\\quad``)."""
    return [f.strip()[:60] for f in DISPLAY_FORMULA.findall(text) if re.search(r"\\q?quad\b", f)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_code_lines_fit_the_column_and_formulas_stand_one_per_line(page):
    text = page.read_text()
    assert long_code_lines(text) == [], f"{page.name}: code lines over {CODE_COLUMNS} characters"
    assert side_by_side_formulas(text) == [], f"{page.name}: formulas side by side (use aligned rows)"


def test_the_layout_rules_catch_a_long_line_and_a_formula_pair():
    text = "```python\nx = 1\n" + "y" * 85 + "\n```\n" + "z" * 120 + "\n$$\na = 1, \\qquad b = 2\n$$\n"
    assert long_code_lines(text) == ["y" * 85]  # prose lines may be long; code lines may not
    indented = "Text\n\n    " + "a" * 85 + "\n\n- an item\n  " + "b" * 120 + "\n\n        " + "c" * 85 + "\n"
    assert long_code_lines(indented) == ["    " + "a" * 85, "        " + "c" * 85]  # blocks, not the item's text
    assert long_code_lines("```text\n" + "d" * 90 + "\n```\n") == []  # output, which wraps
    assert side_by_side_formulas(text) == ["a = 1, \\qquad b = 2"]
    assert side_by_side_formulas("$$\n\\begin{aligned} a &= 1 \\\\ b &= 2 \\end{aligned}\n$$") == []


def test_code_in_table_cells_may_wrap_at_its_joints_and_between_camel_case_words():
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", DOCS / "mkdocs_hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    cell = '<td><code>torchformer.nn</code> and <code>BertForSequence</code>, <code><a href="x.html">a_b</a></code></td>'
    assert hooks.breakable_code(cell) == ('<td><code>torchformer.<wbr>nn</code> and <code>Bert<wbr>For<wbr>Sequence'
                                          '</code>, <code><a href="x.html">a_<wbr>b</a></code></td>')
