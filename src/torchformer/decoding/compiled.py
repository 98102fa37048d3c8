"""Generation with a compiled one-token step: ``torch.compile`` and CUDA graphs.

:func:`torchformer.decoding.generation.generate` is written for reading. After the prompt, every new token costs
one forward pass over one position, which is little arithmetic but many small kernels, each launched from Python.
On a GPU with a small batch the launches dominate: the device waits for the host. Two tools remove that overhead,
and both need every step to look the same:

* ``torch.compile`` traces the step once and fuses it into a few kernels; a new shape means a new compilation.
* A **CUDA graph** records the kernels of one step and replays them with a single launch
  (``torch.compile(mode="reduce-overhead")``); the replayed kernels read and write the same memory every time.

The :class:`~torchformer.nn.cache.KVCache` already has that property: its buffers are allocated once, and a
step writes the slot of its ``position`` (a tensor) and attends over the slots up to its horizon (rounded up to
a power of two, see :meth:`StaticCacheGenerator.__call__`), the causal rule hiding those not written yet. So
every step is

    token (n, 1), position (1,) -> log-probabilities (n, v)

on the same memory, and :class:`StaticCacheGenerator` only adds what makes the memory last: the caches and the
token and position tensors are kept between calls (per batch size, dtype, device) and marked as static addresses,
and the step is compiled. Everything else is :func:`~torchformer.decoding.generation.generate`, and so are the
tokens: equal to eager generation up to floating-point rounding (the tests find them equal to 1e-10 in float64,
compiled too). In lower precision a greedy choice between two near-equal tokens can flip.

Shapes: n rows decoded together, t prompt length, v vocabulary size.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor, nn

from torchformer._checks import autocast_dtype, check_bool
from torchformer.decoding import generation
from torchformer.nn.cache import BlockCache, mark_static_address

__all__ = ["StaticCacheGenerator"]


class StaticCacheGenerator(generation.EagerStep):
    """``generate`` for a decoder-only model with caches kept between calls and, optionally, a compiled step.

    Build it once and reuse it: the caches (per batch size, dtype and device) and the compiled step are kept
    between calls; :meth:`clear` frees the caches. Any attention variant works unchanged (see
    :mod:`torchformer.decoding.generation`), and :meth:`generate` returns the tokens
    :func:`torchformer.decoding.generation.generate` does: ``(b, t) -> (b, t + max_new_tokens)``.

    Args:
        model: a :class:`~torchformer.models.GTransformer`, or any model with its generation protocol (see
            :mod:`torchformer.decoding.generation`).
        compile: ``torch.compile`` the one-token step as one whole graph. The first call compiles (seconds to a
            minute); a new batch size compiles again, at most twice more: batch size 1 always gets its own graph,
            and the second size other than 1 gets one with the batch size left symbolic, which serves all later
            ones. (``torch.compile`` keeps a limited number of graphs per function, 8 by default, shared by
            all generators in a process: many different models in one process fall outside it.)
        mode: ``torch.compile``'s mode; ``"reduce-overhead"`` also records the step as a CUDA graph on a GPU.
        backend: ``torch.compile``'s backend (default ``"inductor"``).
    """

    def __init__(self, model: nn.Module, *, compile: bool = False, mode: Optional[str] = None,
                 backend: str | Callable = "inductor") -> None:
        generation.decoder_config(model, "StaticCacheGenerator")
        check_bool(compile, "compile")  # compile="no" would compile
        if mode is not None and not compile:
            raise ValueError(f"mode ({mode!r}) is a torch.compile mode; pass compile=True with it")
        super().__init__(model)
        self.run = super().__call__  # the eager step, which this class only compiles and feeds kept buffers
        if compile:
            # fullgraph: a graph break would silently fall back to Python launches. The shapes are those of the
            # buffers; only the batch size varies between calls, and compile makes it symbolic when it does.
            self.run = torch.compile(self.run, fullgraph=True, mode=mode, backend=backend)
        # Tells CUDA graphs that a new step begins, so the previous step's outputs may be overwritten.
        self.mark_step = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)
        self._kept: dict[tuple, tuple[list[BlockCache], Tensor, Tensor]] = {}

    def _state(self, prompt: Tensor) -> tuple[list[BlockCache], Tensor, Tensor]:
        # What must match for kept caches to be reused: rows, device, the model's dtype, autocast, and inference
        # mode (tensors made in it cannot be written outside it).
        key = (prompt.size(0), prompt.device, next(self.model.parameters()).dtype, autocast_dtype(prompt.device.type),
               torch.is_inference_mode_enabled())
        if key not in self._kept:
            token, position = super().inputs(prompt)
            mark_static_address(token, position)
            # The caches allocate their buffers on the prompt's first pass and keep them for later calls.
            self._kept[key] = (self.model.new_caches(), token, position)
        return self._kept[key]

    def new_caches(self, prompt: Tensor, capacity: Optional[int] = None) -> list[BlockCache]:
        """The caches for a new sequence of ``prompt``'s batch size, emptied.

        They are allocated once per shape (rows, device, dtype, autocast, inference mode), with ``seq_length``
        slots, and reused, so the compiled step sees the same buffers every time; what the previous call wrote is
        forgotten.

        Args:
            prompt: the token ids about to be decoded, ``(n, t)``: its rows and device pick the kept caches.
            capacity: unused: the kept caches hold ``seq_length`` positions, for every call.

        Returns:
            A list of one :class:`~torchformer.nn.cache.BlockCache` per block of the model.
        """
        caches = self._state(prompt)[0]
        for cache in caches:  # a new sequence: what the previous call wrote is forgotten, the memory kept
            cache.reset()
        return caches

    def inputs(self, prompt: Tensor) -> tuple[Tensor, Tensor]:
        """The token and position tensors each step writes its input into.

        Allocated once per shape, at a fixed address, so the compiled step sees the same inputs every time.

        Args:
            prompt: the token ids about to be decoded, ``(n, t)``: its rows and device pick the kept tensors.

        Returns:
            ``(token, position)``: ``(n, 1)`` and ``(1,)``, long.
        """
        return self._state(prompt)[1:]

    def __call__(self, token: Tensor, position: Tensor, caches: list[BlockCache], *,
                 horizon: Optional[int] = None) -> Tensor:
        """The step of :class:`~torchformer.decoding.generation.EagerStep`, compiled when asked.

        ``horizon`` is rounded up to a power of two (at least 16, at most ``seq_length``, the kept caches' slots):
        the step reads at most twice the slots in use, and a few graphs (CUDA graphs too) serve every position.
        """
        if self.mark_step is not None:
            self.mark_step()  # a no-op without CUDA graphs
        if horizon is not None:
            horizon = min(self.limit, max(16, 1 << (horizon - 1).bit_length()))  # type: ignore[type-var]
        # clone(): a CUDA graph reuses its output memory at the next replay, and the loop keeps every step's output.
        return self.run(token, position, caches, horizon=horizon).clone()

    def clear(self) -> None:
        """Free the kept caches of every batch size (the compiled step is kept)."""
        self._kept.clear()

    def generate(self, prompt: Tensor, max_new_tokens: int, *, temperature: float = 1.0, top_k: Optional[int] = None,
                 top_p: Optional[float] = None, eos: Optional[int] = None, generator: Optional[torch.Generator] = None,
                 return_logprobs: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Extend ``prompt`` ``(b, t)`` to ``(b, t + max_new_tokens)``, with this generator's step.

        The same as :func:`torchformer.decoding.generation.generate` (always with the cache), which checks the
        arguments.

        Args:
            prompt: the token ids to continue, ``(b, t)``.
            max_new_tokens: how many tokens to add.
            temperature: divides the log-probabilities before sampling; ``0`` is greedy.
            top_k: sample only among the ``top_k`` most likely tokens; ``None``: all.
            top_p: sample only among the most likely tokens whose probabilities sum to ``top_p``; ``None``: all.
            eos: the end-of-sequence id, after which a row holds only ``eos``; ``None``: none.
            generator: a :class:`torch.Generator` that makes sampling reproducible; ``None``: torch's global one.
            return_logprobs: also return the log-probabilities each new token was chosen from, as ``generate``.

        Returns:
            The token ids ``(b, t + max_new_tokens)``; with ``return_logprobs``, also the log-probabilities
            ``(b, max_new_tokens, v)``.
        """
        return generation.generate(
            self.model, prompt, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, eos=eos,
            generator=generator, return_logprobs=return_logprobs, step=self,
        )
