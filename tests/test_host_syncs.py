"""The enwik8 example's training loop reads values from the device only every ``--log-every`` steps.

Reading a value on the host (``.item()``, ``.tolist()``, ``.cpu()``, ``int(t)``, ``if t:``, ...) makes the CPU wait
until the GPU has finished everything queued, and the GPU then idles while the next step is launched. On the CPU
the same calls are counted by patching them: each run counts the reads made by torchformer and the example scripts
(torch's own CPU-only code paths, e.g. the unfused optimizer reading its step counter, are not ours and do not run
on a GPU with the fused optimizer). A run of 20 steps must make exactly as many more reads than a run of 10 steps
as it has more ``--log-every`` intervals. On a GPU, ``torch.cuda.set_sync_debug_mode`` reports every synchronising
operation, torch's included, and the same comparison is made.
"""

from __future__ import annotations

import contextlib
import random
import sys
import warnings
from collections import Counter
from pathlib import Path

import pytest
from script_loader import load_script
import torch

import torchformer
import torchformer._checks
import torchformer.models

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "generate_enwik8.py"
# Reads made from code in these folders are counted; torch's internals are not (see the module docstring).
OURS = (str(ROOT / "examples"), str(Path(torchformer.__file__).resolve().parent))
READS = ("item", "tolist", "cpu", "numpy", "__int__", "__float__", "__bool__", "__index__")


@pytest.fixture(scope="module")
def script():
    return load_script(SCRIPT, "generate_enwik8_syncs")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    rng = random.Random(0)
    words = ["the", "cat", "sat", "on", "a", "mat", "[[link]]", "and", "of", "\n"]
    path = tmp_path_factory.mktemp("data") / "tiny.txt"
    path.write_text(" ".join(rng.choice(words) for _ in range(3000)), encoding="utf-8")
    return path


@contextlib.contextmanager
def counted_reads(monkeypatch) -> Counter:
    """Count host reads of tensor values (and ``torch.cuda.synchronize`` calls) made by our code, by call site."""
    calls: Counter = Counter()

    def counting(name: str, original):
        def read(*args, **kwargs):
            caller = sys._getframe(1)
            if caller.f_code.co_filename.startswith(OURS):
                calls[f"{name} at {Path(caller.f_code.co_filename).name}:{caller.f_lineno}"] += 1
            return original(*args, **kwargs)
        return read

    for name in READS:
        monkeypatch.setattr(torch.Tensor, name, counting(name, getattr(torch.Tensor, name)))
    monkeypatch.setattr(torch.cuda, "synchronize", counting("torch.cuda.synchronize", torch.cuda.synchronize))
    # The model's value checks read the device on every device alike; the example turns them off
    # (model.check_values = False), which is what this counts.
    yield calls
    monkeypatch.undo()


def run(script, corpus: Path, out: Path, steps: int, log_every: int, device: str = "cpu") -> None:
    """``steps`` steps of a tiny model; the one evaluation (at the end) and everything else the same in each run."""
    script.main(["-D", str(corpus), "--out", str(out), "--device", device, "--threads", "1", "-N", str(steps),
                 "-b", "4", "-E", "16", "-H", "2", "-d", "1", "-C", "16", "--lr-warmup", "2", "--test-every", "1000",
                 "--test-subset", "64", "--sample-length", "0", "--log-every", str(log_every)])


@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
@pytest.mark.parametrize("log_every", [5, 1])
def test_enwik8_training_reads_the_device_once_per_log_interval(script, corpus, tmp_path, monkeypatch, log_every):
    counts = {}
    for steps in (10, 20):
        with counted_reads(monkeypatch) as calls:
            run(script, corpus, tmp_path / f"n{steps}", steps, log_every)
        counts[steps] = calls
    extra = counts[20] - counts[10]  # the reads the 10 more steps made (Counter subtraction keeps positive counts)
    assert not counts[10] - counts[20], "the longer run made fewer reads somewhere"
    # One read (the pending losses, .tolist()) per log interval, nothing per step.
    assert sum(extra.values()) == 10 // log_every, f"reads per 10 more steps: {dict(extra)}"
    assert list(extra) == [next(iter(extra))] and next(iter(extra)).startswith("tolist at generate_enwik8.py")


def test_the_counter_sees_reads_made_by_our_code(monkeypatch):
    """The counter is not blind: reads made here (a tests/ file, not ours) are ignored; the library's are counted."""
    from torchformer.train.training import check_finite_losses  # noqa: F401  (a module of ours, imported already)

    with counted_reads(monkeypatch) as calls:
        float(torch.ones(()))  # this file is not ours: not counted
        torchformer._checks.check_positive_int(3, "n")  # no tensor: nothing to count
        exec(compile("t.item(); int(t); bool(t); t.tolist()", str(ROOT / "examples" / "x.py"), "exec"),
             {"t": torch.ones(())})
    assert sorted(calls) == ["__bool__ at x.py:1", "__int__ at x.py:1", "item at x.py:1", "tolist at x.py:1"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.filterwarnings("ignore:.*not the .* of the official enwik8")
def test_enwik8_training_synchronises_once_per_log_interval_on_cuda(script, corpus, tmp_path):
    """Every synchronising CUDA operation (torch's too) warns in sync debug mode: 10 more steps, 2 more, both at the
    script's one read of the pending losses."""
    # A first run pays the process's one-time synchronisations (CUDA's lazy start, the first allocations, ...),
    # which would otherwise all fall into the 10-step run (seen on an H100: 60 against 61).
    run(script, corpus, tmp_path / "warm-up", 10, log_every=5, device="cuda")
    counts = {}
    for steps in (10, 20):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                run(script, corpus, tmp_path / f"n{steps}", steps, log_every=5, device="cuda")
            finally:
                torch.cuda.set_sync_debug_mode("default")
        # By call site: the Python line that made the synchronising call.
        counts[steps] = Counter(f"{Path(w.filename).name}:{w.lineno}" for w in caught
                                if "synchronizing" in str(w.message))
    extra = counts[20] - counts[10]
    assert not counts[10] - counts[20], f"the longer run synchronised less somewhere: {dict(counts[10] - counts[20])}"
    assert sum(extra.values()) == 2, f"synchronisations per 10 more steps, by call site: {dict(extra)}"
    assert len(extra) == 1 and next(iter(extra)).startswith("generate_enwik8.py:"), dict(extra)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_classification_batches_reach_cuda_without_synchronising():
    """A blocking copy from pageable memory would wait for the GPU at every batch (three times: ids, mask, labels)."""
    from torchformer.data.batching import ClassificationBatches

    batches = ClassificationBatches([[1, 2, 3], [4, 5], [6]] * 8, [0, 1, 0] * 8, batch_size=4, shuffle=False,
                                    device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ids, mask, labels = next(iter(batches))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert ids.is_cuda and mask.is_cuda and labels.is_cuda
    # Batches are length-bucketed: a batch is padded to its own longest row, and its order is not the input's.
    rows = {tuple(t for t in r if t) for r in ids.tolist()}
    assert rows <= {(1, 2, 3), (4, 5), (6,)} and (ids != 0).equal(mask)


def test_classification_batches_on_the_cpu_are_unchanged():
    from torchformer.data.batching import ClassificationBatches, pad_batch

    ids, mask, labels = next(iter(ClassificationBatches([[1, 2, 3], [4, 5]], [0, 1], batch_size=2, shuffle=False,
                                                        device="cpu")))
    pairs = sorted(zip(ids.tolist(), mask.tolist(), labels.tolist()))  # the order within a bucket is not the input's
    assert pairs == [([1, 2, 3], [True] * 3, 0), ([4, 5, 0], [True, True, False], 1)]
    assert pad_batch([[7]], device=None)[0].device.type == "cpu"
