"""Generation with fixed shapes: preallocated KV caches and a one-token step that ``torch.compile`` can capture.

:func:`torchformer.decoding.generation.generate` is written for reading. After the prompt, every new token costs one forward
pass over one position, which is little arithmetic but many small kernels, each launched from Python. On a GPU
with a small batch the launches dominate: the device waits for the host. Two tools remove that overhead, and both
need every step to look the same:

* ``torch.compile`` traces the step once and fuses it into a few kernels; a new shape means a new compilation.
* A **CUDA graph** records the kernels of one step and replays them with a single launch
  (``torch.compile(mode="reduce-overhead")``); the replayed kernels read and write the same memory every time.

The growing :class:`~torchformer.nn.attention.KVCache` breaks both: at step ``u`` attention sees ``u + 1`` keys, a new
shape every token. :class:`StaticCacheGenerator` instead copies the prompt's keys and values into a
:class:`~torchformer.nn.attention.StaticKVCache` per layer, buffers of the full window ``(n, h, seq_length, s)``
allocated once, and runs every later step as

    token (n, 1), position () -> log-probabilities (n, v)

where ``token``, ``position`` and the caches are tensors that keep their memory: the step writes the new key and
value into slot ``position`` and attends over the slots filled so far (a mask, not a slice). The tokens, and the
log-probabilities they were drawn from, are those of ``generate`` up to floating-point rounding (attention over
masked slots sums in another order): the tests find them equal to 1e-10 in float64, compiled too. In lower
precision a greedy choice between two near-equal tokens can flip.

Shapes: n rows decoded together, t prompt length, h heads, s head size, v vocabulary size.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

from torchformer.nn.attention import KVCache, MultiHeadAttention, StaticKVCache, mark_static_address
from torchformer.nn.blocks import BlockCache
from torchformer.decoding.generation import _generate, _LMStepper

__all__ = ["StaticCacheGenerator"]


class _StaticState:
    """The tensors the step reads and writes, for one cache layout (batch size, dtypes, device): allocated once."""

    def __init__(self, caches: list[BlockCache], capacity: int) -> None:
        first = caches[0].self_attention.keys
        self.position = torch.zeros((), dtype=torch.long, device=first.device)  # slot of the new token
        self.token = torch.zeros(first.size(0), 1, dtype=torch.long, device=first.device)  # (n, 1)
        mark_static_address(self.token)
        self.caches = [
            BlockCache(StaticKVCache.from_cache(c.self_attention, capacity, self.position)) for c in caches
        ]

    def load(self, caches: list[BlockCache]) -> None:
        """Copy the prompt's keys and values (growing caches) into the static buffers, in place."""
        for static, cache in zip(self.caches, caches):
            static.self_attention.load(cache.self_attention)


def _check_plain_caches(caches: list) -> None:
    """Static buffers can stand in only for plain KVCaches that hold the prompt's keys and values."""
    if not caches:
        raise ValueError("the model's new_caches() made no caches: there is nothing to keep in static buffers")
    for cache in caches:
        inner = getattr(cache, "self_attention", cache)
        if not isinstance(cache, BlockCache) or type(inner) is not KVCache:  # other contents: do not guess
            raise TypeError(
                f"StaticCacheGenerator copies plain KVCaches into static buffers, but the model's new_caches() "
                f"made a {type(inner).__name__}; use generation.generate for this model"
            )
        if inner.keys is None:
            raise ValueError("the prompt left a KVCache empty: the model did not pass its caches to every block")


def _layout(caches: list[BlockCache]) -> tuple:
    """What must match for static buffers to be reused: per layer (n, h, s), dtypes and device of keys and values,
    and whether inference mode is on (tensors made in it cannot be written outside it)."""
    layers = tuple(
        (k.size(0), k.size(1), k.size(3), k.dtype, v.dtype, k.device)
        for k, v in ((c.self_attention.keys, c.self_attention.values) for c in caches)
    )
    return layers, torch.is_inference_mode_enabled()


class _StaticLMStepper(_LMStepper):
    """:class:`~torchformer.decoding.generation._LMStepper` whose steps after the prompt go through static buffers."""

    def __init__(self, owner: StaticCacheGenerator) -> None:
        super().__init__(owner.model, use_cache=True)
        self.owner = owner
        self.state: _StaticState | None = None  # set by start(), once the prompt has filled growing caches
        # Tells CUDA graphs that a new step begins, so the previous step's outputs may be overwritten.
        self.mark_step = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)

    def start(self, tokens: Tensor) -> Tensor:
        logp = super().start(tokens)  # the prompt, (n, t), one eager pass that fills growing caches
        self.state = self.owner._state_for(self.caches)  # ... whose contents now move into the static buffers
        self.caches = None
        return logp

    def advance(self, tokens: Tensor) -> Tensor:
        if self.cached >= self.window:  # the window slides: recompute, as generate does
            return self.model(tokens[:, -self.window :])[:, -1]
        state = self.state
        assert state is not None, "start() runs the prompt first"
        state.token.copy_(tokens[:, -1:])  # (n, 1): into the step's own input memory
        state.position.fill_(self.cached)  # the new token's position = its cache slot
        if self.mark_step is not None:
            self.mark_step()  # a no-op without CUDA graphs
        # clone(): a CUDA graph reuses its output memory at the next replay, and the loop keeps every step's output.
        logp = self.owner.step(state.token, state.position, state.caches).clone()
        self.cached += 1
        return logp

    def reorder(self, index: Tensor) -> None:  # pragma: no cover - beam search does not use this stepper
        raise NotImplementedError("StaticCacheGenerator does not do beam search; use generation.beam_search")


class StaticCacheGenerator:
    """``generate`` for a decoder-only model with static KV caches and, optionally, a compiled one-token step.

    Build it once and reuse it: the buffers (per batch size) and the compiled step are kept between calls;
    :meth:`clear` frees the buffers.

    Args:
        model: a :class:`~torchformer.models.GTransformer`, or any model with its generation protocol (see
            :mod:`torchformer.decoding.generation`) that accepts a 0-dim tensor ``offset`` and
            :class:`~torchformer.nn.attention.StaticKVCache`\\ s in its ``BlockCache``\\ s.
        compile: ``torch.compile`` the one-token step as one whole graph. The first call compiles (seconds to a
            minute); a new batch size compiles again, at most twice more: batch size 1 always gets its own graph,
            and the second size other than 1 gets one with the batch size left symbolic, which serves all later
            ones. (``torch.compile`` keeps a limited number of graphs per function, 8 by default, shared by
            all generators in a process: many different models in one process fall outside it.)
        mode: ``torch.compile``'s mode; ``"reduce-overhead"`` also records the step as a CUDA graph on a GPU.
        backend: ``torch.compile``'s backend (default ``"inductor"``).
        custom_attend: set True to accept attention modules that override ``attend``, once you have checked that
            yours works with static buffers (see below); by default such a model is refused.

    With static buffers ``attend`` receives all ``seq_length`` slots, ``u`` is their number, and ``key_mask`` marks
    the filled ones. An override that only rescales or reweights scores and honours ``key_mask`` works unchanged;
    one that derives positions from ``u`` (query ``i`` at ``u - t + i``, as the ALiBi example in
    ``docs/extending.md`` does) would silently compute them wrong, which is why overrides are refused by default.

    ``generate(prompt, max_new_tokens, *, temperature=1.0, top_k=None, top_p=None, eos=None, generator=None,
    return_logprobs=False)`` works as :func:`torchformer.decoding.generation.generate` (with ``use_cache=True``) and returns
    the same tokens: ``(b, t) -> (b, t + max_new_tokens)``.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        compile: bool = False,
        mode: str | None = None,
        backend: str | Callable = "inductor",
        custom_attend: bool = False,
    ) -> None:
        if mode is not None and not compile:
            raise ValueError(f"mode ({mode!r}) is a torch.compile mode; pass compile=True with it")
        for module in model.modules():
            if (isinstance(module, MultiHeadAttention) and type(module).attend is not MultiHeadAttention.attend
                    and not custom_attend):
                raise TypeError(
                    f"{type(module).__name__} overrides attend(); with static caches attend sees all seq_length "
                    f"slots (u is the buffer size, not the number of positions so far). If yours honours key_mask "
                    f"and does not derive positions from u, pass custom_attend=True"
                )
        self.model = model
        self.step = self._step
        if compile:
            # fullgraph: a graph break would silently fall back to Python launches. The shapes are those of the
            # buffers; only the batch size varies between calls, and compile makes it symbolic when it does.
            self.step = torch.compile(self._step, fullgraph=True, mode=mode, backend=backend)
        self._states: dict[tuple, _StaticState] = {}

    def _step(self, token: Tensor, position: Tensor, caches: list[BlockCache]) -> Tensor:
        """``(n, 1)`` token at ``position`` -> ``(n, v)`` log-probabilities of the next one."""
        return self.model(token, caches=caches, offset=position)[:, -1]

    def clear(self) -> None:
        """Free the static buffers of every batch size (the compiled step is kept)."""
        self._states.clear()

    def _state_for(self, caches: list[BlockCache]) -> _StaticState:
        _check_plain_caches(caches)
        key = _layout(caches)
        state = self._states.get(key)
        if state is None:
            state = self._states[key] = _StaticState(caches, self.model.seq_length)
        else:
            state.load(caches)
        return state

    @torch.no_grad()
    def generate(
        self,
        prompt: Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos: int | None = None,
        generator: torch.Generator | None = None,
        return_logprobs: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Extend ``prompt`` ``(b, t)`` to ``(b, t + max_new_tokens)``; see :func:`torchformer.decoding.generation.generate`."""
        return _generate(
            lambda: _StaticLMStepper(self), self.model, prompt, max_new_tokens, temperature=temperature,
            top_k=top_k, top_p=top_p, eos=eos, generator=generator, return_logprobs=return_logprobs,
        )
