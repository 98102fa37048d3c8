"""Open the built site in a real browser (headless Chromium) and check what a reader sees.

    pip install -e ".[docs]" playwright     # Playwright drives the browser; it need not download one:
    apt-get install chromium                # Debian's Chromium (or set CHROMIUM=/path/to/chrome)
    mkdocs build --strict                   # the site, into site/
    python docs/check_site.py               # serves site/ on 127.0.0.1, checks, saves docs/screenshots/*.png

It checks:

* the home page, and that the search index loads (a search for "rotary" lists results);
* every page with display formulas ($$ math), at a desktop's width (1280 px) and a phone's (375 px): every formula
  is typeset by MathJax as an SVG, no raw TeX is left on the page, and every display formula is more than 50 px
  wide (below 720 px Material's CSS once squeezed them to 1 px; docs/stylesheets/extra.css is the fix);
* an API page: ``MultiHeadAttention``'s "Parameters" table lists its constructor's arguments, and
  ``SelfAttention``'s section (which takes that constructor) has them in its signature and links there;
* the learner's path: "Your first model" first in the navigation; every figure of the concept pages loaded;
* the site opened from disk (site/index.html, no server, as the README says): every navigation link leads to an
  HTML file, not a folder, and a page reached by clicking has its formulas typeset;
* no network: every request the pages make goes to 127.0.0.1 (no Google Fonts, no CDN), and no JavaScript error;
* the layout of every content page (not the generated API pages): at 1280 px no code block, display formula or
  table is wider than its column (a reader would have to scroll it sideways), and at 375 px (a phone) no display
  formula is; a phone's column holds about 40 characters of code, so there code blocks and wide tables scroll,
  and the check reports how many.

It exits 1 with the failed checks named. CI does not run it: CI machines have no browser. Screenshots (the home,
attention and positions pages at both widths, and a few more) go to docs/screenshots/ (git-ignored).
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
from urllib.parse import urlsplit
from urllib.request import url2pathname

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The pages with figures drawn by docs/make_figures.py.
# Every page that shows a figure (a Markdown image of docs/images/), found from the pages themselves.
FIGURE_PAGES = sorted(page.stem for page in (ROOT / "docs").glob("*.md") if "](images/" in page.read_text())
# (width, height) in CSS pixels: a desktop, and a phone (an iPhone's 375 x 812). Material restyles display maths
# below 720 px, so both sides of that line are checked.
VIEWPORTS = [(1280, 900), (375, 812)]
# Pages saved as screenshots at every width (scrolled to their first display formula, if any).
SCREENSHOT_PAGES = ["index", "attention", "positions"]
# A display formula narrower than this has collapsed (the bug this guards against left them 1 px wide).
MIN_FORMULA_WIDTH = 50
# The only hosts the pages may ask for anything: the site must work with no network.
LOCAL_HOSTS = {"127.0.0.1", "localhost"}
EVERY_FORMULA_TYPESET = (
    "() => [...document.querySelectorAll('.arithmatex')].every(f => f.querySelector('mjx-container svg'))"
)
# The rendered width of each display formula ($$ math: a div; inline $ math is a span), 0 if it has no SVG.
DISPLAY_FORMULA_WIDTHS = (
    "() => [...document.querySelectorAll('div.arithmatex')]"
    ".map(f => f.querySelector('mjx-container svg')?.getBoundingClientRect().width ?? 0)"
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


def page_url(base: str, site: pathlib.Path, name: str) -> str:
    """The URL of page ``name`` ("attention", "api/torchformer"): ``name.html`` as mkdocs.yml builds it
    (``use_directory_urls: false``, so the site also works from disk), or ``name/`` if built the other way."""
    return f"{base}/{name}.html" if (site / f"{name}.html").exists() else f"{base}/{name}/"


def display_formula_pages(site: pathlib.Path) -> list[str]:
    """The pages of the built site with display formulas, found in the HTML so that a new page is checked too."""
    pages = []
    for html in sorted(site.rglob("*.html")):
        if '<div class="arithmatex">' in html.read_text(encoding="utf-8"):
            name = html.relative_to(site).with_suffix("").as_posix()
            pages.append(name.removesuffix("/index"))  # attention/index.html, if built with directory URLs
    return pages


def open_page(browser, viewport: tuple[int, int], errors: list[str], requests: list[str]):
    """A new browser tab of the given size that records its JavaScript errors and the URL of every request."""
    width, height = viewport
    page = browser.new_page(viewport={"width": width, "height": height})
    page.on("pageerror", lambda error: errors.append(f"{page.url}: {error}"))
    page.on("request", lambda request: requests.append(request.url))
    return page


def typeset(page) -> bool:
    """Whether MathJax has typeset every formula of the page (as an SVG) within 15 s."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

    try:
        page.wait_for_function(EVERY_FORMULA_TYPESET, timeout=15000)
    except PlaywrightTimeoutError:
        return False
    return True


def check_formulas(page, url: str, name: str, shots: pathlib.Path) -> list[str]:
    """Open one page (at the tab's width): every formula typeset, none left as raw TeX, every display formula wide
    enough to read. Saves a screenshot, scrolled to the first display formula, of the SCREENSHOT_PAGES."""
    failures = []
    width = page.viewport_size["width"]
    page.goto(url)
    if not typeset(page):
        failures.append(f"{name}: not every formula was typeset (no mjx-container svg)")
    formulas = page.locator(".arithmatex")
    raw = [text for text in formulas.all_inner_texts() if "\\" in text]
    if raw:
        failures.append(f"{name}: raw TeX still shown: {raw[:2]}")
    widths = [round(w) for w in page.evaluate(DISPLAY_FORMULA_WIDTHS)]
    collapsed = [w for w in widths if w <= MIN_FORMULA_WIDTH]
    if not widths or collapsed:
        failures.append(f"{name} at {width} px: {len(collapsed)} of {len(widths)} display formula(s) "
                        f"{MIN_FORMULA_WIDTH} px wide or less: widths {widths} px")
    print(f"{name} at {width} px: {formulas.count()} formula(s), display formulas {widths} px wide")
    if name in SCREENSHOT_PAGES:
        page.locator("div.arithmatex").first.scroll_into_view_if_needed()
        page.screenshot(path=str(shots / f"{name}-{width}.png"))
    return failures

# For every code block, display formula and table of the page: its kind, its rendered width and the width of the
# column it sits in (the box that would scroll it). A table sits in Material's scrolling wrapper; a code block's
# <code> scrolls itself; a formula's div.arithmatex scrolls its MathJax SVG.
OVERFLOWS = """() => {
  const within = (box) => Math.ceil(box.scrollWidth) > Math.ceil(box.clientWidth) + 1;
  const found = [];
  for (const code of document.querySelectorAll('article pre > code')) {
    if (within(code)) found.push(['code block', code.innerText.split('\\n')
      .reduce((a, b) => (b.length > a.length ? b : a), '').slice(0, 60)]);
  }
  for (const formula of document.querySelectorAll('article div.arithmatex')) {
    if (within(formula)) found.push(['formula', formula.innerText.replace(/\\s+/g, '').slice(0, 60)]);
  }
  for (const wrap of document.querySelectorAll('article .md-typeset__scrollwrap')) {
    if (within(wrap)) found.push(['table', wrap.querySelector('th, td')?.innerText.slice(0, 60) ?? '']);
  }
  return found;
}"""
# What must fit at each width (the rest is reported, not failed): everything on a desktop, formulas on a phone.
MUST_FIT = {1280: ("code block", "formula", "table"), 375: ("formula",)}


def content_pages(site: pathlib.Path) -> list[str]:
    """The pages written in docs/*.md (and the repository pages the site includes), not the API reference."""
    names = []
    for html in sorted(site.rglob("*.html")):
        name = html.relative_to(site).with_suffix("").as_posix()
        if not name.startswith(("api/", "404", "assets/")) and (ROOT / "docs" / f"{name}.md").exists():
            names.append(name)
    return names


def check_layout(browser, base: str, site: pathlib.Path, errors: list[str], requests: list[str]) -> list[str]:
    """Every content page at each width: nothing that must fit (MUST_FIT) is wider than its column."""
    failures = []
    for viewport in VIEWPORTS:
        width = viewport[0]
        tab = open_page(browser, viewport, errors, requests)
        counts: dict[str, int] = {}
        for name in content_pages(site):
            tab.goto(page_url(base, site, name))
            typeset(tab)  # a formula's width is known once MathJax has drawn it
            for kind, text in tab.evaluate(OVERFLOWS):
                counts[kind] = counts.get(kind, 0) + 1
                if kind in MUST_FIT[width]:
                    failures.append(f"layout at {width} px: {name}: a {kind} wider than its column: {text!r}")
        tab.close()
        print(f"layout at {width} px: wider than their column: "
              f"{', '.join(f'{n} {kind}(s)' for kind, n in sorted(counts.items())) or 'nothing'}"
              f" (must fit: {', '.join(MUST_FIT[width])})")
    return failures


def check_from_disk(browser, site: pathlib.Path, requests: list[str]) -> list[str]:
    """Open site/index.html as a file, with no server, and click through: every navigation link must lead to an
    HTML file (a link to a folder would show the browser's folder listing), and a page's formulas must render."""
    # Its JavaScript errors are not recorded: search cannot load from disk (browsers refuse file:// fetches).
    page = open_page(browser, VIEWPORTS[0], [], requests)
    page.goto((site / "index.html").as_uri())
    hrefs = page.evaluate("() => [...document.querySelectorAll('nav.md-nav--primary a.md-nav__link[href]')]"
                          ".map(a => a.href)")
    not_files = [h for h in hrefs if not pathlib.Path(url2pathname(urlsplit(h).path)).is_file()]
    if not hrefs or not_files:
        page.close()
        return [f"from disk: {len(not_files)} of {len(hrefs)} navigation links lead to no HTML file: {not_files[:3]}"]
    page.locator('nav.md-nav--primary a.md-nav__link[href="attention.html"]').first.click()
    page.wait_for_load_state()
    widths = [round(w) for w in page.evaluate(DISPLAY_FORMULA_WIDTHS)] if typeset(page) else []
    failures = []
    if not page.url.endswith("/attention.html") or not widths or min(widths) <= MIN_FORMULA_WIDTH:
        failures.append(f"from disk: clicking 'attention' led to {page.url}, display formulas {widths} px wide")
    print(f"from disk: {len(hrefs)} navigation links, all to HTML files; attention.html by a click, "
          f"display formulas {widths} px wide")
    page.close()
    return failures


def external_requests(urls: list[str]) -> list[str]:
    """The requested URLs that leave this machine (file:, data: and blob: URLs have no host and stay)."""
    return [url for url in urls if urlsplit(url).hostname not in {None, *LOCAL_HOSTS}]


def check(site: pathlib.Path, shots: pathlib.Path) -> list[str]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise SystemExit("Playwright is not installed: pip install playwright (it uses the system's Chromium)")
    sys.path.insert(0, str(ROOT / "src"))
    from torchformer.nn.attention import MultiHeadAttention

    failures = []
    errors, requests = [], []  # every page's JavaScript errors, and the URL of every request any page makes
    shots.mkdir(parents=True, exist_ok=True)
    with serve(site) as base, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=find_chromium(), args=["--no-sandbox"])
        page = open_page(browser, VIEWPORTS[0], errors, requests)

        # 1. The home page, and the search index: typing a query must list results.
        page.goto(f"{base}/")
        if "torchformer" not in page.title():
            failures.append(f"home page: title is {page.title()!r}")
        page.fill("input.md-search__input", "rotary")
        try:
            page.wait_for_selector(".md-search-result__item", timeout=15000)
            count = page.locator(".md-search-result__item").count()
            print(f"search: {count} results for 'rotary'")
        except Exception:
            failures.append("search: no results for 'rotary' (the search index did not load)")
        page.screenshot(path=str(shots / "search.png"))

        # 2. Every page with display formulas, at each width: MathJax must have replaced every formula's TeX by an
        # SVG a reader can see (a page that typesets fine on a desktop can still squeeze its formulas on a phone).
        formula_pages = display_formula_pages(site)
        if not formula_pages:
            failures.append("no page of the site has a display formula (was it built with pymdownx.arithmatex?)")
        for viewport in VIEWPORTS:
            tab = open_page(browser, viewport, errors, requests)
            tab.goto(page_url(base, site, "index"))
            tab.screenshot(path=str(shots / f"index-{viewport[0]}.png"))
            for name in formula_pages:
                failures += check_formulas(tab, page_url(base, site, name), name, shots)
            tab.close()

        # 3. An API page: MultiHeadAttention's section lists every argument of its constructor, and SelfAttention
        # (which takes that constructor) links to it instead of repeating them.
        page.goto(page_url(base, site, "api/torchformer.nn.attention"))
        section = page.locator("div.doc-class:has(> h2#torchformer\\.nn\\.attention\\.MultiHeadAttention)")
        subclass = page.locator("div.doc-class:has(> h2#torchformer\\.nn\\.attention\\.SelfAttention)")
        if section.count() != 1 or subclass.count() != 1:
            failures.append("API page: no section for MultiHeadAttention or SelfAttention")
        else:
            names = [n for n in inspect.signature(MultiHeadAttention.__init__).parameters if n != "self"]
            # The "Parameters:" table of the class's own docstring (not a nested method's): one row per argument.
            table = section.locator("> div.doc-contents").first.locator("table").first  # Material wraps tables
            listed = [cell.strip() for cell in table.locator("tr.doc-section-item > td:first-child").all_inner_texts()]
            if listed != names:
                failures.append(f"API page: MultiHeadAttention's parameter table lists {listed}, the signature {names}")
            signature = subclass.locator(".doc-signature").first.inner_text()
            if not all(name in signature for name in names):
                failures.append(f"API page: SelfAttention's signature is incomplete: {signature!r}")
            own = subclass.locator("> div.doc-contents").first
            link = own.locator("a[href*='MultiHeadAttention']").count()
            if not link:
                failures.append("API page: SelfAttention's section has no link to MultiHeadAttention's arguments")
            print(f"API page: MultiHeadAttention's parameter table lists its {len(names)} arguments "
                  f"({', '.join(listed)}); SelfAttention's signature has them and links there")
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
            page.goto(page_url(base, site, name))
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

        # 5. The site opened from disk, as the README suggests; then, of all the pages above, no request may have
        # left 127.0.0.1: with no network, a font or script from elsewhere fails (and a reader waits for it).
        failures += check_from_disk(browser, site, requests)
        # 6. The layout: what a reader would have to scroll sideways.
        failures += check_layout(browser, base, site, errors, requests)
        outside = external_requests(requests)
        if outside:
            failures.append(f"network: {len(outside)} request(s) to other hosts than 127.0.0.1: {sorted(set(outside))}")
        print(f"network: {len(requests)} requests, {len(outside)} to other hosts than 127.0.0.1")
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
