"""Complete models assembled from the modules: a classifier, a generator and an encoder-decoder.

The first positional arguments follow Peter Bloem's ``former``, so ``former`` experiments port by changing the
import. Everything beyond them is keyword-only; options not named here (``prenorm``, ``ff_mult``, ``activation``,
``kqnorm``, ``impl``) are passed to every :class:`~torchformer.nn.blocks.TransformerBlock`.

* :class:`CTransformer`: token ids ``(b, t)`` -> class log-probabilities ``(b, c)``.
* :class:`GTransformer`: token ids ``(b, t)`` -> log-probabilities of the next token ``(b, t, v)``, causally.
* :class:`Seq2SeqTransformer`: source ids ``(b, u)`` and target ids ``(b, t)`` -> ``(b, t, v_tgt)``.

Shapes: b batch size, t (target) sequence length, u source length, e embedding size, c classes, v vocabulary size.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from torchformer.decoding import generation
from torchformer._checks import check_embeddings, check_mask, check_positive_int, check_probability, check_tokens
from torchformer.nn.attention import StaticKVCache
from torchformer.nn.blocks import BlockCache
from torchformer.nn.heads import ClassifierHead, GeneratorHead
from torchformer.nn.positions import make_positions
from torchformer.nn.stacks import Decoder, Encoder


BLOCK_OPTIONS = ("prenorm", "ff_mult", "activation", "kqnorm", "impl")


def check_block_options(model: str, options: dict) -> None:
    unknown = sorted(set(options) - set(BLOCK_OPTIONS))
    if unknown:
        raise TypeError(
            f"{model} got unexpected keyword argument(s) {', '.join(unknown)}; "
            f"the options passed on to every block are {', '.join(BLOCK_OPTIONS)}"
        )


def resolve_offset(caches: list[BlockCache] | None, offset: int | Tensor | None) -> int | Tensor:
    """The absolute position of the first new token: with caches, the number of positions already cached.

    With static caches (:class:`~torchformer.nn.attention.StaticKVCache`, filled to a length that lives on the device)
    ``offset`` must be given, as their 0-dim position tensor, and it is taken as given: checking it would make the
    host wait for the device at every step.
    """
    static = bool(caches) and isinstance(caches[0].self_attention, StaticKVCache)  # type: ignore[index]
    if isinstance(offset, Tensor) != static:
        raise ValueError(
            "offset must be the 0-dim position tensor of the static caches (StaticKVCache) when they are given, and "
            f"an int or None otherwise; got {type(offset).__name__} with "
            f"{'static' if static else 'no static'} caches"
        )
    if isinstance(offset, Tensor):
        if offset.dim() != 0 or offset.dtype.is_floating_point or offset.dtype == torch.bool:
            raise ValueError(
                f"offset must be the static caches' 0-dim integer position tensor, got a {offset.dtype} tensor of "
                f"shape {tuple(offset.shape)}"
            )
        return offset
    if caches is None:
        return 0 if offset is None else offset
    cached = len(caches[0].self_attention) if caches else 0
    if offset is not None and offset != cached:
        raise ValueError(
            f"offset must equal the number of cached positions ({cached}) when caches are given, got {offset}; "
            f"leave offset out and it follows the caches"
        )
    return cached


class TokenEmbedding(nn.Module):
    """Token ids ``(b, t)`` -> vectors ``(b, t, e)``: a lookup table plus a position encoding, then dropout."""

    def __init__(
        self, num_tokens: int, emb: int, max_len: int, *, positions: str = "learned", dropout: float = 0.0
    ) -> None:
        super().__init__()
        self.num_tokens = check_positive_int(num_tokens, "num_tokens")
        check_positive_int(max_len, "seq_length")
        self.tokens = nn.Embedding(num_tokens, emb)
        self.positions = make_positions(positions, emb, max_len)
        self.drop = nn.Dropout(check_probability(dropout, "dropout"))

    def forward(self, x: Tensor, *, offset: int | Tensor = 0, name: str = "x") -> Tensor:
        check_tokens(x, name, self.num_tokens)
        max_len = getattr(self.positions, "max_len", None)  # only learned positions have a limit
        if max_len is not None and not isinstance(offset, Tensor) and offset + x.size(1) > max_len:
            raise ValueError(
                f"{name} reaches position {offset + x.size(1) - 1} (length {x.size(1)}, offset {offset}), but the "
                f"model has learned positions for seq_length={max_len} only; crop {name} to its last {max_len} "
                f"tokens or build the model with a larger seq_length"
            )
        return self.drop(self.positions(self.tokens(x), offset))


class CTransformer(nn.Module):
    """Sequence classifier: embedding -> :class:`~torchformer.nn.stacks.Encoder` -> pooled :class:`ClassifierHead`.

    ``forward(x, mask=None)``: token ids ``x`` ``(b, t)`` and an optional padding mask ``(b, t)`` (True = real
    token) -> ``(b, num_classes)`` log-probabilities. With a mask, padding never changes the result.
    ``max_pool=True`` pools with max, else mean; ``pool=`` may name ``"max"``, ``"mean"`` or ``"first"`` directly.
    """

    def __init__(
        self,
        emb: int,
        heads: int,
        depth: int,
        seq_length: int,
        num_tokens: int,
        num_classes: int,
        *,
        max_pool: bool = True,
        pool: str | None = None,
        dropout: float = 0.0,
        wide: bool = False,
        positions: str = "learned",
        **block_options,
    ) -> None:
        super().__init__()
        check_block_options("CTransformer", block_options)
        self.seq_length = seq_length
        self.embedding = TokenEmbedding(num_tokens, emb, seq_length, positions=positions, dropout=dropout)
        self.encoder = Encoder(emb, heads, depth, wide=wide, dropout=dropout, **block_options)
        self.head = ClassifierHead(emb, num_classes, pool or ("max" if max_pool else "mean"))

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        h = self.embedding(x)  # (b, t) -> (b, t, e)
        if mask is not None:
            check_mask(mask, "mask", tuple(x.shape))
        return self.head(self.encoder(h, mask), mask)  # (b, t, e) -> (b, c)


class GTransformer(nn.Module):
    """Autoregressive generator (a GPT-style language model): causal blocks, next-token log-probabilities.

    ``forward(x)``: token ids ``(b, t)`` -> ``(b, t, num_tokens)``; the output at position ``i`` depends only on
    tokens ``0..i`` and predicts token ``i + 1``. ``tie_weights=True`` shares the embedding with the output layer.
    See :mod:`torchformer.decoding.generation` for sampling and beam search.
    """

    def __init__(
        self,
        emb: int,
        heads: int,
        depth: int,
        seq_length: int,
        num_tokens: int,
        *,
        wide: bool = False,
        positions: str = "learned",
        dropout: float = 0.0,
        tie_weights: bool = False,
        **block_options,
    ) -> None:
        super().__init__()
        if block_options.pop("causal", True) is not True:
            raise ValueError("GTransformer is always causal; got causal=False")
        check_block_options("GTransformer", block_options)
        self.seq_length, self.num_tokens = seq_length, num_tokens
        self.positions_kind = positions
        self.embedding = TokenEmbedding(num_tokens, emb, seq_length, positions=positions, dropout=dropout)
        self.blocks = Encoder(emb, heads, depth, causal=True, wide=wide, dropout=dropout, **block_options)
        tie = self.embedding.tokens if tie_weights else None
        self.head = GeneratorHead(emb, num_tokens, tie_to=tie)

    def forward(
        self, x: Tensor, *, caches: list[BlockCache] | None = None, offset: int | Tensor | None = None
    ) -> Tensor:
        """``(b, t) -> (b, t, v)``. With ``caches`` (see :meth:`new_caches`), ``x`` holds only the new tokens, which
        start at absolute position ``offset`` = the number of cached positions (the default, checked if given);
        the earlier positions' keys and values come from the caches. Without caches, ``offset`` (default 0) is the
        absolute position of ``x[:, 0]``. With static caches (see :mod:`torchformer.decoding.compiled`) ``offset`` is
        their 0-dim position tensor: the position of the one new token."""
        offset = resolve_offset(caches, offset)
        return self.head(self.blocks(self.embedding(x, offset=offset), caches=caches))

    def new_caches(self) -> list[BlockCache]:
        return self.blocks.new_caches()

    def generate(
        self,
        prompt: Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos: int | None = None,
        use_cache: bool = True,
        generator: torch.Generator | None = None,
        return_logprobs: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Extend ``prompt`` ``(b, t)`` to ``(b, t + max_new_tokens)``; ``temperature=0`` is greedy.
        See :func:`torchformer.decoding.generation.generate`."""
        return generation.generate(
            self, prompt, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, eos=eos,
            use_cache=use_cache, generator=generator, return_logprobs=return_logprobs,
        )

    def beam_search(
        self,
        prompt: Tensor,
        max_new_tokens: int,
        *,
        beam_size: int,
        length_penalty: float = 1.0,
        eos: int | None = None,
        use_cache: bool = True,
    ) -> tuple[Tensor, Tensor]:
        """The best continuations ``(b, t + max_new_tokens)`` of ``prompt`` ``(b, t)`` and their scores ``(b,)``.
        See :func:`torchformer.decoding.generation.beam_search`."""
        return generation.beam_search(
            self, prompt, max_new_tokens, beam_size=beam_size, length_penalty=length_penalty, eos=eos,
            use_cache=use_cache,
        )


class Seq2SeqTransformer(nn.Module):
    """Encoder-decoder transformer (Vaswani et al.), e.g. for translation or sequence transduction.

    ``forward(src, tgt, src_mask=None)``: source ids ``(b, u)``, target ids ``(b, t)`` (teacher forcing: the
    target shifted right, starting with a BOS token) -> ``(b, t, tgt_tokens)`` log-probabilities of the next target
    token. ``src_mask`` ``(b, u)`` marks real source tokens; the decoder's cross-attention ignores the others.
    ``decoder_depth`` defaults to ``depth``.
    """

    def __init__(
        self,
        emb: int,
        heads: int,
        depth: int,
        seq_length: int,
        src_tokens: int,
        tgt_tokens: int,
        *,
        decoder_depth: int | None = None,
        wide: bool = False,
        positions: str = "learned",
        dropout: float = 0.0,
        tie_weights: bool = False,
        **block_options,
    ) -> None:
        super().__init__()
        self.seq_length, self.tgt_tokens = seq_length, tgt_tokens
        check_block_options("Seq2SeqTransformer", block_options)
        self.positions_kind = positions
        options = dict(wide=wide, dropout=dropout, **block_options)
        self.src_embedding = TokenEmbedding(src_tokens, emb, seq_length, positions=positions, dropout=dropout)
        self.tgt_embedding = TokenEmbedding(tgt_tokens, emb, seq_length, positions=positions, dropout=dropout)
        self.encoder = Encoder(emb, heads, depth, **options)
        self.decoder = Decoder(emb, heads, depth if decoder_depth is None else decoder_depth, **options)
        tie = self.tgt_embedding.tokens if tie_weights else None
        self.head = GeneratorHead(emb, tgt_tokens, tie_to=tie)

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """Source ids ``(b, u)`` -> the encoder's output ``(b, u, e)``, the context of every decoder block."""
        h = self.src_embedding(src, name="src")
        if src_mask is not None:
            check_mask(src_mask, "src_mask", tuple(src.shape))
        return self.encoder(h, src_mask)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_mask: Tensor | None = None,
        *,
        caches: list[BlockCache] | None = None,
        offset: int | None = None,
    ) -> Tensor:
        """Target ids ``(b, t)`` and encoder output ``(b, u, e)`` -> ``(b, t, tgt_tokens)`` log-probabilities.
        ``caches`` and ``offset`` work as in :meth:`GTransformer.forward`."""
        offset = resolve_offset(caches, offset)
        h = self.tgt_embedding(tgt, offset=offset, name="tgt")
        check_embeddings(memory, "memory", h.size(-1))
        if h.size(0) != memory.size(0):
            raise ValueError(f"tgt must have the same batch size as src ({memory.size(0)}), got {h.size(0)}")
        return self.head(self.decoder(h, memory, None, src_mask, caches=caches))

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None) -> Tensor:
        return self.decode(tgt, self.encode(src, src_mask), src_mask)

    def new_caches(self) -> list[BlockCache]:
        return self.decoder.new_caches()

    def generate(
        self,
        src: Tensor,
        max_len: int,
        *,
        bos: int,
        eos: int,
        src_mask: Tensor | None = None,
        beam_size: int = 1,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        length_penalty: float = 1.0,
        use_cache: bool = True,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Target ids ``(b, max_len)`` for source ids ``src`` ``(b, u)``, starting after ``bos``, padded with ``eos``.
        Greedy by default; ``beam_size > 1`` for beam search. See :func:`torchformer.decoding.generation.seq2seq_generate`."""
        return generation.seq2seq_generate(
            self, src, max_len, bos=bos, eos=eos, src_mask=src_mask, beam_size=beam_size, temperature=temperature,
            top_k=top_k, top_p=top_p, length_penalty=length_penalty, use_cache=use_cache, generator=generator,
        )
