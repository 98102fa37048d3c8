"""Looking inside a trained model: the attention weights of one layer, and a picture of them.

The fast attention path (``scaled_dot_product_attention``) never materialises the weights, so a model trained
and run with it cannot simply hand them out. Instead we *replay* one attention layer: a forward pre-hook records
exactly the inputs the layer received during an ordinary forward pass (after the embedding, the earlier blocks
and, for pre-norm blocks, the layer normalisation), and the layer is then called again on those inputs with
``return_weights=True``, which uses the readable reference path. Because the hook sits on the attention module
itself, the result is right for pre-norm and post-norm blocks alike, and for self- and cross-attention.

* :func:`capture_attention`: the weights of any attention module while ``model(*args)`` runs (e.g. the
  cross-attention of an encoder-decoder's last decoder block).
* :func:`attention_weights`: the common case, the self-attention of block ``layer`` of a classifier or
  generator, ``(b, t) -> (b, h, t, t)``.
* :func:`plot_attention`: any ``(t, u)`` matrix as a labelled heat map PNG (matplotlib optional).

Shapes: b batch size, h heads, t queries, u keys (``t`` for self-attention, the context length for cross).
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Iterable, Sequence

import torch
from torch import Tensor, nn

from torchformer._checks import is_integral
from torchformer._files import check_png_path
from torchformer.nn.attention import MultiHeadAttention
from torchformer.saving import unwrap_model

__all__ = ["attention_weights", "capture_attention", "plot_attention"]


@torch.no_grad()
def capture_attention(model: nn.Module, attention: nn.Module, *args: Any, **kwargs: Any) -> Tensor:
    """Run ``model(*args, **kwargs)`` once and return the weights ``(b, h, t, u)`` of the module ``attention``.

    Run a full forward pass, not incremental decoding with caches: the replay sees only the new positions.
    Rows sum to 1 over the keys a query may see; masked keys (padding, the future) get exactly 0. Runs without
    gradients; put the model in ``eval()`` mode first if dropout should not change the captured input.

    Args:
        model: the model (or any callable) whose forward pass calls ``attention``.
        attention: the :class:`~torchformer.nn.attention.SelfAttention` or
            :class:`~torchformer.nn.attention.CrossAttention` to look into, which the forward pass calls exactly once.
        *args: what ``model`` takes, e.g. token ids ``(b, t)``.
        **kwargs: ``model``'s keyword arguments.

    Returns:
        The attention weights ``(b, h, t, u)`` (``u = t`` for self-attention, the context length for cross).

    Raises:
        TypeError: ``model`` is not callable, or ``attention`` is not a torchformer attention module.
        ValueError: the forward pass called ``attention`` other than exactly once.
    """
    if not callable(model):
        raise TypeError(f"model must be a torch.nn.Module (callable), got {type(model).__name__}")
    if not isinstance(attention, MultiHeadAttention):
        raise TypeError(f"attention must be a SelfAttention or CrossAttention module, got {type(attention).__name__}")
    calls: list[tuple[tuple, dict]] = []

    def record(module: nn.Module, inputs: tuple, options: dict) -> None:
        calls.append((inputs, options))

    handle = attention.register_forward_pre_hook(record, with_kwargs=True)
    try:
        model(*args, **kwargs)
    finally:
        handle.remove()
    if len(calls) != 1:
        raise ValueError(
            f"attention must be called exactly once by the model's forward pass, it was called {len(calls)} times"
        )
    inputs, options = calls[0]
    options = {k: v for k, v in options.items() if k not in ("cache", "return_weights")}
    _, weights = attention(*inputs, **options, return_weights=True)
    return weights


def attention_weights(model: nn.Module, ids: Tensor, mask: Tensor | None = None, *, layer: int = -1) -> Tensor:
    """Self-attention weights ``(b, h, t, t)`` of block ``layer`` for token ids ``(b, t)`` (and a padding mask).

    Put the model in ``eval()`` mode first if dropout should not change the captured input.

    Args:
        model: a :class:`~torchformer.models.CTransformer`, :class:`~torchformer.models.GTransformer` or another
            model with ``self_attention_layers()``, compiled or not.
        ids: token ids ``(b, t)``.
        mask: bool ``(b, t)``, ``True`` at real tokens, for a model that takes one (a classifier's or a generator's
            padding mask); ``None``: no mask.
        layer: which block's self-attention, indexed like a list (``-1``: the last).

    Returns:
        The weights ``(b, h, t, t)``: row ``i`` is how query ``i`` spreads its attention over the keys.

    Raises:
        TypeError: the model has no ``self_attention_layers()``, cannot be called as ``model(ids)``, or takes no
            ``mask`` but got one.
        ValueError: ``layer`` is not an int indexing the layers.
    """
    inner = unwrap_model(model)
    layers = inner.self_attention_layers() if callable(getattr(inner, "self_attention_layers", None)) else None
    if layers is None:
        raise TypeError(
            f"model must have a self_attention_layers() method (CTransformer and GTransformer do), got "
            f"{type(inner).__name__}; use capture_attention() for other models"
        )
    if not is_integral(layer) or not -len(layers) <= layer < len(layers):
        raise ValueError(f"layer must be an int in [{-len(layers)}, {len(layers)}), got {layer!r}")
    call = (ids,) if mask is None else (ids, mask)
    try:
        inspect.signature(inner.forward).bind(*call)
    except TypeError:
        if mask is None:
            raise TypeError(f"model ({type(inner).__name__}) cannot be called as model(ids); use capture_attention() "
                            f"with the arguments its forward() takes") from None
        raise TypeError(
            f"mask must be None for a {type(inner).__name__}: its forward() takes no padding mask, got a "
            f"{type(mask).__name__}; call attention_weights(model, ids)"
        ) from None
    except ValueError:  # no signature to read (a builtin): let the call itself say what is wrong
        pass
    return capture_attention(inner, layers[int(layer)], *call)


def plot_attention(weights: Tensor, *, x_labels: Sequence[str], y_labels: Sequence[str], path: str | os.PathLike,
                   title: str | None = None) -> bool:
    """Draw a ``(t, u)`` matrix as a heat map PNG at ``path``.

    Pass one head (``weights[0, head]``) or the mean over heads (``weights[0].mean(0)``). Nothing is assumed about
    the values, so cross-attention and any other matrix work too.

    Args:
        weights: the matrix ``(t, u)``, real numbers on any device.
        x_labels: ``u`` labels of the keys (the columns); a str gives one label per character.
        y_labels: ``t`` labels of the queries (the rows); likewise.
        path: the PNG file to write, ending in ``.png`` (an existing folder, an empty path or another suffix is
            refused: matplotlib would write the picture elsewhere, e.g. ``folder.png`` next to the folder); missing
            parent folders are created.
        title: a title above the picture; ``None``: none.

    Returns:
        ``True`` when the PNG was written, ``False`` when matplotlib is not installed.

    Raises:
        ValueError: ``weights`` is not a non-empty 2-D tensor, the labels do not match its shape, or ``path`` is
            not a ``.png`` file path.
        TypeError: ``weights`` is complex, or a label argument is not a sequence.
    """
    if not isinstance(weights, Tensor) or weights.dim() != 2:
        shape = tuple(weights.shape) if isinstance(weights, Tensor) else type(weights).__name__
        raise ValueError(f"weights must be a 2-D (t, u) tensor, got {shape}")
    if weights.dtype.is_complex:
        raise TypeError(f"weights must hold real numbers, got dtype {weights.dtype}")
    t, u = weights.shape
    if t == 0 or u == 0:
        raise ValueError(f"weights must have at least one row and one column, got shape {(t, u)}")
    x_labels, y_labels = _labels(x_labels, "x_labels"), _labels(y_labels, "y_labels")
    path = check_png_path(path, "path")
    if len(y_labels) != t or len(x_labels) != u:
        raise ValueError(
            f"weights has shape (t, u) = ({t}, {u}), so y_labels needs {t} labels and x_labels {u}; "
            f"got {len(y_labels)} and {len(x_labels)}"
        )
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return False

    # Figure + FigureCanvasAgg instead of pyplot: no global figure registry, no GUI backend.
    size = 0.22  # inches per row/column, so labels stay readable
    fig = Figure(figsize=(min(3 + size * u, 40), min(2.5 + size * t, 40)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(weights.detach().float().cpu().numpy(), cmap="viridis", aspect="auto", interpolation="nearest")
    fig.colorbar(image, ax=ax, fraction=0.03, pad=0.02)
    ax.set_xticks(range(u), [str(s) for s in x_labels], rotation=90, fontsize=7)
    ax.set_yticks(range(t), [str(s) for s in y_labels], fontsize=7)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query")
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, format="png")
    return True


def _labels(labels: object, name: str) -> list:
    """Tick labels as a list (a str counts as one label per character, as for a byte-level model's text)."""
    if isinstance(labels, bytes) or not isinstance(labels, Iterable):
        raise TypeError(f"{name} must be a sequence of labels, got {type(labels).__name__}")
    return list(labels)
