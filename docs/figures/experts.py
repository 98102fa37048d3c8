"""The figures of the experts-and-latents page: where a mixture sends the bytes of a sentence, and what an attention
layer's cache holds per token. Both are measured on torchformer's own modules."""

from __future__ import annotations

import pathlib

import torch
import torch.nn.functional as F

from torchformer import GTransformer
from torchformer.families import LatentTransformer, MoETransformer
from torchformer.nn.auxiliary import auxiliary_loss
from torchformer.nn.latent import LatentOptions
from torchformer.nn.moe import MoEOptions, Router

from figures.canvas import new_figure, save

DOCS = pathlib.Path(__file__).resolve().parent.parent
SENTENCE = "The cat sat on the mat, 42 times in 1984."
EXPERTS = 8
# One colour per expert (matplotlib's tab10 without its grey and olive, which read as "nothing").
EXPERT_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


# --- which experts the bytes of a sentence go to ------------------------------------------------------------------


def prose() -> torch.Tensor:
    """The docs' own pages as bytes: real English (and code) that every checkout has."""
    text = "\n".join(page.read_text(encoding="utf-8") for page in sorted(DOCS.glob("*.md")))
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def train_mixture(steps: int) -> MoETransformer:
    """A byte-level 2-block mixture (top-2 of 8 experts) trained on the docs' text, seeded, on one thread."""
    torch.manual_seed(0)
    model = MoETransformer(64, 4, 2, 64, 256, prenorm=True, norm="rms", positions="rotary", activation="swiglu",
                           options=(MoEOptions(experts=EXPERTS, top_k=2, expert_hidden=64),))
    data = prose()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        starts = torch.randint(0, data.numel() - 65, (16,), generator=generator)
        batch = torch.stack([data[s:s + 65] for s in starts.tolist()])  # (16, 65)
        loss = F.nll_loss(model(batch[:, :-1]).transpose(1, 2), batch[:, 1:]) + auxiliary_loss(model)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def routes(model: MoETransformer, text: str) -> list[torch.Tensor]:
    """Each block's chosen experts for the bytes of ``text``: one ``(t, k)`` tensor per block, best first."""
    chosen = []
    hooks = [m.register_forward_hook(lambda module, args, out: chosen.append(out.experts))
             for m in model.modules() if isinstance(m, Router)]
    try:
        with torch.no_grad():
            model(torch.tensor([list(text.encode("utf-8"))]))
    finally:
        for hook in hooks:
            hook.remove()
    return chosen


def draw_expert_routing(path: pathlib.Path, quick: bool = False) -> str:
    """A row per block and choice (first, second expert), a column per byte of the sentence, coloured by expert."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread and fixed seeds: a rerun with the same torch build draws the same figure
    try:
        chosen = routes(train_mixture(5 if quick else 600), SENTENCE)
    finally:
        torch.set_num_threads(threads)
    from matplotlib.colors import ListedColormap

    rows = torch.stack([experts[:, j] for experts in chosen for j in range(experts.size(1))])  # (blocks k, t)
    figure = new_figure(8.4, 2.6)
    ax = figure.subplots()
    ax.imshow(rows.numpy(), cmap=ListedColormap(EXPERT_COLOURS), vmin=-0.5, vmax=EXPERTS - 0.5, aspect="auto")
    for (r, c), expert in zip([(r, c) for r in range(rows.size(0)) for c in range(rows.size(1))], rows.flatten()):
        ax.text(c, r, str(int(expert)), ha="center", va="center", fontsize=7, color="white")
    ax.set_xticks(range(len(SENTENCE)), [ch if ch != " " else "\u2423" for ch in SENTENCE], fontsize=8,
                  family="monospace")
    labels = [f"block {b}, {'first' if j == 0 else 'second'}" for b in range(len(chosen)) for j in range(2)]
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.tick_params(length=0)
    ax.set_title(f"the two experts (of {EXPERTS}) each byte goes to, in a byte-level mixture trained on these docs",
                 fontsize=9.5)
    figure.subplots_adjust(left=0.14, right=0.99, top=0.86, bottom=0.12)
    save(figure, path)
    used = [len(set(experts[:, 0].tolist())) for experts in chosen]
    return f"first choices use {used} of {EXPERTS} experts per block"


# --- what the cache holds per token ---------------------------------------------------------------------------------


# One attention layer of emb 1024 and 16 heads of 64, bfloat16, four ways.
CACHE_KINDS = {
    "multi-head\n16 key/value heads": dict(model=GTransformer, options={}),
    "grouped-query\n4 key/value heads": dict(model=GTransformer, options={"kv_heads": 4}),
    "multi-query\n1 key/value head": dict(model=GTransformer, options={"kv_heads": 1}),
    "latent\nR 256 + rotary key 32": dict(model=LatentTransformer,
                                          options={"options": (LatentOptions(kv_rank=256, rope_dim=32),)}),
}


def cache_bytes_per_token(model_class: type, options: dict) -> tuple[int, list[tuple[int, ...]]]:
    """Bytes one layer's cache holds per token, read from its buffers after a prompt, and the buffers' shapes."""
    torch.manual_seed(0)
    model = model_class(1024, 16, 1, 32, 256, positions="rotary", **options).to(torch.bfloat16).eval()
    caches = model.new_caches()
    with torch.no_grad():
        model(torch.zeros(1, 8, dtype=torch.long), caches=caches, positions=torch.arange(8))
    entries = caches[0].self_attention.entries  # each (b, n, c, d): b 1, c 32 slots
    return sum(e.numel() * e.element_size() for e in entries) // 32, [tuple(e.shape) for e in entries]


def draw_cache_per_token(path: pathlib.Path, quick: bool = False) -> str:
    """Horizontal bars: bytes per token and layer of each kind of attention, measured from the caches."""
    measured = {name: cache_bytes_per_token(kind["model"], kind["options"]) for name, kind in CACHE_KINDS.items()}
    figure = new_figure(7.0, 3.0)
    ax = figure.subplots()
    names = list(measured)[::-1]
    sizes = [measured[name][0] for name in names]
    ax.barh(range(len(names)), sizes, color=["#4c72b0", "#55a868", "#55a868", "#dd8452"][::-1], height=0.6)
    for k, name in enumerate(names):
        shapes = " + ".join("{}\u00d7{}".format(s[1], s[3]) for s in measured[name][1])
        ax.text(sizes[k] + 40, k, f"{sizes[k]:,} B  ({shapes} numbers)", va="center", fontsize=8.5)
    ax.set_yticks(range(len(names)), names, fontsize=8.5)
    ax.set_xlim(0, max(sizes) * 1.9)
    ax.set_xlabel("bytes per token and layer in the KV cache (bfloat16)")
    ax.set_title("one attention layer's cache per token (emb 1024, 16 query heads of 64)", fontsize=9.5)
    ax.spines[["top", "right"]].set_visible(False)
    figure.subplots_adjust(left=0.25, right=0.98, top=0.88, bottom=0.17)
    save(figure, path)
    return ", ".join(f"{name.split(chr(10))[0]} {size:,} B" for name, (size, _) in measured.items())
