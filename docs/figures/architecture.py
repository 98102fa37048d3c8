"""The architecture figure: the package as boxes, and an arrow A -> B wherever A imports B, read from the code.

Every module under ``src/torchformer`` (and every script in ``examples/``) is parsed with ``ast``; every ``import``
and ``from ... import`` at any depth counts, those inside functions included, relative imports resolved, and
``from torchformer import X`` counts as an import of the module that defines ``X`` (the package's ``__init__``
only re-exports). The modules are grouped into the boxes of ``BOXES`` and the imports collapsed to edges between
boxes. Before drawing, the script checks:

* every module lies in exactly one box (a new top-level module must be given one);
* the layering the project keeps: the core (config, nn, models, decoding, saving, pretrained) imports nothing
  from the experiment support (train, data, scripts) or the examples, the private helpers import no box, the
  package's ``__init__`` re-exports the core only, and there is no import cycle between boxes;
* the picture draws exactly the edges the code has: each arrow of ``ROUTES`` and each branch of ``BUSES`` is an
  edge, and each edge has one (the examples' and the helpers' edges are written out in their bars).

If the code and the picture disagree, it stops with an AssertionError that names the edges.

Registered in ``docs/make_figures.py`` (``FIGURES``), which draws it:

    python docs/make_figures.py --only architecture
"""

from __future__ import annotations

import ast
import pathlib
from dataclasses import dataclass
from typing import Iterable, Optional

import torchformer

from figures.canvas import new_figure, save

PACKAGE = pathlib.Path(torchformer.__file__).resolve().parent  # src/torchformer
EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


@dataclass(frozen=True)
class Box:
    """One box: the modules it holds (dotted prefixes) and what it is for, in a line or two."""

    modules: tuple[str, ...]
    role: str
    group: str  # "core", "support", "examples" or "helpers": its colour, and the layering rule


BOXES: dict[str, Box] = {
    "examples": Box(("examples",), "the scripts you run", "examples"),
    "scripts": Box(("torchformer.scripts",), "shared by the examples:\nflags, launch, ablations", "support"),
    "train": Box(("torchformer.train",), "checkpoints, the loop,\nmetrics, FLOPs, DDP", "support"),
    "data": Box(("torchformer.data",), "enwik8, IMDb,\ntokenizers, batching", "support"),
    "pretrained": Box(("torchformer.pretrained",), "Hugging Face checkpoints\nin and out: GPT-2, Llama, …",
                      "core"),
    "saving": Box(("torchformer.saving",), "a model's own files:\nthe record, the export", "core"),
    "models": Box(("torchformer.models", "torchformer.families", "torchformer.baselines"),
                  "models, families, baselines:\ncomplete models from a config", "core"),
    "decoding": Box(("torchformer.decoding",), "sampling, generate,\nbeam search", "core"),
    "nn": Box(("torchformer.nn",), "attention, caches,\nmasks, blocks, heads", "core"),
    "config": Box(("torchformer.config",), "TransformerConfig:\nevery choice as data", "core"),
    "helpers": Box(("torchformer._checks", "torchformer._devices", "torchformer._files", "torchformer._version"),
                   "private helpers", "helpers"),
}
FRONT_DOOR = "torchformer"  # the package's __init__: re-exports, in no box
CORE = tuple(name for name, box in BOXES.items() if box.group == "core")
ABOVE_CORE = tuple(name for name, box in BOXES.items() if box.group in ("support", "examples"))


# --- the edges, from the code -------------------------------------------------------------------------------------


def module_files() -> dict[str, pathlib.Path]:
    """Every module of the package by dotted name (a package by its ``__init__.py``), and each example script as
    ``examples.NAME``."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    for path in sorted(EXAMPLES.glob("*.py")):
        modules[f"examples.{path.stem}"] = path
    return modules


def box_of(module: str) -> Optional[str]:
    """The box that holds ``module``; ``None`` for the package's ``__init__``. Raises if no box (or two) holds it."""
    if module == FRONT_DOOR:
        return None
    found = [name for name, box in BOXES.items()
             if any(module == prefix or module.startswith(prefix + ".") for prefix in box.modules)]
    if len(found) != 1:
        raise AssertionError(f"{module} is in {len(found)} boxes of the architecture figure, not one: add it to BOXES")
    return found[0]


def parse(path: pathlib.Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def reexports(modules: dict[str, pathlib.Path]) -> dict[str, str]:
    """``{name: module}`` for the names the package's ``__init__`` re-exports: its ``from m import name``, and the
    experiment support it imports on first use (the ``_EXPERIMENT_SUPPORT`` table)."""
    found = {}
    for node in parse(modules[FRONT_DOOR]).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(FRONT_DOOR):
            found.update((alias.asname or alias.name, node.module) for alias in node.names)
        elif (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
              and any(isinstance(t, ast.Name) and t.id == "_EXPERIMENT_SUPPORT" for t in node.targets)):
            found.update(ast.literal_eval(node.value))
    return found


def imported_modules(module: str, modules: dict[str, pathlib.Path], exported: dict[str, str]) -> set[str]:
    """The torchformer modules that ``module`` imports, at any depth."""
    path = modules[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()

    def known(name: str) -> Optional[str]:  # a.b.c -> the longest prefix that is a module
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Import):
            targets = [known(alias.name) for alias in node.names if alias.name.split(".")[0] == FRONT_DOOR]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from .x import y
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            if base.split(".")[0] != FRONT_DOOR:
                continue
            targets = []
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:  # from torchformer.nn import attention: a module
                    targets.append(f"{base}.{alias.name}")
                elif base == FRONT_DOOR and alias.name in exported:  # from torchformer import X: X's own module
                    targets.append(exported[alias.name])
                else:
                    targets.append(known(base))
        else:
            continue
        found.update(t for t in targets if t and t != module)
    return found


def module_edges() -> dict[str, set[str]]:
    """``{module: the torchformer modules it imports}`` for every module and example."""
    modules = module_files()
    exported = reexports(modules)
    return {module: imported_modules(module, modules, exported) for module in modules}


def box_edges(edges: Optional[dict[str, set[str]]] = None) -> set[tuple[str, str]]:
    """``{(A, B)}``: some module of box A imports some module of box B (A != B). The package's ``__init__`` is no
    box: its imports are checked by ``check_front_door``."""
    edges = module_edges() if edges is None else edges
    found = set()
    for importer, targets in edges.items():
        a = box_of(importer)
        for target in targets:
            b = box_of(target)
            if a is not None and b is not None and a != b:
                found.add((a, b))
    return found


def check_front_door(edges: dict[str, set[str]]) -> None:
    """The package's ``__init__`` imports the core (and the helpers) only: ``import torchformer`` loads no
    training or data code."""
    outside = sorted(t for t in edges[FRONT_DOOR] if box_of(t) not in CORE + ("helpers",))
    if outside:
        raise AssertionError(f"torchformer/__init__.py imports {outside}, outside the core")


def cycle(edges: Iterable[tuple[str, str]]) -> Optional[list[str]]:
    """One import cycle between boxes (``[a, b, a]``), or ``None``."""
    graph: dict[str, list[str]] = {}
    for a, b in sorted(edges):
        graph.setdefault(a, []).append(b)
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> Optional[list[str]]:
        state[node] = 1
        path.append(node)
        for nxt in graph.get(node, []):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def check_layering(edges: set[tuple[str, str]]) -> None:
    """Raise unless the box edges keep the project's layering: the core imports nothing from the experiment
    support or the examples, the helpers import no box, and no two boxes import each other, even round about."""
    upward = sorted((a, b) for a, b in edges if a in CORE and b in ABOVE_CORE)
    if upward:
        raise AssertionError(f"the core imports experiment support: {', '.join(f'{a} -> {b}' for a, b in upward)}")
    helpers = sorted(b for a, b in edges if a == "helpers")
    if helpers:
        raise AssertionError(f"the private helpers import {', '.join(helpers)}")
    loop = cycle(edges)
    if loop:
        raise AssertionError(f"an import cycle between boxes: {' -> '.join(loop)}")


# --- the picture --------------------------------------------------------------------------------------------------

# Data units, y upwards: (left, bottom, width, height) of each box. The core on the left, one box under the other,
# with nn and config at the bottom; the experiment support on the right; the examples and the helpers as bars.
ROW_H = 1.6
CORE_X, CORE_W = 0.9, 5.6
RIGHT_X, RIGHT_W = 7.9, 4.1
ROWS = {"top": 12.1, "saving": 9.9, "models": 7.7, "decoding": 5.5, "bottom": 3.2}  # box centres
PLACES = {
    "examples": (0.0, 14.0, 12.0, 1.45),
    "scripts": (RIGHT_X, ROWS["top"] - ROW_H / 2, RIGHT_W, ROW_H),
    "train": (RIGHT_X, 8.8 - ROW_H / 2, RIGHT_W, ROW_H),
    "data": (RIGHT_X, ROWS["decoding"] - ROW_H / 2, RIGHT_W, ROW_H),
    "pretrained": (CORE_X, ROWS["top"] - ROW_H / 2, CORE_W, ROW_H),
    "saving": (CORE_X + 0.7, ROWS["saving"] - ROW_H / 2, CORE_W - 0.7, ROW_H),  # room on its left for one arrow
    "models": (CORE_X, ROWS["models"] - ROW_H / 2, CORE_W, ROW_H),
    "decoding": (CORE_X, ROWS["decoding"] - ROW_H / 2, CORE_W, ROW_H),
    "config": (0.05, ROWS["bottom"] - ROW_H / 2, 3.55, ROW_H),
    "nn": (4.15, ROWS["bottom"] - ROW_H / 2, 3.5, ROW_H),
    "helpers": (0.0, 0.25, 12.0, 1.45),
}
CONFIG_BUS_X, NN_BUS_X = 0.45, 7.2  # the lines that gather the arrows into config (left) and nn (right)
CHANNEL_X = CORE_X + 0.35  # pretrained -> models, beside saving



def _mid(name: str) -> float:
    return PLACES[name][1] + PLACES[name][3] / 2


def _right(name: str) -> float:
    return PLACES[name][0] + PLACES[name][2]


def _bottom(name: str) -> float:
    return PLACES[name][1]


def _top_of(name: str) -> float:
    return PLACES[name][1] + PLACES[name][3]


# The arrows drawn one by one, as polylines (the arrowhead at the end), and the branches of the two buses: every
# edge between the boxes of the middle is one or the other, and nothing else is drawn (check_picture).
ROUTES: dict[tuple[str, str], list[tuple[float, float]]] = {
    ("scripts", "train"): [(RIGHT_X + RIGHT_W / 2, _bottom("scripts")), (RIGHT_X + RIGHT_W / 2, _top_of("train"))],
    ("train", "saving"): [(RIGHT_X, _mid("saving") - 0.45), (_right("saving"), _mid("saving") - 0.45)],
    ("train", "models"): [(RIGHT_X, _mid("models") + 0.45), (_right("models"), _mid("models") + 0.45)],
    ("pretrained", "saving"): [(3.9, _bottom("pretrained")), (3.9, _top_of("saving"))],
    ("pretrained", "models"): [(CHANNEL_X, _bottom("pretrained")), (CHANNEL_X, _top_of("models"))],
    ("saving", "models"): [(3.9, _bottom("saving")), (3.9, _top_of("models"))],
    ("models", "decoding"): [(3.7, _bottom("models")), (3.7, _top_of("decoding"))],
    ("decoding", "config"): [(2.2, _bottom("decoding")), (2.2, _top_of("config"))],
    ("decoding", "nn"): [(5.2, _bottom("decoding")), (5.2, _top_of("nn"))],
    ("nn", "config"): [(PLACES["nn"][0], _mid("nn")), (_right("config"), _mid("config"))],
}
BUSES: dict[str, tuple[float, list[str]]] = {  # target: (the bus's x, the boxes whose branches join it)
    "config": (CONFIG_BUS_X, ["pretrained", "saving", "models"]),
    "nn": (NN_BUS_X, ["pretrained", "train", "saving", "models"]),
}
BRANCH_Y = {"pretrained": _mid("pretrained"), "saving": _mid("saving") + 0.35, "models": _mid("models") - 0.35,
            "train": PLACES["train"][1] + ROW_H / 2}
BRIDGES = {("train", "saving"), ("train", "models"), ("pretrained", "models")}  # they cross a bus or a branch
COLOURS = {"core": "#c9daf8", "support": "#d9ead3", "examples": "#fce5cd", "helpers": "#eeeeee"}
FRAMES = {"core": "#f3f6fc", "support": "#f4f9f2"}
INK, GREY = "#333333", "#555555"


def drawn_edges() -> set[tuple[str, str]]:
    return set(ROUTES) | {(source, target) for target, (_, sources) in BUSES.items() for source in sources}


def check_picture(edges: set[tuple[str, str]]) -> None:
    """Raise unless the arrows and bus branches are exactly the edges between the boxes of the middle (the
    examples' and the helpers' edges are written in their bars)."""
    middle = {(a, b) for a, b in edges if "examples" not in (a, b) and "helpers" not in (a, b)}
    drawn = drawn_edges()
    missing, extra = sorted(middle - drawn), sorted(drawn - middle)
    if missing or extra:
        raise AssertionError(f"the architecture figure is out of date: in the code, not drawn: {missing}; drawn, "
                             f"not in the code: {extra} (update ROUTES or BUSES)")


def listed(names: Iterable[str]) -> str:
    order = list(BOXES)
    return ", ".join(sorted(names, key=order.index))


def draw_architecture(path: pathlib.Path, quick: bool = False) -> str:
    """The boxes, the arrows between them, the examples on top and the helpers below."""
    from matplotlib import patheffects
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    modules = module_edges()
    check_front_door(modules)
    edges = box_edges(modules)
    check_layering(edges)
    check_picture(edges)

    xlim, ylim = (-0.1, 12.1), (0.15, 16.65)
    width = 6.4
    figure = new_figure(width, width * (ylim[1] - ylim[0]) / (xlim[1] - xlim[0]))
    ax = figure.add_axes([0, 0, 1, 1])
    bridge = [patheffects.withStroke(linewidth=5.5, foreground="white")]  # a line that crosses another, not joins it

    def arrow(points, over=False):
        *line, last = points
        style = dict(color=INK, lw=1.8, solid_capstyle="butt", zorder=4 if over else 3)
        if len(points) > 2:
            ax.plot(*zip(*line, points[-2]), **style, path_effects=bridge if over else None)
        ax.add_patch(FancyArrowPatch(points[-2], last, arrowstyle="-|>", mutation_scale=18, lw=1.8, color=INK,
                                     shrinkA=0, shrinkB=0, zorder=style["zorder"],
                                     path_effects=bridge if over else None))

    # The two groups, behind the boxes.
    for group, (x0, x1), label in (("core", (-0.05, 7.7), "the transformer core"),
                                   ("support", (7.75, 12.05), "experiment support")):
        ax.add_patch(FancyBboxPatch((x0, 2.15), x1 - x0, 11.6, boxstyle="round,pad=0,rounding_size=0.2",
                                    fc=FRAMES[group], ec="#bbbbbb", lw=1, zorder=0))
        ax.text((x0 + x1) / 2, 13.45, label, ha="center", va="center", fontsize=12.5, color=GREY,
                fontstyle="italic")

    for name, (x, y, w, h) in PLACES.items():
        box = BOXES[name]
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0,rounding_size=0.15",
                                    fc=COLOURS[box.group], ec="#666666", lw=1.2, zorder=2))
        if name == "examples":
            targets = listed(b for a, b in edges if a == "examples")
            ax.text(x + 0.25, y + h - 0.42, "examples/", ha="left", va="center", fontsize=15, fontweight="bold",
                    color=INK, zorder=5)
            ax.text(x + 2.75, y + h - 0.42, box.role, ha="left", va="center", fontsize=12, color=INK, zorder=5)
            ax.text(x + 0.25, y + 0.4, f"→ {targets}", ha="left", va="center", fontsize=12, color=INK, zorder=5)
            continue
        if name == "helpers":
            importers = {a for a, b in edges if b == "helpers"}
            others = set(BOXES) - importers - {"helpers"}
            who = "every box" + (f" but {listed(others)}/" if others else "")
            ax.text(x + 0.25, y + h - 0.4, "_checks, _devices, _files, _version", ha="left", va="center",
                    fontsize=13, fontweight="bold", color=INK, zorder=5)
            ax.text(x + 0.25, y + 0.38, f"{box.role}, imported by {who}", ha="left", va="center", fontsize=12,
                    color=INK, zorder=5)
            continue
        ax.text(x + w / 2, y + h - 0.42, name, ha="center", va="center", fontsize=15, fontweight="bold",
                color=INK, zorder=5)
        ax.text(x + w / 2, y + 0.56, box.role, ha="center", va="center", fontsize=12, color=INK,
                linespacing=1.15, zorder=5)

    for edge, points in ROUTES.items():
        arrow(points, over=edge in BRIDGES)
    for target, (bus_x, sources) in BUSES.items():
        ys = [BRANCH_Y[s] for s in sources]
        for source, y in zip(sources, ys):
            x = PLACES[source][0] + (PLACES[source][2] if bus_x > PLACES[source][0] else 0)  # the side facing it
            ax.plot([x, bus_x], [y, y], color=INK, lw=1.8, solid_capstyle="butt", zorder=3)
            ax.plot([bus_x], [y], "o", color=INK, ms=6, zorder=3)
        arrow([(bus_x, max(ys)), (bus_x, _top_of(target))])

    ax.text(6.0, 15.95, "A → B: a module of A imports a module of B.\nBox X holds torchformer.X.", ha="center",
            va="center", fontsize=12, color=GREY, linespacing=1.3)
    ax.set_xlim(*xlim)
    ax.set_ylim(*ylim)
    ax.axis("off")
    save(figure, path)
    return (f"{len(edges)} box edges from the imports of {len(modules)} modules; layering checked (the core imports "
            "no experiment support, no cycle)")
