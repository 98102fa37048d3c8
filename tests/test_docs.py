"""The docs' code snippets run, and their pasted outputs are what the code prints today.

Outputs are compared exactly only on the torch release they were recorded with: another release may print a
float's last digit or a repr differently without anything being wrong. Refresh them with
``python docs/update_snippets.py docs/*.md``.
"""

import importlib.util
import pathlib

import pytest
import torch

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"
RECORDED_WITH = "2.13."

spec = importlib.util.spec_from_file_location("update_snippets", DOCS / "update_snippets.py")
update_snippets = importlib.util.module_from_spec(spec)
spec.loader.exec_module(update_snippets)


@pytest.mark.parametrize("page", sorted(DOCS.glob("*.md")), ids=lambda p: p.name)
def test_snippets_run_and_outputs_are_current(page):
    text = page.read_text()
    fresh = update_snippets.refresh(text, page)  # raises SystemExit if a snippet fails
    if torch.__version__.startswith(RECORDED_WITH):
        assert fresh == text, f"{page.name}: outputs differ from a fresh run; run docs/update_snippets.py {page}"
