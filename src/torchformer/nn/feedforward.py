"""The position-wise feed-forward networks of a block, chosen by ``config.activation``.

Attention moves information between positions; the feed-forward network then transforms each position on its own,
with the same weights at every position. Two shapes of network:

* :class:`FeedForward`: two linear layers with a nonlinearity between, ``W2 act(W1 x + b1) + b2``, hidden size
  ``h = ff_mult * e``. ``act`` is ``"relu"`` (Vaswani et al.), ``"gelu"`` (BERT), ``"gelu_tanh"`` (GELU's tanh
  approximation, which GPT-2's code uses) or ``"relu2"``, ReLU squared (So et al. 2021, "Primer"), which an
  architecture search found to train faster at no cost. With ``bias=False`` (the config's ``ff_bias``) it has no
  biases, as T5's.
* :class:`GatedFeedForward`: a gated linear unit (Shazeer 2020), ``W2 (act(W1 x) * (V x))``, with
  ``act = SiLU`` (``"swiglu"``), ``GELU`` (``"geglu"``) or GELU's tanh approximation (``"geglu_tanh"``, T5 v1.1's
  and flan-T5's ``gated-gelu``). One path through the nonlinearity decides, component by
  component, how much of a second, linear path passes. It has three matrices instead of two, so its hidden size is
  ``2/3`` of ``ff_mult * e`` to keep the parameter count about the same.

A block builds the class its ``feedforward_classes`` names for ``config.activation``: :class:`FeedForward` for the
plain nonlinearities, :class:`GatedFeedForward` for the gated units. A variant names a class of its own there, and
``from_config`` always builds the class it is called on.

Shapes: b batch size, t sequence length, e embedding size, h hidden size.
"""

from __future__ import annotations

from typing import Any, Optional

import torch.nn.functional as F
from torch import Tensor, nn

from torchformer._checks import check_bool, check_choice, check_positive_int, check_probability
from torchformer.config import TransformerConfig


class ReLUSquared(nn.Module):
    """``relu(x)^2`` (So et al. 2021): zero for negative inputs like ReLU, but growing quadratically.

    Shapes:
        ``forward(x)``: any shape -> the same shape, element by element.
    """

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(x).square()


class GELUTanh(nn.GELU):
    r"""GELU's tanh approximation, GPT-2's ``gelu_new``: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``.

    $$
    \operatorname{GELU}_{\tanh}(x) = \tfrac{1}{2} x \left(1 + \tanh\left(\sqrt{2/\pi}\,(x + 0.044715\,x^3)
    \right)\right)
    $$

    Written when the error function was slow to compute; it differs from the exact GELU (``"gelu"``) by less than
    ``5e-4``, which is enough to move a pretrained model's log-probabilities, so GPT-2's weights need this one.
    :class:`torch.nn.GELU` with ``approximate="tanh"``.

    Shapes:
        ``forward(x)``: any shape -> the same shape, element by element.
    """

    def __init__(self) -> None:
        super().__init__(approximate="tanh")


# Nonlinearities of the plain network, and the gates of the gated one (the activation on the W1 path).
NONLINEARITIES: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU, "gelu": nn.GELU, "gelu_tanh": GELUTanh, "relu2": ReLUSquared,
}
GATES: dict[str, type[nn.Module]] = {"swiglu": nn.SiLU, "geglu": nn.GELU, "geglu_tanh": GELUTanh}


def gated_hidden_size(emb: int, ff_mult: int) -> int:
    """The hidden size of a gated unit: ``2/3 * ff_mult * emb``, rounded to the nearest multiple of 16 (at least 16).

    A gated unit of this size has about the parameters of a plain network of hidden size ``ff_mult * emb``. A plain
    network has two ``e x 4e`` matrices (``ff_mult=4``), ``8 e^2`` weights; a gated one has three ``e x h``
    matrices, ``3 e h``, equal for ``h = 8/3 e = 2/3 * 4e``. A multiple of 16 because matrix products run slower
    on other sizes: at ``e`` 256 and 4,096 positions, forward and backward of one ``256 x h`` projection took 51 ms
    at ``h = 688`` and 64 ms at 683 (``python benchmarks/parts.py``, 1 thread of a 2-core AMD EPYC, torch
    2.13.0+cpu, 2026-11-27; GPU kernels prefer such sizes too). LLaMA rounds up to a multiple of 256; the nearest
    multiple of 16 keeps the count closer to the plain network's (688 units: 0.8 % more weights at ``e`` 256).
    Configs saved with ``config_version`` 2 or older (before 2026-11-27) sized it ``round(2/3 * ff_mult * emb)``;
    they are read with that number as ``ff_hidden`` where it differs.

    Args:
        emb: embedding size ``e``.
        ff_mult: the plain network's hidden size as a multiple of ``e``.

    Returns:
        The gated unit's hidden size ``h``.
    """
    return max(16, 16 * round(2 * ff_mult * emb / 48))


class FeedForward(nn.Module):
    r"""``W2 act(W1 x + b1) + b2``: ``(b, t, e) -> (b, t, h) -> (b, t, e)``, ``h = ff_mult * e``.

    For the vector $x$ ``(e,)`` of each position:

    $$
    \operatorname{FF}(x) = W_2 \operatorname{act}(W_1 x + b_1) + b_2
    $$

    $W_1$ ``(h, e)`` and $b_1$ are ``net[0].weight`` and ``net[0].bias``, $W_2$ ``(e, h)`` and $b_2$ are
    ``net[3].weight`` and ``net[3].bias`` (with ``bias=False`` there are no $b_1$, $b_2$); ``act`` is ReLU, GELU
    (exact or its tanh approximation) or ReLU squared (``activation``), and ``dropout`` acts on its output
    (``net[2]``, training only).

    Args:
        emb: embedding size ``e``.
        ff_mult: hidden size as a multiple of ``e``.
        hidden: the hidden size ``h``, when it is not ``ff_mult * e`` (``config.ff_hidden``); ``None``: ``ff_mult * e``.
        activation: ``"relu"``, ``"gelu"``, ``"gelu_tanh"`` or ``"relu2"`` (ReLU squared). The gated ``"swiglu"``
            and ``"geglu"`` are :class:`GatedFeedForward`, which :meth:`from_config` picks for them.
        dropout: dropout on the hidden activations.
        bias: the biases ``b1`` and ``b2`` (``True``); ``False``: none, as T5 (``config.ff_bias``).

    The layers are ``net.0`` (``W1``), ``net.1`` (the nonlinearity), ``net.2`` (dropout) and ``net.3`` (``W2``);
    checkpoints name the weights that way.

    Shapes:
        ``forward(x, mask=None)``: ``(b, t, e)`` (or any ``(..., e)``) -> ``(b, t, e)``, each position on its own;
        ``mask`` ``(b, t)`` (True at real tokens), which a block passes every feed-forward network, is not needed.
    """

    def __init__(self, emb: int, *, ff_mult: int = 4, activation: str = "relu", dropout: float = 0.0,
                 hidden: Optional[int] = None, bias: bool = True) -> None:
        super().__init__()
        check_positive_int(emb, "emb")
        check_positive_int(ff_mult, "ff_mult")
        hidden = ff_mult * emb if hidden is None else check_positive_int(hidden, "hidden")
        if activation in GATES:
            raise ValueError(
                f"activation {activation!r} is a gated linear unit, which has three matrices: build a "
                f"GatedFeedForward (a block's feedforward_classes name it for the gated units)"
            )
        check_choice(activation, "activation", tuple(NONLINEARITIES))
        check_bool(bias, "bias")
        self.net = nn.Sequential(
            nn.Linear(emb, hidden, bias=bias),
            NONLINEARITIES[activation](),
            nn.Dropout(check_probability(dropout, "dropout")),
            nn.Linear(hidden, emb, bias=bias),
        )

    @classmethod
    def from_config(cls, config: TransformerConfig, *, layer: int = 0) -> FeedForward:
        """The network of one block of ``config``: always of the class this is called on.

        A block builds the class its ``feedforward_classes`` names for ``config.activation``: this one for
        ``"relu"``, ``"gelu"``, ``"gelu_tanh"`` and ``"relu2"``, :class:`GatedFeedForward` for the gated units (this
        class refuses those).

        Args:
            config: the architecture; ``emb``, ``ff_mult`` (or ``ff_hidden``), ``activation``, ``dropout`` and
                ``ff_bias`` are used.
            layer: the block's index, from 0 at the input: unused here, as in
                :meth:`~torchformer.nn.attention.MultiHeadAttention.from_config`.

        Returns:
            The feed-forward network of one block.

        Raises:
            ValueError: ``config.activation`` is a gated unit (``"swiglu"``, ``"geglu"``, ``"geglu_tanh"``).
        """
        network = cls(config.emb, **cls.arguments_from_config(config, layer=layer))
        if config.zero_init_residual:  # the block starts as the identity (TransformerConfig.zero_init_residual)
            for parameter in network.net[-1].parameters():
                nn.init.zeros_(parameter)
        return network

    @classmethod
    def arguments_from_config(cls, config: TransformerConfig, *, layer: int) -> dict[str, Any]:
        """The keyword arguments :meth:`from_config` builds ``cls(config.emb, **arguments)`` with.

        A subclass with an argument of its own adds it (see
        :meth:`~torchformer.nn.attention.MultiHeadAttention.arguments_from_config`).

        Args:
            config: the architecture.
            layer: the block's index, from 0 at the input.

        Returns:
            ``{name: value}``: ``ff_mult``, ``activation``, ``dropout``, ``hidden`` (``ff_hidden``), ``bias``
            (``ff_bias``).
        """
        return {"ff_mult": config.ff_mult, "activation": config.activation, "dropout": config.dropout,
                "hidden": config.ff_hidden, "bias": config.ff_bias}

    def forward(self, x: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        return self.net(x)  # each position on its own: the padding mask changes nothing


class GatedFeedForward(nn.Module):
    r"""A gated linear unit (Shazeer 2020): ``W2 (act(W1 x) * (V x))``, ``(b, t, e) -> (b, t, h) -> (b, t, e)``.

    For the vector $x$ ``(e,)`` of each position:

    $$
    \operatorname{GLU}(x) = W_2 \left(\operatorname{act}(W_1 x) \odot V x\right)
    $$

    $W_1$ ``(h, e)`` is ``w1.weight``, $V$ ``(h, e)`` is ``v.weight``, $W_2$ ``(e, h)`` is ``w2.weight``; there are
    no biases. ``dropout`` acts on the product (``drop``, training only).

    ``act(W1 x)`` ``(b, t, h)`` is the gate, ``V x`` ``(b, t, h)`` the gated value; their element-wise product is
    the hidden layer. ``act`` is SiLU, ``x * sigmoid(x)`` (``"swiglu"``), GELU (``"geglu"``) or its tanh
    approximation (``"geglu_tanh"``, :class:`GELUTanh`: T5 v1.1's and flan-T5's ``gated-gelu``). The hidden size
    is ``2/3 * ff_mult * e`` to the nearest multiple of 16 (:func:`gated_hidden_size`), so the three matrices hold
    about as many weights as :class:`FeedForward`'s two. As in the paper (and PaLM, LLaMA), the layers have no
    biases.

    Args:
        emb: embedding size ``e``.
        ff_mult: the plain network's hidden size as a multiple of ``e``; this one's is 2/3 of it.
        hidden: the hidden size ``h`` (``config.ff_hidden``, Llama-2 7B's 11008); ``None``: 2/3 of ``ff_mult * e``.
        activation: ``"swiglu"``, ``"geglu"`` or ``"geglu_tanh"``.
        dropout: dropout on the hidden layer (the product).

    Shapes:
        ``forward(x, mask=None)``: ``(b, t, e)`` (or any ``(..., e)``) -> ``(b, t, e)``, each position on its own;
        ``mask`` ``(b, t)`` (True at real tokens), which a block passes every feed-forward network, is not needed.
    """

    def __init__(self, emb: int, *, ff_mult: int = 4, activation: str = "swiglu", dropout: float = 0.0,
                 hidden: Optional[int] = None) -> None:
        super().__init__()
        check_positive_int(emb, "emb")
        check_positive_int(ff_mult, "ff_mult")
        check_choice(activation, "activation", tuple(GATES))
        hidden = gated_hidden_size(emb, ff_mult) if hidden is None else check_positive_int(hidden, "hidden")
        self.w1 = nn.Linear(emb, hidden, bias=False)  # the gate's input
        self.v = nn.Linear(emb, hidden, bias=False)  # the value it gates
        self.w2 = nn.Linear(hidden, emb, bias=False)
        self.act = GATES[activation]()
        self.drop = nn.Dropout(check_probability(dropout, "dropout"))

    @classmethod
    def from_config(cls, config: TransformerConfig, *, layer: int = 0) -> GatedFeedForward:
        """The gated network ``config.activation`` names, sized by ``config.ff_mult`` (or ``config.ff_hidden``).

        Args:
            config: the architecture; ``emb``, ``ff_mult`` (or ``ff_hidden``), ``activation`` and ``dropout`` are
                used.
            layer: the block's index, from 0 at the input: unused here, as in
                :meth:`~torchformer.nn.attention.MultiHeadAttention.from_config`.

        Returns:
            The gated feed-forward network of one block.

        Raises:
            ValueError: ``config.activation`` is not a gated unit.
        """
        network = cls(config.emb, **cls.arguments_from_config(config, layer=layer))
        if config.zero_init_residual:  # the block starts as the identity (TransformerConfig.zero_init_residual)
            for parameter in network.w2.parameters():
                nn.init.zeros_(parameter)
        return network

    @classmethod
    def arguments_from_config(cls, config: TransformerConfig, *, layer: int) -> dict[str, Any]:
        """The keyword arguments :meth:`from_config` builds ``cls(config.emb, **arguments)`` with.

        As :meth:`FeedForward.arguments_from_config`, without ``bias`` (a gated unit has none).

        Args:
            config: the architecture.
            layer: the block's index, from 0 at the input.

        Returns:
            ``{name: value}``: ``ff_mult``, ``activation``, ``dropout``, ``hidden`` (``ff_hidden``).
        """
        return {"ff_mult": config.ff_mult, "activation": config.activation, "dropout": config.dropout,
                "hidden": config.ff_hidden}

    def forward(self, x: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        return self.w2(self.drop(self.act(self.w1(x)) * self.v(x)))  # (b, t, e) -> (b, t, h) -> (b, t, e)
