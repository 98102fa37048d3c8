"""Speculative decoding: a small draft model proposes ``k`` tokens, the target model checks them in one call.

Decoding one token costs a whole forward pass of the target model, most of it reading weights; a pass over
``k + 1`` positions costs little more. So a cheap *draft* model (fewer layers, the same tokenizer) proposes
``d_1 .. d_k`` one at a time, and the target reads the last kept token and the ``k`` proposals at once, giving its
distributions ``p_1 .. p_{k+1}`` for each of those positions (Leviathan et al. 2023; Chen et al. 2023).

**The rule.** The draft drew ``d_i`` from its own distribution ``q_i``. Going left to right, ``d_i`` is accepted
with probability ``min(1, p_i(d_i) / q_i(d_i))``. At the first rejection the token is drawn instead from the
residual ``max(0, p_i - q_i)``, renormalised, and the round ends; if all ``k`` are accepted, a ``(k+1)``-th token
is drawn from ``p_{k+1}``. A token then has probability ``min(p, q)`` (accepted) plus ``max(0, p - q)`` (drawn
from the residual) ``= p``: every token has the target's distribution given the tokens before it, so the output
is distributed as sampling from the target alone, however poor the draft. With ``temperature=0`` a proposal is
accepted when it is the target's most likely token, and the output is plain greedy decoding's. ``p`` and ``q`` are
the distributions sampling draws from (after temperature, top-k and top-p).

**The caches.** Slot ``p`` of a cache holds position ``p``, so a rejected proposal needs no rollback: its slot is
written again in the next round, and no query reads it before then (the horizon and the causal mask stop at the
query's position). At the start of a round the model's caches hold every kept token but the last, which it reads
first; the draft's may lag one more (after a round whose proposals all stood), which its first read catches up.

**Batches.** Rows accept different numbers of proposals; a round keeps, in every row, the fewest any row kept.
Whether a row keeps its ``j``-th token then depends on earlier draws only, not on that token, so each row is
still distributed as the target's samples.

Shapes: n rows, t tokens so far, k lookahead, v vocabulary size.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from torchformer.decoding.sampling import check_finite_logp, filtered_logits, is_greedy, row_peaks

__all__ = ["accept", "speculative_loop"]


class _Reader:
    """A model with its caches, which hold the positions ``0 .. cached-1`` of the kept sequence."""

    def __init__(self, model: nn.Module, capacity: int) -> None:
        self.model, self.caches, self.cached = model, model.new_caches(capacity), 0

    def read(self, tokens: Tensor, end: int, *, keep_last: Optional[int] = None) -> Tensor:
        """Feed ``tokens[:, cached:end]`` at their positions: ``(n, end - cached, v)`` log-probabilities (or the
        last ``keep_last``)."""
        positions = torch.arange(self.cached, end, device=tokens.device)
        logp = self.model(tokens[:, self.cached:end], caches=self.caches, positions=positions, horizon=end,
                          keep_last=keep_last)
        self.cached = end
        return logp

    def keep(self, kept: int) -> None:
        """Only the first ``kept`` positions are the kept sequence's (the rest held rejected proposals)."""
        self.cached = min(self.cached, kept)


def _probs(logp: Tensor, peak: Tensor, sampling: dict) -> Tensor:
    """What sampling draws from, ``(..., v) -> (..., v)``."""
    return filtered_logits(logp, peak, temperature=sampling["temperature"], top_k=sampling["top_k"],
                           top_p=sampling["top_p"]).softmax(dim=-1)


def accept(p: Tensor, q: Tensor, drafts: Tensor, *, generator: Optional[torch.Generator] = None
           ) -> tuple[Tensor, Tensor]:
    """The accept/reject rule of one round, for every row: how many proposals stand, and the token after them.

    Args:
        p: the target's distributions ``(n, k + 1, v)`` at the ``k`` proposals and after them.
        q: the draft's ``(n, k, v)``, from which ``drafts`` were drawn.
        drafts: the proposals ``(n, k)``, long.
        generator: draws the uniforms and the replacement token; ``None``: torch's global one.

    Returns:
        ``(accepted, tokens)``: ``(n,)`` long, the leading proposals accepted (``0 .. k``), and ``(n, k + 1)``, each
        row's proposals up to ``accepted`` followed by the token drawn at ``accepted`` (from the residual
        ``max(0, p - q)``, or from ``p_{k+1}`` when every proposal stood); later entries are meaningless.
    """
    n, k, v = q.shape
    p_drafts = p[:, :k].gather(-1, drafts[..., None]).squeeze(-1)  # (n, k): p_i(d_i)
    q_drafts = q.gather(-1, drafts[..., None]).squeeze(-1)  # (n, k): q_i(d_i) > 0, as d_i was drawn from q_i
    u = torch.rand(n, k, generator=generator, dtype=p.dtype, device=p.device)
    stands = u * q_drafts < p_drafts  # (n, k): probability min(1, p / q)
    accepted = stands.long().cumprod(dim=1).sum(dim=1)  # (n,): until the first rejection
    # The next token's distribution: the residual where a proposal fell; p_{k+1} itself after k (q is 0 there).
    q_after = torch.cat([q, q.new_zeros(n, 1, v)], dim=1)  # (n, k + 1, v)
    at = accepted[:, None, None].expand(n, 1, v)
    p_at, q_at = p.gather(1, at).squeeze(1), q_after.gather(1, at).squeeze(1)  # (n, v) each
    residual = (p_at - q_at).clamp(min=0)
    # A rejection means p < q at the proposal, so p > q somewhere and the residual has mass; rounding may still
    # leave none, and then p itself is the right distribution (p = q).
    residual = torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, p_at)
    nxt = torch.multinomial(residual, 1, generator=generator)  # (n, 1)
    tokens = torch.cat([drafts, nxt], dim=1).scatter(1, accepted[:, None], nxt)  # (n, k + 1)
    return accepted, tokens


def speculative_loop(model: nn.Module, draft: nn.Module, tokens: Tensor, steps: int, *, lookahead: int,
                     eos: Optional[int], keep: bool, temperature: float, top_k: Optional[int],
                     top_p: Optional[float], generator: Optional[torch.Generator]
                     ) -> tuple[Tensor, Optional[Tensor]]:
    """Append ``steps`` tokens to ``tokens`` ``(n, t)`` by speculative decoding (the options checked by the caller).

    Args:
        model: the target, a decoder-only model with the generation protocol.
        draft: the draft, likewise, of the same vocabulary.
        tokens: the prompt ``(n, t)``; the model's ``seq_length`` holds ``t + steps - 1`` positions, the draft's
            ``t + steps - 2`` (the positions each reads).
        steps: the tokens to add.
        lookahead: the proposals ``k`` per round.
        eos: once a row emits it, the rest of the row is ``eos``.
        keep: also return the target's log-probabilities at each new token.
        temperature: as in :func:`~torchformer.decoding.sampling.sample_next`.
        top_k: likewise.
        top_p: likewise.
        generator: for every draw (the draft's, the uniforms, the replacements).

    Returns:
        ``(tokens, logprobs)``: ``(n, t + steps)``, and with ``keep`` the target's log-probabilities
        ``(n, steps, v)`` (a point mass on ``eos`` once a row has finished), else ``None``.
    """
    n, t = tokens.shape
    sampling = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
    greedy = is_greedy(temperature, top_k)
    # The last new token is never read back: the model reads positions up to t + steps - 2, the draft (which
    # proposes one token fewer than a round adds) up to t + steps - 3.
    target, proposer = _Reader(model, t + steps - 1), _Reader(draft, max(1, t + steps - 2))
    # Every prompt token but the last, which the first round reads (the draft's only if it will propose).
    for reader in (target, proposer) if steps > 1 else (target,):
        if t > 1:
            reader.read(tokens, t - 1, keep_last=1)
    history, peaks, draft_peaks, start = [], [], [], t
    done = torch.zeros(n, dtype=torch.bool, device=tokens.device)  # rows that emitted eos
    while tokens.size(1) < start + steps:
        length = tokens.size(1)
        k = min(lookahead, start + steps - length - 1)  # a round adds at most k + 1 tokens
        # 1. The draft proposes k tokens, one at a time (its first read catches up on the last round's tokens).
        proposals, q = tokens, []
        for i in range(k):
            logq = proposer.read(proposals, length + i, keep_last=1)[:, -1]  # (n, v)
            peak = row_peaks(logq)
            draft_peaks.append(peak)
            if tokens.device.type == "cpu":  # free here; on an accelerator checked once, at the end
                check_finite_logp(peak, source="the draft")
            if greedy:
                d = logq.argmax(dim=-1, keepdim=True)  # (n, 1)
            else:
                q.append(_probs(logq, peak, sampling))
                d = torch.multinomial(q[-1], 1, generator=generator)  # (n, 1)
            proposals = torch.cat([proposals, d], dim=1)
        # 2. The target reads the last kept token and the proposals in one call.
        logp = target.read(proposals, length + k)  # (n, k + 1, v)
        peak = row_peaks(logp)
        peaks.append(peak.flatten(1))
        if tokens.device.type == "cpu":
            check_finite_logp(peak)
        drafts = proposals[:, length:]  # (n, k)
        # 3. Keep the accepted proposals and the token after them.
        if greedy:
            best = logp.argmax(dim=-1)  # (n, k + 1): a proposal stands where it is the target's choice
            accepted = (drafts == best[:, :k]).long().cumprod(dim=1).sum(dim=1)
            new = best  # up to `accepted` the proposals themselves, then the target's choice
        else:
            q_all = torch.stack(q, dim=1) if q else logp.new_zeros(n, 0, logp.size(-1))
            accepted, new = accept(_probs(logp, peak, sampling), q_all, drafts, generator=generator)
        # Every row keeps as many as the unfinished row that kept fewest (one read of the device).
        m = int(accepted.masked_fill(done, k).min()) + 1
        tokens = torch.cat([tokens, new[:, :m]], dim=1)
        if keep:
            history.append(logp[:, :m])
        for reader in (target, proposer):
            reader.keep(tokens.size(1) - 1)
        if eos is not None:
            done = done | (new[:, :m] == eos).any(dim=1)
            if bool(done.all()):
                break
    check_finite_logp(torch.cat([p.reshape(n, -1) for p in peaks], dim=1))
    if draft_peaks:
        check_finite_logp(torch.cat(draft_peaks, dim=1), source="the draft")
    return _finish(tokens, history if keep else None, start, steps, eos)


def _finish(tokens: Tensor, history: Optional[list[Tensor]], start: int, steps: int,
            eos: Optional[int]) -> tuple[Tensor, Optional[Tensor]]:
    """Pad to ``start + steps`` tokens and make every row ``eos`` after its first ``eos`` (a point mass there)."""
    n = tokens.size(0)
    logprobs = None if history is None else torch.cat(history, dim=1)  # (n, emitted, v)
    if eos is None:
        return tokens, logprobs
    new = tokens[:, start:]
    ended = (new == eos).long().cumsum(dim=1)
    after = (ended - (new == eos).long()) > 0  # (n, emitted): strictly after the row's first eos
    missing = steps - new.size(1)
    new = torch.cat([new.masked_fill(after, eos), new.new_full((n, missing), eos)], dim=1)
    if logprobs is not None:
        point = torch.full_like(logprobs[:, :1], float("-inf"))
        point[..., eos] = 0.0
        after = torch.cat([after, after.new_ones(n, missing)], dim=1)[..., None]  # (n, steps, 1)
        logprobs = torch.cat([logprobs, point.expand(n, missing, -1)], dim=1)
        logprobs = torch.where(after, point, logprobs)
    return torch.cat([tokens[:, :start], new], dim=1), logprobs
