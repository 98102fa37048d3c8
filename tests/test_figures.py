"""docs/make_figures.py draws every figure, the pages show only figures that exist, and the checks the script makes
before drawing (that the block diagram matches the code) can fail."""

import re

import pytest

from script_loader import ROOT, load_script

DOCS = ROOT / "docs"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MAX_BYTES = 150 * 1024  # figures are checked in: keep them small


@pytest.fixture(scope="module")
def figures():
    pytest.importorskip("matplotlib")
    return load_script(DOCS / "make_figures.py")


def referenced_images() -> dict[str, list[str]]:
    """{image path relative to docs/: the pages that show it}, from the Markdown image links ``![...](images/...)``."""
    found: dict[str, list[str]] = {}
    for page in sorted(DOCS.glob("*.md")):
        for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)", page.read_text()):
            found.setdefault(target, []).append(page.name)
    return found


def test_the_script_draws_every_figure_as_a_png(figures, tmp_path):
    from matplotlib.image import imread

    figures.main(["--quick", "--out", str(tmp_path)])  # --quick: the trained figure after a few steps only
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{name}.png" for name in figures.FIGURES)
    for name in figures.FIGURES:
        path = tmp_path / f"{name}.png"
        assert path.read_bytes()[:8] == PNG_SIGNATURE, name
        assert path.stat().st_size < MAX_BYTES, name
        height, width, _ = imread(path).shape  # a PNG matplotlib can read back
        assert height > 200 and width > 200, name


def test_only_draws_the_named_figures(figures, tmp_path):
    figures.main(["--only", "masks", "--only", "sinusoids", "--out", str(tmp_path)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["masks.png", "sinusoids.png"]
    with pytest.raises(SystemExit):  # argparse: not a figure
        figures.main(["--only", "nonsense", "--out", str(tmp_path)])


def test_every_figure_is_checked_in_and_shown():
    # Without matplotlib: read the names from the script's text, not by importing it.
    names = re.findall(r'^    "([\w-]+)": draw_', (DOCS / "make_figures.py").read_text(), re.M)
    assert names, "no figure names found in make_figures.py (FIGURES changed shape?)"
    shown = referenced_images()
    for name in names:
        path = DOCS / "images" / f"{name}.png"
        assert path.read_bytes()[:8] == PNG_SIGNATURE, f"{path} is missing or not a PNG: run docs/make_figures.py"
        assert path.stat().st_size < MAX_BYTES, path
        assert f"images/{name}.png" in shown, f"no page shows images/{name}.png"


def test_every_image_a_page_shows_exists():
    shown = referenced_images()
    assert shown, "no page shows an image"
    for target, pages in shown.items():
        # Relative paths only: they work on the site and in a code host's Markdown view alike.
        assert target.startswith("images/"), f"{pages}: {target} should be a relative path images/NAME.png"
        assert (DOCS / target).is_file(), f"{pages} show {target}, which does not exist"


def test_the_block_diagram_check_catches_a_miswired_block(figures, monkeypatch):
    from torchformer.nn.blocks import TransformerBlock

    figures.check_block_wiring()  # the code as it is: passes

    def always_postnorm(self, x, norm, f):
        return norm(x + self.drop(f(x)))

    monkeypatch.setattr(TransformerBlock, "sublayer", always_postnorm)
    with pytest.raises(AssertionError, match="prenorm=True"):
        figures.check_block_wiring()


def test_the_heads_figure_checks_the_split(figures, monkeypatch):
    from torchformer.nn.attention import MultiHeadAttention

    assert figures.head_shapes(6, 3, False, 5)["split"] == (1, 3, 5, 2)
    assert figures.head_shapes(6, 3, True, 5)["split"] == (1, 3, 5, 6)

    def interleaved(self, x):  # the components dealt out to the heads in turn, not cut into consecutive pieces
        b, t, _ = x.shape
        return x.view(b, t, self.head_size, -1).permute(0, 3, 1, 2)

    monkeypatch.setattr(MultiHeadAttention, "split_heads", interleaved)
    with pytest.raises(AssertionError, match="head 0 does not get piece 0"):
        figures.head_shapes(6, 3, False, 5)


def test_the_attention_figure_checks_the_library(figures, monkeypatch):
    import torch
    from torchformer.nn import attention

    example = figures.attention_example()  # the code as it is: passes
    assert example.weights.shape == (4, 4) and example.out.shape == (4, 3)
    assert torch.equal(example.weights.triu(1), torch.zeros(4, 4, dtype=example.weights.dtype))  # causal: 0 above
    original = attention.attention_reference

    def unscaled(q, k, v, allowed=None, **kwargs):  # a wrong attention: the dot products not divided by sqrt(s)
        return original(q, k, v, allowed, scale=1.0)

    monkeypatch.setattr(attention, "attention_reference", unscaled)
    with pytest.raises(AssertionError, match="weights are not softmax"):
        figures.attention_example()


def test_the_architecture_figure_reads_the_imports(figures):
    edges = figures.box_edges()
    assert ("models", "nn") in edges and ("train", "saving") in edges
    assert ("nn", "models") not in edges
    # examples/seq2seq.py has `from torchformer import seq2seq_generate`: an import of the module that defines it.
    assert "torchformer.decoding.generation" in figures.module_edges()["examples.seq2seq"]
    # Modules are grouped into boxes: an import from nn/attention.py into train/training.py is the edge nn -> train.
    assert figures.box_edges({"torchformer.nn.attention": {"torchformer.train.training"}}) == {("nn", "train")}
    figures.check_layering(edges)  # the code as it is: passes
    figures.check_picture(edges)


def test_the_architecture_figure_checks_the_layering(figures):
    edges = figures.box_edges()
    with pytest.raises(AssertionError, match="the core imports experiment support: nn -> train"):
        figures.check_layering(edges | {("nn", "train")})  # an upward edge
    with pytest.raises(AssertionError, match="cycle between boxes: .*config"):
        figures.check_layering(edges | {("config", "models")})  # models -> config -> models
    with pytest.raises(AssertionError, match=r"not drawn: \[\('data', 'config'\)\]"):
        figures.check_picture(edges | {("data", "config")})  # a new edge the picture does not have
