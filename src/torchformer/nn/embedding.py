"""From the input to vectors: the embedding, then the position encoding, then dropout.

Token ids: :class:`TokenEmbedding` (``docs/tokens.md``); vectors: :class:`VectorEmbedding` (``docs/dense-inputs.md``).

Shapes: b batch size, t sequence length, d input features, e embedding size, v vocabulary size, k token types.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor, nn

from torchformer._checks import check_choice, check_positive_float, check_positive_int, check_probability
from torchformer.config import NORMS, TransformerConfig
from torchformer.nn.norms import make_norm
from torchformer.nn.positions import LearnedPositions, NoPositions, SinusoidalPositions


class EmbeddingPositions:
    """What an embedding adds for each value of the config's ``positions``: the class ``position_classes`` names.

    A variant replaces ``position_classes`` to try another scheme. The schemes inside attention and ``"none"`` add
    nothing here (:class:`~torchformer.nn.positions.NoPositions`).
    """

    position_classes: dict[str, type[nn.Module]] = {
        "learned": LearnedPositions, "sinusoidal": SinusoidalPositions, "none": NoPositions,
        "rotary": NoPositions, "rotary_interleaved": NoPositions, "alibi": NoPositions, "relative": NoPositions,
    }

    def position_class(self, positions: str) -> type[nn.Module]:
        """The class of the scheme ``positions`` names, which builds itself with ``from_sizes(emb, max_len)``.

        Args:
            positions: the config's ``positions``, a key of ``position_classes``.

        Raises:
            ValueError: ``positions`` is not a key of ``position_classes`` (the message lists them).
        """
        check_choice(positions, "positions", tuple(self.position_classes))
        return self.position_classes[positions]

    @staticmethod
    def embedding_norm(norm: Optional[str], emb: int, eps: float) -> Optional[nn.Module]:
        """The norm ``(..., e) -> (..., e)`` of the summed embedding (``config.embedding_norm``), or ``None`` for none.

        Args:
            norm: ``"layer"`` or ``"rms"`` (``config.norm``), or ``None``: no norm, and no module (the parameters stay
                those without the norm).
            emb: the embedding size ``e``.
            eps: added before the square root (``config.norm_eps``).

        Raises:
            ValueError: ``norm`` is neither ``None`` nor one of the norms, or ``eps`` is not a positive float.
        """
        if norm is None:
            return None
        return make_norm(check_choice(norm, "norm", NORMS), emb, eps=check_positive_float(eps, "norm_eps"))


class TokenEmbedding(EmbeddingPositions, nn.Module):
    """Token ids -> their vector, plus their type's and the position encoding; then the norm, then dropout.

    Args:
        num_tokens: vocabulary size ``v``.
        emb: embedding size ``e``.
        max_len: positions a learned position table holds (``seq_length``).
        positions: ``"learned"``, ``"sinusoidal"`` or ``"none"``.
        dropout: dropout on the sum, in ``[0, 1)``.
        num_token_types: ``k`` (BERT's segments: 2), a learned table ``types.weight`` ``(k, e)``; ``None``: no types.
        norm: ``"layer"`` or ``"rms"``: normalise the sum before the dropout (BERT: LayerNorm); ``None``: no norm.
        norm_eps: that norm's ``eps`` (BERT's is ``1e-12``).

    Raises:
        ValueError: a size is not a positive int, ``positions`` or ``norm`` is unknown, ``dropout`` not in ``[0, 1)``.

    Shapes:
        ``forward(x, positions=None, *, token_types=None)``: ids ``x`` ``(b, t)``, ``positions`` ``(t,)`` (default
        ``0 .. t-1``), ``token_types`` ``(b, t)`` ids in ``[0, k)`` (default: all 0) -> ``(b, t, e)``. Raises
        :class:`ValueError` for ``token_types`` without token types, and as :func:`check_token_types`.
    """

    def __init__(self, num_tokens: int, emb: int, max_len: int, *, positions: str = "learned", dropout: float = 0.0,
                 num_token_types: Optional[int] = None, norm: Optional[str] = None, norm_eps: float = 1e-5) -> None:
        super().__init__()
        self.num_tokens = check_positive_int(num_tokens, "num_tokens")
        self.tokens = nn.Embedding(num_tokens, check_positive_int(emb, "emb"))
        # None, not an empty module: a model without token types keeps its parameters and its printed form.
        self.types = None if num_token_types is None else nn.Embedding(
            check_positive_int(num_token_types, "num_token_types"), emb)  # (k, e)
        self.positions = self.position_class(positions).from_sizes(emb, check_positive_int(max_len, "max_len"))
        self.norm = self.embedding_norm(norm, emb, norm_eps)
        self.drop = nn.Dropout(check_probability(dropout, "dropout"))

    @classmethod
    def from_config(cls, config: TransformerConfig, *, num_tokens: Optional[int] = None) -> TokenEmbedding:
        """An embedding of ``num_tokens`` tokens (default ``config.num_tokens``; a decoder's is ``tgt_tokens``).

        Args:
            config: gives the constructor's arguments (the norm if ``embedding_norm``).
            num_tokens: the vocabulary size ``v``; ``None``: ``config.num_tokens``.

        Raises:
            ValueError: the vocabulary size or ``config.seq_length`` is ``None``.
        """
        return cls(config.num_tokens if num_tokens is None else num_tokens, config.emb,  # type: ignore[arg-type]
                   config.seq_length, positions=config.positions, dropout=config.dropout,  # type: ignore[arg-type]
                   num_token_types=config.num_token_types, norm=config.norm if config.embedding_norm else None,
                   norm_eps=config.norm_eps)

    def forward(self, x: Tensor, positions: Tensor | None = None, *, token_types: Tensor | None = None) -> Tensor:
        h = self.tokens(x)  # (b, t) -> (b, t, e)
        if self.types is not None:
            if token_types is None:  # every token of type 0, as BERT's default: one vector for all
                h = h + self.types.weight[0]  # (b, t, e) + (e,)
            else:
                check_token_types(token_types, tuple(x.shape))
                h = h + self.types(token_types)  # (b, t) -> (b, t, e)
        elif token_types is not None:
            raise ValueError("token_types must be None: this embedding has no token types (num_token_types=None), "
                             f"got a tensor of shape {tuple(token_types.shape)}")
        h = self.positions(h, positions)  # + the position encoding
        return self.drop(h if self.norm is None else self.norm(h))


def check_token_types(token_types: object, shape: tuple[int, ...]) -> None:
    """Refuse ``token_types`` unless it is an integer tensor of the token ids' shape ``(b, t)`` (shapes only).

    Args:
        token_types: the type of each token, ``(b, t)``.
        shape: the token ids' shape ``(b, t)``.

    Raises:
        TypeError: ``token_types`` is not an integer tensor.
        ValueError: its shape is not ``shape``.
    """
    if not isinstance(token_types, Tensor) or token_types.dtype.is_floating_point or token_types.dtype.is_complex \
            or token_types.dtype == torch.bool:
        kind = f"dtype {token_types.dtype}" if isinstance(token_types, Tensor) else type(token_types).__name__
        raise TypeError(f"token_types must be an integer torch.Tensor (e.g. torch.long) of shape (b, t), got {kind}")
    if tuple(token_types.shape) != tuple(shape):
        raise ValueError(f"token_types must have the token ids' shape (b, t) = {tuple(shape)}, got "
                         f"{tuple(token_types.shape)}")


class VectorEmbedding(EmbeddingPositions, nn.Module):
    """Feature vectors and their positions -> ``W x + b``, plus the position encoding, then norm and dropout.

    Args:
        input_dim: features per input vector ``d``, used as they come (normalise them: ``docs/dense-inputs.md``).
        emb: embedding size ``e``.
        max_len: positions a learned position table holds (``seq_length``).
        positions: as for :class:`TokenEmbedding`.
        dropout: as for :class:`TokenEmbedding`.
        norm: as for :class:`TokenEmbedding`.
        norm_eps: that norm's ``eps``.

    Raises:
        ValueError: as :class:`TokenEmbedding`.

    Shapes:
        ``forward(x, positions=None)``: ``(b, t, d)``, ``positions`` ``(t,)`` (default ``0 .. t-1``) -> ``(b, t, e)``.
    """

    def __init__(self, input_dim: int, emb: int, max_len: int, *, positions: str = "learned", dropout: float = 0.0,
                 norm: Optional[str] = None, norm_eps: float = 1e-5) -> None:
        super().__init__()
        self.input_dim = check_positive_int(input_dim, "input_dim")
        self.project = nn.Linear(input_dim, check_positive_int(emb, "emb"))
        self.positions = self.position_class(positions).from_sizes(emb, check_positive_int(max_len, "max_len"))
        self.norm = self.embedding_norm(norm, emb, norm_eps)
        self.drop = nn.Dropout(check_probability(dropout, "dropout"))

    @classmethod
    def from_config(cls, config: TransformerConfig) -> VectorEmbedding:
        """An embedding of ``config.input_dim``-dimensional feature vectors, with ``config``'s positions and dropout.

        Args:
            config: gives the constructor's arguments (the norm if ``embedding_norm``).

        Raises:
            ValueError: ``config.input_dim`` or ``config.seq_length`` is ``None``.
        """
        return cls(config.input_dim, config.emb, config.seq_length,  # type: ignore[arg-type]
                   positions=config.positions, dropout=config.dropout,
                   norm=config.norm if config.embedding_norm else None, norm_eps=config.norm_eps)

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        h = self.positions(self.project(x), positions)  # (b, t, d) -> (b, t, e)
        return self.drop(h if self.norm is None else self.norm(h))


def input_embedding(config: TransformerConfig) -> Union[TokenEmbedding, VectorEmbedding]:
    """The input embedding: :class:`VectorEmbedding` if ``config.input_dim`` is set, else :class:`TokenEmbedding`.

    Args:
        config: the model's configuration.

    Raises:
        ValueError: a field the embedding needs (``num_tokens`` or ``input_dim``, ``seq_length``) is ``None``.
    """
    if config.input_dim is not None:
        return VectorEmbedding.from_config(config)
    return TokenEmbedding.from_config(config)
