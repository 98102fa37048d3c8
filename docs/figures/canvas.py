"""What every figure of the docs shares: a matplotlib figure without pyplot, saved the same way every time."""

from __future__ import annotations

import pathlib

DPI = 110  # sharp enough on a screen, small enough to check in (each file stays well under 150 KB)


def new_figure(width: float, height: float):
    """A matplotlib Figure with its own Agg canvas: no pyplot, no global state, no GUI backend needed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height))
    FigureCanvasAgg(figure)
    return figure


def save(figure, path: pathlib.Path) -> None:
    """Write ``figure`` to ``path`` as a PNG, with no "Software" entry (matplotlib's version): the same drawing
    gives the same bytes, so ``git status`` shows only the figures that really changed."""
    figure.savefig(path, dpi=DPI, format="png", metadata={"Software": None})
