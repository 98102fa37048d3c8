"""Position schemes that act inside attention, on the distance ``i - j``: rotary, ALiBi, a learned bias.

Each, an :class:`AttentionPositions`, works with a KV cache and past ``seq_length`` (``docs/relative-positions.md``).

Shapes: b batch size, h heads, g key/value heads, t queries, u keys, s head size.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import Tensor, nn

from torchformer._checks import check_int_at_least, check_positive_float, check_positive_int
from torchformer.config import TransformerConfig, check_rotary_scaling
from torchformer.nn.masks import AttentionMask


class AttentionPositions(nn.Module):
    """No position information inside attention: the base class, and the choice for absolute schemes.

    It has no ``forward``; a subclass overrides :meth:`rotate`, :meth:`bias` or both.

    Shapes:
        ``rotate(x, positions)``: ``x`` ``(b, h, t, s)``, ``positions`` ``(t,)`` -> ``(b, h, t, s)``;
        ``bias(mask)`` -> ``(h, t, u)`` or ``None``.
    """

    # A scheme without parameters that computes the same in every layer: a stack builds one for all its blocks
    # (TransformerBlock.stack_positions), so a decoding step computes rotary angles once, not once per layer.
    shareable: bool = False

    @classmethod
    def from_sizes(cls, *, heads: int, head_size: int, causal: bool) -> AttentionPositions:
        """The scheme of an attention layer of ``heads`` heads of size ``head_size``; every scheme has it.

        Args:
            heads: the number of heads ``h``.
            head_size: the head size ``s``.
            causal: whether the layer is causal.
        """
        return cls()

    @classmethod
    def from_config(cls, config: TransformerConfig, *, causal: bool) -> AttentionPositions:
        """The scheme of an attention layer of ``config``: :meth:`from_sizes` with its heads and head size.

        Args:
            config: the model's architecture.
            causal: whether the layer is causal.
        """
        return cls.from_sizes(heads=config.heads, head_size=config.head_size, causal=causal)

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """Queries or keys at ``positions``, rotated: unchanged here.

        Args:
            x: queries ``(b, h, t, s)``, or keys ``(b, g, t, s)`` (one per key/value head).
            positions: ``(t,)`` long, the absolute positions of the ``t`` vectors.

        Returns:
            The rotated vectors, shaped and typed as ``x`` (here ``x`` itself).
        """
        return x

    def bias(self, mask: AttentionMask) -> Optional[Tensor]:
        """The float bias ``(h, t, u)`` on the scores; ``None`` here, and for keys without positions (cross-attention).

        Args:
            mask: the query positions ``i`` and key positions ``j`` of this attention call.
        """
        return None


def rotate_halves(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pair ``m`` of each vector, ``(x[..., m], x[..., m + s/2])``, by the angle of ``cos[m]`` and ``sin[m]``.

    Args:
        x: ``(..., t, s)``.
        cos: ``(t, s/2)``, or any shape that broadcasts against a half of ``x``.
        sin: as ``cos``.

    Returns:
        ``(..., t, s)``.
    """
    first, second = x.chunk(2, dim=-1)  # (..., t, s/2) each: pair m is (first[m], second[m])
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


class RotateHalves(torch.autograd.Function):
    """:func:`rotate_halves` into one new tensor, with the opposite rotation as the gradient (the angles get none).

    Shapes:
        ``apply(x, cos, sin)``: ``x`` ``(b, h, t, s)``, ``cos`` and ``sin`` ``(t, s/2)`` -> ``(b, h, t, s)``.
    """

    @staticmethod
    def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """:func:`rotate_halves`' numbers in a new tensor: :meth:`rotate_rows` where it pays, else :meth:`by_halves`.

        Args:
            x: ``(..., t, s)``.
            cos: as for :func:`rotate_halves`.
            sin: as ``cos``.

        Returns:
            ``(..., t, s)``, strided as ``x`` (on the rows path, heads side by side in a tensor of its own).
        """
        if (x.numel() >= RotateHalves.rows_from and RotateHalves.heads_side_by_side(x)
                and cos.shape == sin.shape == (x.size(-2), x.size(-1) // 2)):
            return RotateHalves.rotate_rows(x, cos, sin)
        return RotateHalves.by_halves(x, cos, sin)

    # The rows path from this many numbers on: below it the queries fit in a core's cache, where the halves' gaps
    # cost little, and building the rows of angles costs more than it saves.
    rows_from = 2**19

    @staticmethod
    def by_halves(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """:meth:`rotate` of any ``x``: each half written straight into a new tensor of ``x``'s layout.

        Args:
            x: ``(..., t, s)``.
            cos: as for :func:`rotate_halves`.
            sin: as ``cos``.

        Returns:
            ``(..., t, s)``, strided as ``x``.
        """
        out = torch.empty_like(x)  # x's layout: a transposed view gives a transposed output
        first, second = x.chunk(2, dim=-1)  # (..., t, s/2) each
        out_first, out_second = out.chunk(2, dim=-1)
        torch.mul(first, cos, out=out_first).addcmul_(second, sin, value=-1)  # first cos - second sin
        torch.mul(first, sin, out=out_second).addcmul_(second, cos)  # first sin + second cos
        return out

    @staticmethod
    def heads_side_by_side(x: Tensor) -> bool:
        """Whether ``x`` ``(b, h, t, s)`` views ``(b, t, h * s)`` rows, heads side by side (``split_heads``' layout).

        Args:
            x: queries or keys.
        """
        return x.dim() == 4 and x.stride(-1) == 1 and x.stride(1) == x.size(-1)

    @staticmethod
    def rotate_rows(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """:meth:`rotate` of an ``x`` whose heads sit side by side, by operations along whole ``(b, t, h * s)`` rows.

        For finite inputs only: an infinite or NaN coordinate also makes NaN of half a neighbouring head.

        Args:
            x: ``(b, h, t, s)``, its heads side by side (:meth:`heads_side_by_side`).
            cos: ``(t, s/2)``.
            sin: as ``cos``.

        Returns:
            ``(b, h, t, s)``, its heads side by side.
        """
        b, h, t, s = x.shape
        half = s // 2
        rows = x.transpose(1, 2).flatten(2)  # (b, h, t, s) -> (b, t, h * s): a view, as the heads are side by side
        cosines = cos.repeat(1, 2 * h)  # (t, h * s): pair m's cosine at coordinates m and m + s/2 of every head
        sines = torch.cat([sin, torch.zeros_like(sin)], dim=-1).repeat(1, h)[:, :-half]  # T: (t, h * s - s/2)
        out = torch.mul(rows, cosines, out=rows.new_empty(b, t, h * s))  # (b, t, h * s): x cos, in x's dtype
        out[..., :-half].addcmul_(rows[..., half:], sines, value=-1)  # first halves: - second sin
        out[..., half:].addcmul_(rows[..., :-half], sines)  # second halves: + first sin
        return out.view(b, t, h, s).transpose(1, 2)  # (b, h, t, s), heads side by side as x's

    @staticmethod
    def forward(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:  # type: ignore[override]
        return RotateHalves.rotate(x, cos, sin)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:  # type: ignore[override]
        """Keep the angles: the derivatives in both directions are rotations by them."""
        _, cos, sin = inputs
        ctx.save_for_backward(cos, sin)
        ctx.save_for_forward(cos, sin)

    @staticmethod
    def jvp(ctx: Any, x_dot: Tensor, cos_dot: None, sin_dot: None) -> Tensor:  # type: ignore[override]
        """Forward-mode derivative: a rotation is linear, so the tangent is rotated as ``x`` is."""
        cos, sin = ctx.saved_tensors
        return rotate_halves(x_dot, cos, sin)

    @staticmethod
    def vmap(  # type: ignore[override]
        info: Any, in_dims: tuple, x: Tensor, cos: Tensor, sin: Tensor
    ) -> tuple[Tensor, int]:
        """``torch.func.vmap``'s rule: the batch dimension of ``x`` in front, where the rotation ignores it."""
        x_dim, cos_dim, sin_dim = in_dims
        x = x.movedim(x_dim, 0) if x_dim is not None else x.expand(info.batch_size, *x.shape)
        if cos_dim is None and sin_dim is None:  # the angles of every batch element alike: broadcast as they are
            return RotateHalves.apply(x, cos, sin), 0

        def batched(angle: Tensor, dim: Optional[int]) -> Tensor:  # (B, t, s/2) -> (B, 1, ..., 1, t, s/2)
            angle = angle.movedim(dim, 0) if dim is not None else angle.expand(info.batch_size, *angle.shape)
            return angle.reshape(angle.shape[0], *[1] * (x.dim() - angle.dim()), *angle.shape[1:])

        return rotate_halves(x, batched(cos, cos_dim), batched(sin, sin_dim)), 0

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        """The input's gradient: the output's, rotated back by the same angles."""
        cos, sin = ctx.saved_tensors
        if torch.is_grad_enabled():  # a second derivative (create_graph=True): the formula, which autograd follows
            return rotate_halves(grad, cos, -sin), None, None
        return RotateHalves.rotate(grad, cos, -sin), None, None


class Rotary(AttentionPositions):
    """Rotary position embedding (RoPE): rotate pair ``(x_m, x_m+s/2)`` of queries and keys by ``p * theta_m``.

    No parameters; the halves are GPT-NeoX's and Llama's layout (:class:`InterleavedRotary`: adjacent pairs).

    Args:
        head_size: ``s``, even.
        base: the base of the frequencies, ``theta_m = base^(-2m/s)`` (10000; Llama-3: 500000).
        scaling: ``None``, or Llama-3.1's rescaling for longer contexts, ``{"factor", "low_freq_factor",
            "high_freq_factor", "original_max_position_embeddings"}`` (``config.rotary_scaling``).

    Raises:
        ValueError: ``head_size`` is odd, ``base`` is not a positive float, or ``scaling`` is malformed.

    Shapes:
        ``rotate(x, positions)``: ``x`` ``(b, h, t, s)``, ``positions`` ``(t,)`` -> ``(b, h, t, s)``; no bias.
    """

    shareable = True

    def __init__(self, head_size: int, *, base: float = 10000.0, scaling: Optional[dict] = None) -> None:
        super().__init__()
        if head_size % 2 != 0:
            raise ValueError(f"rotary positions rotate coordinate pairs: the head size must be even, got {head_size}")
        self._theta: dict[torch.device, Tensor] = {}  # frequencies per device, computed once (see frequencies)
        self._last: Optional[tuple] = None  # the last call's positions and angles (see angles)
        self.head_size, self.base = head_size, check_positive_float(base, "base")
        self.scaling = check_rotary_scaling(scaling)

    def __getstate__(self) -> dict:
        # The frequencies and the last angles are recomputed on demand: not worth a pickle's bytes.
        return {**self.__dict__, "_theta": {}, "_last": None}

    def __setstate__(self, state: dict) -> None:
        # An older pickle may hold base and scaling as plain attributes.
        state = dict(state)
        state.setdefault("_base", state.pop("base", 10000.0))
        state.setdefault("_scaling", state.pop("scaling", None))
        state["_theta"], state["_last"] = {}, None
        super().__setstate__(state)

    @property
    def base(self) -> float:
        """The base of the frequencies; setting it recomputes them."""
        return self._base

    @base.setter
    def base(self, value: float) -> None:
        self._base = value
        self._theta, self._last = {}, None

    @property
    def scaling(self) -> Optional[dict]:
        """Llama-3.1's rescaling, or ``None``; setting it (not changing the dict in place) recomputes them."""
        return self._scaling

    @scaling.setter
    def scaling(self, value: Optional[dict]) -> None:
        self._scaling = value
        self._theta, self._last = {}, None

    @classmethod
    def from_sizes(cls, *, heads: int, head_size: int, causal: bool) -> Rotary:
        """As :meth:`AttentionPositions.from_sizes`: rotary positions for heads of size ``head_size`` (even)."""
        return cls(head_size)

    @classmethod
    def from_config(cls, config: TransformerConfig, *, causal: bool) -> Rotary:
        """As :meth:`AttentionPositions.from_config`, with ``config.rotary_base`` and ``config.rotary_scaling``."""
        # Built by from_sizes, which a variant overrides; the config's frequencies are set on what it built.
        rotary = cls.from_sizes(heads=config.heads, head_size=config.head_size, causal=causal)
        rotary.base = check_positive_float(config.rotary_base, "rotary_base")
        rotary.scaling = check_rotary_scaling(config.rotary_scaling)
        return rotary

    def frequencies(self, device: torch.device) -> Tensor:
        """``theta_m`` for ``m = 0 .. s/2 - 1``, rescaled by ``scaling`` if given; computed once per device.

        Args:
            device: where the result goes.

        Returns:
            ``(s/2,)`` float64.
        """
        if torch.compiler.is_compiling():  # a constant the compiler folds: nothing to keep
            return self.compute_frequencies(device)
        if device not in self._theta:  # a decoding step rotates 2 * depth times: compute them once
            with torch.inference_mode(False):  # a plain tensor, usable outside inference_mode too
                self._theta[device] = self.compute_frequencies(device)
        return self._theta[device]

    def compute_frequencies(self, device: torch.device) -> Tensor:
        """:meth:`frequencies`, computed.

        Args:
            device: where the result goes.

        Returns:
            ``(s/2,)`` float64.
        """
        pair = torch.arange(self.head_size // 2, device=device, dtype=torch.float64)  # m = 0 .. s/2 - 1
        theta = self.base ** (-2 * pair / self.head_size)  # (s/2,)
        if self.scaling is None:
            return theta
        factor, length = self.scaling["factor"], self.scaling["original_max_position_embeddings"]
        low, high = self.scaling["low_freq_factor"], self.scaling["high_freq_factor"]
        turns = length * theta / (2 * math.pi)  # L / w: how often pair m turns within the old context
        # 0 below low (slow pairs: divided by factor), 1 above high (fast pairs: kept), linear in between.
        keep = ((turns - low) / (high - low)).clamp(0.0, 1.0)
        return keep * theta + (1 - keep) * theta / factor

    def angles(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """``cos`` and ``sin`` of ``p * theta_m``, for every position ``p`` and pair ``m``, computed in float64.

        Args:
            positions: ``(t,)`` long, the absolute positions.
            dtype: the dtype of the results (the queries' or keys').

        Returns:
            ``(cos, sin)``, each ``(t, s/2)``.
        """
        # The keys rotate at the queries' positions: reuse the last angles, only for the very same unchanged
        # tensors (version counters; inference tensors have none) in the same grad and inference modes.
        theta = self.frequencies(positions.device)  # (s/2,)
        remember = not (torch.compiler.is_compiling() or positions.is_inference() or theta.is_inference()
                        or theta.requires_grad)
        if remember:
            key = (positions._version, theta._version, dtype, torch.is_grad_enabled(),
                   torch.is_inference_mode_enabled())
            if self._last is not None:
                last_positions, last_theta, last_key, cos, sin = self._last
                if last_positions is positions and last_theta is theta and last_key == key:
                    return cos, sin
        angles = positions.to(torch.float64)[:, None] * theta  # (t, s/2)
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
        if remember:
            self._last = (positions, theta, key, cos, sin)
        return cos, sin

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """As :meth:`AttentionPositions.rotate`: each pair of coordinates rotated by its position's angle."""
        cos, sin = self.angles(positions, x.dtype)  # (t, s/2) each
        # The formula when compiling (the compiler cannot trace out= into strided memory), for learned angles, or
        # for angles that broadcast wider than x (out= would not).
        half = x.shape[:-1] + (x.size(-1) // 2,)
        if (torch.compiler.is_compiling() or cos.requires_grad or sin.requires_grad
                or _widens(cos.shape, half) or _widens(sin.shape, half)):  # angles that widen x: broadcast
            return rotate_halves(x, cos, sin)
        if not torch.is_grad_enabled():  # nothing to differentiate (decoding): the same numbers, without apply's cost
            return RotateHalves.rotate(x, cos, sin)
        return RotateHalves.apply(x, cos, sin)  # (b, h, t, s): rotate_halves' numbers, faster in eager mode

    def extra_repr(self) -> str:
        return f"head_size={self.head_size}, base={self.base:g}" + (f", scaling={self.scaling}" if self.scaling else "")


def _widens(shape: torch.Size, into: tuple[int, ...]) -> bool:
    """Whether broadcasting ``shape`` against ``into`` gives a larger shape (or none): plain ints, no tensor op."""
    if len(shape) > len(into):
        return True
    return any(a != 1 and a != b for a, b in zip(reversed(shape), reversed(into)))


class InterleavedRotary(Rotary):
    """Rotary positions with the paper's pairs: adjacent coordinates ``(x_2m, x_2m+1)`` (GPT-J's layout).

    Arguments: as :class:`Rotary`.

    Shapes:
        ``rotate(x, positions)``: ``x`` ``(b, h, t, s)``, ``positions`` ``(t,)`` -> ``(b, h, t, s)``; no bias.
    """

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """As :meth:`Rotary.rotate`, on adjacent pairs ``(x_2m, x_2m+1)``."""
        cos, sin = self.angles(positions, x.dtype)  # (t, s/2) each
        even, odd = x[..., 0::2], x[..., 1::2]  # (b, h, t, s/2) each
        rotated = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1)  # (b, h, t, s/2, 2)
        return rotated.flatten(-2)  # interleave the pairs again: (b, h, t, s)


def alibi_slopes(heads: int, *, device: torch.device | str | None = None) -> Tensor:
    """The paper's slopes ``m_h`` ``(h,)`` float32, one per head: ``2^(-8/h), ..., 2^(-8)`` for ``h`` a power of two.

    Otherwise those of the next lower power of two ``n``, then every other slope of ``2n`` heads.

    Args:
        heads: the number of heads ``h``.
        device: where the result goes; ``None``: the default device.
    """
    n = 2 ** int(math.floor(math.log2(heads)))  # the largest power of two up to h
    k = torch.arange(heads, device=device, dtype=torch.float64)  # head k
    # head k < n: 2^(-8 (k + 1) / n); head n + j: slope 2j of 2n heads, 2^(-8 (2j + 1) / 2n)
    exponent = torch.where(k < n, 8 * (k + 1) / n, 8 * (2 * (k - n) + 1) / (2 * n))
    return torch.exp2(-exponent).float()


class ALiBi(AttentionPositions):
    """Attention with linear biases (ALiBi): ``score_ij += -m_h |i - j|``, one fixed slope ``m_h`` per head.

    Args:
        heads: the number of heads ``h``; head ``k`` gets slope ``alibi_slopes(h)[k]``.

    Raises:
        ValueError: ``heads`` is not a positive int.

    Shapes:
        ``bias(mask)`` -> ``(h, t, u)``, or ``None`` for cross-attention; ``rotate`` returns its input unchanged.
    """

    shareable = True

    def __init__(self, heads: int) -> None:
        super().__init__()
        self.heads = check_positive_int(heads, "heads")
        self._slopes: Optional[Tensor] = None  # computed at the first use on a device, again on another one

    @property
    def slopes(self) -> Tensor:
        """The slopes ``m_h`` ``(h,)``, float32, on the CPU (:func:`alibi_slopes`)."""
        return alibi_slopes(self.heads)

    @classmethod
    def from_sizes(cls, *, heads: int, head_size: int, causal: bool) -> ALiBi:
        """As :meth:`AttentionPositions.from_sizes`: one slope per head (a penalty on ``|i - j|``, causal or not)."""
        return cls(heads)

    def bias(self, mask: AttentionMask) -> Optional[Tensor]:
        """As :meth:`AttentionPositions.bias`: ALiBi's ``-m_h |i - j|``, float32."""
        if mask.key_positions is None:
            return None
        distance = mask.distance().abs().float()  # (t, u)
        if self._slopes is None or self._slopes.device != distance.device:  # not a buffer: no file fills it
            self._slopes = alibi_slopes(self.heads, device=distance.device)  # (h,)
        return -self._slopes[:, None, None] * distance  # (h, 1, 1) * (t, u) -> (h, t, u)

    def extra_repr(self) -> str:
        return f"heads={self.heads}"


def relative_bucket(distance: Tensor, *, bidirectional: bool, num_buckets: int = 32, max_distance: int = 128) -> Tensor:
    """T5's bucket of each query-minus-key distance ``i - j``: one per distance up close, then logarithmic.

    Args:
        distance: query position minus key position, an integer tensor of any shape (``(t, u)`` from
            :meth:`~torchformer.nn.masks.AttentionMask.distance`).
        bidirectional: separate buckets for keys after the query (``i - j < 0``); if False, those fall in bucket 0.
        num_buckets: the number of buckets in all (both halves together when bidirectional).
        max_distance: the distance from which on every distance shares the last bucket (of its half).

    Returns:
        The bucket of each distance, shaped as ``distance``, in ``[0, num_buckets)``.
    """
    buckets = num_buckets
    offset = torch.zeros_like(distance)
    if bidirectional:
        buckets //= 2
        offset = (distance < 0).long() * buckets  # keys after the query get the upper half
        distance = distance.abs()
    else:
        distance = distance.clamp(min=0)  # the future is masked anyway: bucket 0
    exact = buckets // 2
    # log(d / exact) / log(max_distance / exact) runs from 0 at d = exact to 1 at d = max_distance.
    scaled = torch.log(distance.clamp(min=1).float() / exact) / math.log(max_distance / exact)
    far = (exact + (scaled * (buckets - exact)).long()).clamp(max=buckets - 1)
    return offset + torch.where(distance < exact, distance, far)


class RelativeBias(AttentionPositions):
    """A learned bias per head and bucket of ``i - j`` (T5), added to the scores.

    The table ``table.weight`` ``(num_buckets, h)`` starts at zero; the buckets are :func:`relative_bucket`'s.

    Args:
        heads: ``h``.
        bidirectional: separate buckets for keys before and after the query (encoders); False for causal layers.
        num_buckets: how many buckets of distances, at least 4; T5's default, 32.
        max_distance: distances from this one on share the last bucket, above ``num_buckets // 2``; T5's, 128.

    Raises:
        ValueError: ``num_buckets`` or ``max_distance`` is too small.

    Shapes:
        ``bias(mask)`` -> ``(h, t, u)``, or ``None`` for cross-attention; ``rotate`` returns its input unchanged.
    """

    def __init__(self, heads: int, *, bidirectional: bool, num_buckets: int = 32, max_distance: int = 128) -> None:
        super().__init__()
        check_int_at_least(num_buckets, "num_buckets", 4)
        check_int_at_least(max_distance, "max_distance", num_buckets // 2 + 1)  # beyond the exact buckets
        self.bidirectional, self.num_buckets, self.max_distance = bidirectional, num_buckets, max_distance
        self.table = nn.Embedding(num_buckets, heads)  # bucket -> one scalar per head
        nn.init.zeros_(self.table.weight)  # start as plain attention; training finds which distances matter

    @classmethod
    def from_sizes(cls, *, heads: int, head_size: int, causal: bool) -> RelativeBias:
        """As :meth:`AttentionPositions.from_sizes`: a table for ``heads`` heads, one-sided if ``causal``."""
        return cls(heads, bidirectional=not causal)

    @classmethod
    def from_config(cls, config: TransformerConfig, *, causal: bool) -> RelativeBias:
        """As :meth:`AttentionPositions.from_config`, with ``config.relative_buckets`` and ``relative_max_distance``."""
        # Built by from_sizes, as Rotary's; the config's numbers are set on it (a new table if they differ).
        bias = cls.from_sizes(heads=config.heads, head_size=config.head_size, causal=causal)
        if (bias.num_buckets, bias.max_distance) != (config.relative_buckets, config.relative_max_distance):
            bias.num_buckets, bias.max_distance = config.relative_buckets, config.relative_max_distance
            bias.table = nn.Embedding(config.relative_buckets, config.heads)
            nn.init.zeros_(bias.table.weight)  # plain attention at the start, as a new table always is
        return bias

    def bias(self, mask: AttentionMask) -> Optional[Tensor]:
        """As :meth:`AttentionPositions.bias`: each head's learned bias for the bucket of ``i - j`` (table's dtype)."""
        if mask.key_positions is None:
            return None
        bucket = relative_bucket(mask.distance(), bidirectional=self.bidirectional, num_buckets=self.num_buckets,
                                 max_distance=self.max_distance)  # (t, u)
        return self.table(bucket).permute(2, 0, 1)  # (t, u, h) -> (h, t, u)

    def extra_repr(self) -> str:
        return f"bidirectional={self.bidirectional}, num_buckets={self.num_buckets}, max_distance={self.max_distance}"
