"""Open the built site in a real browser (headless Chromium) and check what a reader sees.

    pip install -e ".[docs]" playwright     # Playwright drives the browser; it need not download one:
    apt-get install chromium                # Debian's Chromium (or set CHROMIUM=/path/to/chrome)
    mkdocs build --strict                   # the site, into site/
    python docs/check_site.py               # serves site/ on 127.0.0.1, checks, saves docs/screenshots/*.png

It checks the home page (and that the search index loads: a search for "rotary" lists results), the tutorial pages
with formulas (attention.md, positions.md, modern-blocks.md, relative-positions.md: every formula is typeset by
MathJax as an SVG, no raw TeX is left on the page) and an API page (``SelfAttention``'s signature and its
"Parameters" table list its constructor's arguments), and the learner's path ("Your first model" first in the
navigation; every figure of the concept pages loaded). It exits 1 with the failed checks named, and fails on any
JavaScript error. CI does not run it: CI machines have no browser. Screenshots go to docs/screenshots/
(git-ignored).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import inspect
import os
import pathlib
import shutil
import sys
import threading

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The pages whose formulas are written as $$ math (attention, sinusoidal positions, RMSNorm, rotary).
FORMULA_PAGES = ["attention", "positions", "modern-blocks", "relative-positions"]
# The pages with figures drawn by docs/make_figures.py.
FIGURE_PAGES = ["blocks", "masks", "heads", "positions", "attention"]
EVERY_FORMULA_TYPESET = (
    "() => [...document.querySelectorAll('.arithmatex')].every(f => f.querySelector('mjx-container svg'))"
)


@contextlib.contextmanager
def serve(folder: pathlib.Path):
    """Serve ``folder`` on a free port of 127.0.0.1 for the duration of the block; yields the base URL."""
    handler = functools.partial(QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass


def find_chromium() -> str:
    for candidate in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    raise SystemExit("no Chromium found: apt-get install chromium, or set CHROMIUM=/path/to/chrome")


def check(site: pathlib.Path, shots: pathlib.Path) -> list[str]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise SystemExit("Playwright is not installed: pip install playwright (it uses the system's Chromium)")
    sys.path.insert(0, str(ROOT / "src"))
    from torchformer.nn.attention import SelfAttention

    failures = []
    shots.mkdir(parents=True, exist_ok=True)
    with serve(site) as base, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=find_chromium(), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors = []
        page.on("pageerror", lambda error: errors.append(str(error)))

        # 1. The home page, and the search index: typing a query must list results.
        page.goto(f"{base}/")
        if "torchformer" not in page.title():
            failures.append(f"home page: title is {page.title()!r}")
        page.screenshot(path=str(shots / "home.png"))
        page.fill("input.md-search__input", "rotary")
        try:
            page.wait_for_selector(".md-search-result__item", timeout=15000)
            count = page.locator(".md-search-result__item").count()
            print(f"search: {count} results for 'rotary'")
        except Exception:
            failures.append("search: no results for 'rotary' (the search index did not load)")
        page.screenshot(path=str(shots / "search.png"))

        # 2. The tutorial pages with formulas: MathJax must have replaced every formula's TeX by an SVG.
        for name in FORMULA_PAGES:
            page.goto(f"{base}/{name}/")
            formulas = page.locator(".arithmatex")
            try:
                page.wait_for_function(EVERY_FORMULA_TYPESET, timeout=15000)
            except Exception:
                failures.append(f"{name}: not every formula was typeset (no mjx-container svg)")
            raw = [text for text in formulas.all_inner_texts() if "\\" in text]
            if formulas.count() == 0 or raw:
                failures.append(f"{name}: {formulas.count()} formulas, raw TeX still shown: {raw[:2]}")
            print(f"{name}: {formulas.count()} formula(s), typeset by MathJax")
            first = formulas.first
            first.scroll_into_view_if_needed()
            if name == "positions":
                page.screenshot(path=str(shots / "formula-page.png"))
            first.screenshot(path=str(shots / f"formula-{name}.png"))

        # 3. An API page: SelfAttention's section lists every argument of its constructor.
        page.goto(f"{base}/api/torchformer.nn.attention/")
        section = page.locator("div.doc-class:has(> h2#torchformer\\.nn\\.attention\\.SelfAttention)")
        if section.count() != 1:
            failures.append("API page: no section for torchformer.nn.attention.SelfAttention")
        else:
            names = [n for n in inspect.signature(SelfAttention.__init__).parameters if n != "self"]
            # The "Parameters:" table of the class's own docstring (not a nested method's): one row per argument.
            table = section.locator("> div.doc-contents").first.locator("table").first  # Material wraps tables
            listed = [cell.strip() for cell in table.locator("tr.doc-section-item > td:first-child").all_inner_texts()]
            if listed != names:
                failures.append(f"API page: SelfAttention's parameter table lists {listed}, the signature {names}")
            signature = section.locator(".doc-signature").first.inner_text()
            if not all(name in signature for name in names):
                failures.append(f"API page: SelfAttention's signature is incomplete: {signature!r}")
            print(f"API page: SelfAttention's signature and parameter table list its {len(names)} arguments "
                  f"({', '.join(listed)})")
            section.locator("h2").first.scroll_into_view_if_needed()
            page.screenshot(path=str(shots / "api-page.png"))
            table.screenshot(path=str(shots / "api-parameters.png"))
        # 4. The learner's path: "Your first model" comes first in the navigation, and every figure of the concept
        # pages is an image the browser could load and decode (not a broken link).
        page.goto(f"{base}/")
        # The pages' links, in order (the home page's own table of contents, links to #anchors, left out).
        links = page.evaluate("() => [...document.querySelectorAll('nav.md-nav--primary a.md-nav__link')]"
                              ".filter(a => !a.getAttribute('href').includes('#')).map(a => a.innerText.trim())"
                              ".filter(text => text)")
        if "Your first model" not in links[:4]:
            failures.append(f"navigation: 'Your first model' is not among the first entries: {links[:6]}")
        for name in FIGURE_PAGES:
            page.goto(f"{base}/{name}/")
            images = page.locator("article img")
            sizes = page.evaluate("() => [...document.querySelectorAll('article img')].map(i => [i.getAttribute('src'),"
                                  " i.complete && i.naturalWidth])")
            broken = [src for src, width in sizes if not width]
            if images.count() == 0 or broken:
                failures.append(f"{name}: {images.count()} figure(s), not loaded: {broken}")
            print(f"{name}: {images.count()} figure(s), all loaded")
            if name == "heads":
                images.first.scroll_into_view_if_needed()
                page.screenshot(path=str(shots / "figure-page.png"))
        if errors:
            failures.append(f"JavaScript errors: {errors}")
        browser.close()
    return failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--site", type=pathlib.Path, default=ROOT / "site", help="the built site (mkdocs build)")
    parser.add_argument("--screenshots", type=pathlib.Path, default=ROOT / "docs" / "screenshots")
    args = parser.parse_args()
    if not (args.site / "index.html").exists():
        raise SystemExit(f"no built site in {args.site}: run mkdocs build --strict first")
    failures = check(args.site, args.screenshots)
    for failure in failures:
        print("FAILED:", failure)
    print(f"screenshots in {args.screenshots}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
