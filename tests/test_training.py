"""Tests for torchformer.train.training and torchformer.train.checkpoint."""

from __future__ import annotations

import csv
import math
import random
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from torchformer.train.training import (
    CheckpointClock,
    CSVLogger,
    TrainingDiverged,
    autocast,
    check_finite_losses,
    checkpoint_path,
    count_parameters,
    latest_checkpoint,
    load_checkpoint,
    plot_curves,
    progress,
    prune_checkpoints,
    resolve_device,
    resume_schedule,
    save_checkpoint,
    set_seed,
    unwrap_model,
    warmup_cosine,
    warmup_stable_decay,
)


class FakeCompiled(nn.Module):
    """Stands in for what torch.compile returns: the real model as ``_orig_mod``, keys prefixed with it."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self._orig_mod = model

    def forward(self, x):
        return self._orig_mod(x)


def tiny_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 1))


def make_run(seed: int):
    model = tiny_model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = warmup_cosine(opt, warmup_steps=3, total_steps=10)
    gen = torch.Generator().manual_seed(seed)
    return model, opt, sched, gen


def train_step(model, opt, sched, gen) -> torch.Tensor:
    """One step that consumes every RNG a checkpoint must restore."""
    x = torch.randn(4, 8, generator=gen)  # the named batch generator
    y = torch.randn(4, 1, generator=gen)
    noise = float(np.random.rand())  # NumPy's global generator
    weight = random.random()  # Python's random
    loss = ((model(x) - y) ** 2).mean() * (1 + 0.1 * noise + 0.1 * weight)  # dropout: torch's global generator
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    return loss.detach()


def scramble_global_rngs() -> None:
    random.seed(12345)
    np.random.seed(12345)
    torch.manual_seed(12345)


# ---------------------------------------------------------------------------------------------------------
# Checkpoints


def test_resume_is_bitwise_identical_to_uninterrupted_run(tmp_path):
    set_seed(0)
    model, opt, sched, gen = make_run(seed=0)
    losses = []
    for step in range(1, 11):
        losses.append(train_step(model, opt, sched, gen))
        if step == 5:
            save_checkpoint(tmp_path / "ckpt.pt", model=model, optimizer=opt, scheduler=sched, step=step,
                            extra={"note": "half way"}, generators={"batches": gen})

    # A fresh process, in effect: other initial weights, another batch seed, scrambled global RNGs.
    model2, opt2, sched2, gen2 = make_run(seed=99)
    scramble_global_rngs()
    info = load_checkpoint(tmp_path / "ckpt.pt", model=model2, optimizer=opt2, scheduler=sched2,
                           generators={"batches": gen2})
    assert info == {"step": 5, "extra": {"note": "half way"}}
    resumed = [train_step(model2, opt2, sched2, gen2) for _ in range(6, 11)]

    for a, b in zip(losses[5:], resumed):
        assert torch.equal(a, b)
    for (name, p), p2 in zip(model.named_parameters(), model2.parameters()):
        assert torch.equal(p, p2), name
    assert opt.param_groups[0]["lr"] == opt2.param_groups[0]["lr"]


def test_without_restore_rng_the_resumed_run_differs(tmp_path):
    # Shows that the global RNG states in the checkpoint are what makes resumption exact.
    model, opt, sched, gen = make_run(seed=0)
    train_step(model, opt, sched, gen)
    save_checkpoint(tmp_path / "c.pt", model=model, optimizer=opt, scheduler=sched, step=1,
                    generators={"batches": gen})
    reference = [train_step(model, opt, sched, gen) for _ in range(3)]

    model2, opt2, sched2, gen2 = make_run(seed=0)
    scramble_global_rngs()
    load_checkpoint(tmp_path / "c.pt", model=model2, optimizer=opt2, scheduler=sched2,
                    generators={"batches": gen2}, restore_rng=False)
    other = [train_step(model2, opt2, sched2, gen2) for _ in range(3)]
    assert not all(torch.equal(a, b) for a, b in zip(reference, other))


def test_checkpoint_loads_with_weights_only_and_holds_plain_rng_states(tmp_path):
    model, opt, sched, gen = make_run(seed=0)
    train_step(model, opt, sched, gen)
    path = save_checkpoint(tmp_path / "sub" / "c.pt", model=model, optimizer=opt, scheduler=sched, step=1,
                           extra={"config": {"lr": 0.01, "layers": [1, 2]}, "vocab": ["a", "b"], "best": None},
                           generators={"batches": gen})
    ckpt = torch.load(path, weights_only=True)
    assert set(ckpt["model"]) == set(model.state_dict())
    assert ckpt["step"] == 1 and ckpt["extra"]["vocab"] == ["a", "b"]
    assert torch.equal(ckpt["generators"]["batches"], gen.get_state())
    assert torch.equal(ckpt["rng"]["torch_cpu"], torch.get_rng_state())
    assert ckpt["rng"]["python"]["internal"] == list(random.getstate()[1])
    np_state = np.random.get_state(legacy=False)
    assert ckpt["rng"]["numpy"]["state"]["key"]["ndarray"] == np_state["state"]["key"].tolist()


def test_save_rejects_extra_that_weights_only_loading_would_refuse(tmp_path):
    model = nn.Linear(2, 2)
    with pytest.raises(TypeError, match=r"\['extra'\]\['config'\]\['scale'\] of type numpy.float64"):
        save_checkpoint(tmp_path / "c.pt", model=model, step=0, extra={"config": {"scale": np.float64(2.0)}})
    with pytest.raises(TypeError, match="extra must be a dict"):
        save_checkpoint(tmp_path / "c.pt", model=model, step=0, extra=[1, 2])
    with pytest.raises(ValueError, match="step must be a non-negative int, got -1"):
        save_checkpoint(tmp_path / "c.pt", model=model, step=-1)
    with pytest.raises(TypeError, match="generators"):
        save_checkpoint(tmp_path / "c.pt", model=model, step=0, generators={"g": 3})
    assert not any(tmp_path.iterdir())


def test_failed_save_keeps_previous_checkpoint_and_leaves_no_temp_file(tmp_path, monkeypatch):
    model = nn.Linear(3, 3)
    path = save_checkpoint(tmp_path / "c.pt", model=model, step=1)
    before = path.read_bytes()

    real_save = torch.save

    def save_then_crash(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)  # bytes reach the temp file, then the "disk fills up"
        f.write(b"garbage")
        raise OSError("No space left on device")

    monkeypatch.setattr(torch, "save", save_then_crash)
    with torch.no_grad():
        model.weight.add_(1.0)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(path, model=model, step=2)
    monkeypatch.undo()

    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]
    assert path.read_bytes() == before
    assert load_checkpoint(path, model=nn.Linear(3, 3))["step"] == 1


def test_compiled_model_checkpoint_has_plain_keys_and_loads_both_ways(tmp_path):
    # Wrapping with torch.compile is cheap; only the first forward pass compiles (~30 s on a CPU), so the
    # test never runs one: state_dict keys and _orig_mod are all the checkpoint code sees.
    try:
        compiled = torch.compile(nn.Linear(4, 4))
    except Exception as e:  # pragma: no cover - platforms without torch.compile
        pytest.skip(f"torch.compile unavailable: {e}")
    assert all(k.startswith("_orig_mod.") for k in compiled.state_dict())
    path = save_checkpoint(tmp_path / "c.pt", model=compiled, step=3)
    assert set(torch.load(path, weights_only=True)["model"]) == {"weight", "bias"}

    plain = nn.Linear(4, 4)
    load_checkpoint(path, model=plain)
    assert torch.equal(plain.weight, compiled._orig_mod.weight)

    target = torch.compile(nn.Linear(4, 4))  # and into a compiled model
    load_checkpoint(path, model=target)
    assert torch.equal(target._orig_mod.bias, compiled._orig_mod.bias)


def test_load_strips_wrapper_prefixes_written_by_other_code(tmp_path):
    source = nn.Linear(4, 2)
    expected = source.weight.detach().clone()  # DataParallel moves source to the GPU when there is one
    wrapped = nn.DataParallel(FakeCompiled(source))  # keys: module._orig_mod.weight, ...
    torch.save({"step": 7, "model": wrapped.state_dict()}, tmp_path / "theirs.pt")
    torch.save(FakeCompiled(source).state_dict(), tmp_path / "bare.pt")  # a bare state_dict

    for name, step in (("theirs.pt", 7), ("bare.pt", 0)):
        target = nn.Linear(4, 2)
        assert load_checkpoint(tmp_path / name, model=target)["step"] == step
        assert torch.equal(target.weight, expected)


def test_load_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        load_checkpoint(tmp_path / "nope.pt", model=nn.Linear(2, 2))

    path = save_checkpoint(tmp_path / "c.pt", model=nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 2)), step=0)
    with pytest.raises(ValueError, match=r"missing keys.*'?weight.*unexpected keys.*0\.weight"):
        load_checkpoint(path, model=nn.Linear(2, 2))
    with pytest.raises(ValueError, match=r"shape mismatches.*0\.weight: checkpoint \(3, 2\) vs model \(4, 2\)"):
        load_checkpoint(path, model=nn.Sequential(nn.Linear(2, 4), nn.Linear(3, 2)))
    model = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 2))
    with pytest.raises(ValueError, match="optimizer was given but the checkpoint"):
        load_checkpoint(path, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    before = [p.clone() for p in model.parameters()]
    with pytest.raises(ValueError, match=r"generators\['batches'\] is not in the checkpoint"):
        load_checkpoint(path, model=model, generators={"batches": torch.Generator()})
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # nothing half-loaded
    torch.save({"weights": [1, 2]}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="neither a checkpoint nor a state_dict; its keys are weights"):
        load_checkpoint(tmp_path / "other.pt", model=model)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_rng_state_is_restored(tmp_path):
    torch.rand(1, device="cuda")  # initialise CUDA and its generator
    path = save_checkpoint(tmp_path / "c.pt", model=nn.Linear(2, 2), step=0)
    expected = torch.rand(5, device="cuda")
    torch.cuda.manual_seed_all(12345)
    load_checkpoint(path, model=nn.Linear(2, 2))
    assert torch.equal(torch.rand(5, device="cuda"), expected)


def test_latest_checkpoint_compares_steps_numerically(tmp_path):
    assert latest_checkpoint(tmp_path / "missing") is None
    assert latest_checkpoint(tmp_path) is None
    for step in (2, 99_999_999, 123_456_789, 10):
        checkpoint_path(tmp_path, step).write_bytes(b"")
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / ".step_999999999.pt.tmp-1-abcd").write_bytes(b"")  # an interrupted save
    assert latest_checkpoint(tmp_path) == tmp_path / "step_123456789.pt"
    assert checkpoint_path(tmp_path, 5).name == "step_00000005.pt"
    with pytest.raises(NotADirectoryError):
        latest_checkpoint(tmp_path / "notes.txt")


def test_unwrap_model():
    model = nn.Linear(2, 2)
    assert unwrap_model(model) is model
    assert unwrap_model(FakeCompiled(model)) is model
    assert unwrap_model(nn.DataParallel(FakeCompiled(model))) is model
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        unwrap_model("model")


# ---------------------------------------------------------------------------------------------------------
# Learning-rate schedule


def lr_after(steps: int, **kwargs) -> float:
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.5)
    sched = warmup_cosine(opt, **kwargs)
    for _ in range(steps):
        opt.step()
        sched.step()
    return opt.param_groups[0]["lr"]


def test_warmup_cosine_values_against_the_formula():
    kw = dict(warmup_steps=10, total_steps=110, min_lr_ratio=0.2)
    base, lo = 0.5, 0.5 * 0.2
    assert lr_after(0, **kw) == pytest.approx(base / 11)  # small but not zero
    assert lr_after(5, **kw) == pytest.approx(base * 6 / 11)
    assert lr_after(10, **kw) == pytest.approx(base)  # end of warmup
    assert lr_after(35, **kw) == pytest.approx(lo + (base - lo) * 0.5 * (1 + math.cos(math.pi / 4)))
    assert lr_after(60, **kw) == pytest.approx((base + lo) / 2)  # midpoint of the decay
    assert lr_after(110, **kw) == pytest.approx(lo)  # end
    assert lr_after(150, **kw) == pytest.approx(lo)  # flat after the end
    assert lr_after(0, warmup_steps=0, total_steps=10) == pytest.approx(base)  # no warmup
    assert lr_after(3, warmup_steps=3, total_steps=3, min_lr_ratio=0.1) == pytest.approx(0.05)


@settings(max_examples=50, deadline=None)
@given(warmup=st.integers(0, 50), extra=st.integers(0, 200), ratio=st.floats(0, 1))
def test_warmup_cosine_rises_then_falls_within_bounds(warmup, extra, ratio):
    total = max(warmup + extra, 1)
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    f = warmup_cosine(opt, warmup_steps=warmup, total_steps=total, min_lr_ratio=ratio).lr_lambdas[0]
    values = [f(s) for s in range(total + 5)]
    assert all(0 < v < 1 for v in values[:warmup])
    assert all(a < b for a, b in zip(values[:warmup], values[1:warmup]))  # strictly rising warmup
    assert values[warmup] == pytest.approx(1.0 if total > warmup else ratio)
    assert all(a >= b - 1e-12 for a, b in zip(values[warmup:], values[warmup + 1:]))  # then never rising
    assert all(v >= ratio - 1e-12 for v in values[warmup:])  # the floor holds once warmup is over
    assert values[-1] == pytest.approx(ratio)


def test_warmup_cosine_rejects_bad_arguments():
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ValueError, match="warmup_steps must be an int >= 0, got -1"):
        warmup_cosine(opt, warmup_steps=-1, total_steps=10)
    with pytest.raises(ValueError, match=r"total_steps must be >= warmup_steps \(10\), got 5"):
        warmup_cosine(opt, warmup_steps=10, total_steps=5)
    with pytest.raises(ValueError, match="total_steps must be an int >= 1, got 0"):
        warmup_cosine(opt, warmup_steps=0, total_steps=0)
    with pytest.raises(TypeError, match="warmup_steps must be an int"):
        warmup_cosine(opt, warmup_steps=2.5, total_steps=10)
    with pytest.raises(ValueError, match=r"min_lr_ratio must be a float in \[0, 1\], got 1.5"):
        warmup_cosine(opt, warmup_steps=1, total_steps=10, min_lr_ratio=1.5)
    with pytest.raises(TypeError, match="optimizer must be a torch.optim.Optimizer"):
        warmup_cosine([], warmup_steps=1, total_steps=10)


def test_warmup_stable_decay_values_against_the_formula():
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    # warmup 10, then 100 steps: 80 at the full rate, a linear decay over the last 20 (decay_fraction 0.2) to 0.1
    f = warmup_stable_decay(opt, warmup_steps=10, total_steps=110, min_lr_ratio=0.1).lr_lambdas[0]
    assert f(0) == pytest.approx(1 / 11) and f(5) == pytest.approx(6 / 11)  # warmup as warmup_cosine's
    assert f(10) == f(50) == f(90) == 1.0  # stable
    assert f(100) == pytest.approx(0.1 + 0.9 * 10 / 20)  # half way down the decay
    assert f(109) == pytest.approx(0.1 + 0.9 / 20)
    assert f(110) == f(200) == pytest.approx(0.1)  # the end, and after it
    g = warmup_stable_decay(opt, warmup_steps=0, total_steps=10, decay_fraction=1.0).lr_lambdas[0]
    assert [g(s) for s in range(11)] == pytest.approx([1 - s / 10 for s in range(11)])  # all decay: linear to 0
    # The optimizer's rate follows the rule step by step, and resume_schedule reproduces it.
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.5)
    sched = warmup_stable_decay(opt, warmup_steps=2, total_steps=12, decay_fraction=0.5)
    rates = []
    for _ in range(12):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    rule = warmup_stable_decay(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0), warmup_steps=2,
                               total_steps=12, decay_fraction=0.5).lr_lambdas[0]
    assert rates == pytest.approx([0.5 * rule(s) for s in range(12)])
    assert resume_schedule(sched) == pytest.approx([0.5 * rule(12)])


def test_warmup_stable_decay_rejects_bad_arguments():
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    for bad in (0, 1.5, -0.1, "0.2"):
        with pytest.raises(ValueError, match=f"decay_fraction must be a float in \\(0, 1\\], got {bad!r}"):
            warmup_stable_decay(opt, warmup_steps=1, total_steps=10, decay_fraction=bad)
    with pytest.raises(ValueError, match=r"total_steps must be >= warmup_steps \(10\), got 5"):
        warmup_stable_decay(opt, warmup_steps=10, total_steps=5)
    with pytest.raises(TypeError, match="optimizer must be a torch.optim.Optimizer"):
        warmup_stable_decay([], warmup_steps=1, total_steps=10)


# ---------------------------------------------------------------------------------------------------------
# Logging, plotting, progress


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_csv_logger_flushes_each_row_and_resumes_without_a_second_header(tmp_path):
    path = tmp_path / "logs" / "train.csv"
    log = CSVLogger(path, ["step", "loss", "val_loss"])
    log.log(step=1, loss=2.5)
    assert read_rows(path) == [["step", "loss", "val_loss"], ["1", "2.5", ""]]  # visible before close()
    log.log(step=2, loss=torch.tensor(2.25), val_loss=3.0)
    log.close()
    with pytest.raises(ValueError, match="after close"):
        log.log(step=3)

    with CSVLogger(path, ["step", "loss", "val_loss"]) as resumed:
        resumed.log(step=3, loss=2.0)
    assert read_rows(path) == [["step", "loss", "val_loss"], ["1", "2.5", ""], ["2", "2.25", "3.0"], ["3", "2.0", ""]]


def test_csv_logger_errors(tmp_path):
    path = tmp_path / "train.csv"
    CSVLogger(path, ["step", "loss"]).close()
    with pytest.raises(ValueError, match=r"already has columns \['step', 'loss'\]"):
        CSVLogger(path, ["step", "acc"])
    with CSVLogger(path, ["step", "loss"]) as log:
        with pytest.raises(ValueError, match=r"unknown column\(s\) \['acc'\]"):
            log.log(step=1, acc=0.5)
    with pytest.raises(ValueError, match="unique"):
        CSVLogger(tmp_path / "other.csv", ["a", "a"])


def test_csv_logger_resume_step_drops_rows_logged_after_it(tmp_path):
    # A run killed after logging steps 3 and 4 but checkpointed at 2 logs 3 and 4 again when it resumes.
    path = tmp_path / "train.csv"
    path.write_text("step,loss,note\n1,2.5,\n2,2.25,\n3,2.0,\n,,free text\n4,1.9,\n")
    with CSVLogger(path, ["step", "loss", "note"], resume_step=2) as log:
        log.log(step=3, loss=2.0)
    assert read_rows(path) == [["step", "loss", "note"], ["1", "2.5", ""], ["2", "2.25", ""], ["", "", "free text"],
                               ["3", "2.0", ""]]
    with CSVLogger(path, ["step", "loss", "note"], resume_step=0):  # a fresh start in the same folder
        pass
    assert read_rows(path) == [["step", "loss", "note"], ["", "", "free text"]]
    assert not [p for p in tmp_path.iterdir() if p.name != "train.csv"]  # rewritten atomically, no leftovers
    with pytest.raises(ValueError, match="resume_step must be a non-negative int"):
        CSVLogger(path, ["step", "loss", "note"], resume_step=-1)
    with pytest.raises(ValueError, match="step_column 'epoch' is not one of"):
        CSVLogger(path, ["step", "loss", "note"], resume_step=1, step_column="epoch")


def test_csv_logger_repairs_a_partial_last_line(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text("step,loss\n1,2.5\n2,2.")  # crashed mid-row
    with CSVLogger(path, ["step", "loss"]) as log:
        log.log(step=3, loss=1.5)
    assert read_rows(path)[-1] == ["3", "1.5"]


def test_plot_curves_writes_png_or_returns_false_without_matplotlib(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    csv_path = tmp_path / "train.csv"
    with CSVLogger(csv_path, ["step", "loss", "val_loss"]) as log:
        for step in range(1, 21):
            log.log(step=step, loss=1 / step, **({"val_loss": 1.2 / step} if step % 5 == 0 else {}))

    png = tmp_path / "plots" / "curves.png"
    assert plot_curves(csv_path, png, x="step", ys=["loss", "val_loss"], title="tiny") is True
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000

    with pytest.raises(ValueError, match=r"column\(s\) \['acc'\] not in"):
        plot_curves(csv_path, png, x="step", ys=["acc"])

    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg", "matplotlib.pyplot"):
        monkeypatch.setitem(sys.modules, name, None)  # makes "import name" raise ImportError
    assert plot_curves(csv_path, tmp_path / "none.png", x="step", ys=["loss"]) is False
    assert not (tmp_path / "none.png").exists()


def test_progress_with_and_without_tqdm(monkeypatch):
    bar = progress(range(3), desc="x", disable=True)
    assert list(bar) == [0, 1, 2]

    monkeypatch.setitem(sys.modules, "tqdm", None)
    bar = progress(range(4), desc="epoch")
    seen = []
    for i in bar:
        bar.set_postfix(loss=0.5)
        seen.append(i)
    bar.close()
    assert seen == [0, 1, 2, 3] and bar.n == 4 and len(bar) == 4
    with progress(total=10) as manual:
        manual.update(3)
        manual.update()
        manual.set_description("done")
        manual.unpause()  # a no-op without tqdm, as the scripts call it after every evaluation
        assert manual.n == 4 and manual.total == 10


def test_unpause_leaves_the_time_between_out_of_the_bars_rate():
    # What the scripts call after an evaluation: tqdm then counts neither its time in the elapsed time nor in the
    # rate and the time left it shows. A 0.5 s "evaluation" between quick steps, with and without unpause.
    pytest.importorskip("tqdm")
    import time as clock

    elapsed = {}
    for unpause in (False, True):
        bar = progress(total=1000, desc="train", disable=False)
        bar.update(5)
        clock.sleep(0.5)
        if unpause:
            bar.unpause()
        bar.update(5)
        elapsed[unpause] = bar.format_dict["elapsed"]
        bar.close()
    assert elapsed[False] >= 0.5 and elapsed[True] < 0.25, elapsed


def test_the_checkpoint_clock_is_due_after_its_minutes_and_restarts_at_each_save(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr("torchformer.train.training.time.monotonic", lambda: now[0])
    clock = CheckpointClock(2.0)
    now[0] += 119
    assert not clock.due()
    now[0] += 1
    assert clock.due() and clock.due()  # due until a save restarts it
    clock.reset()
    assert not clock.due()
    now[0] += 120
    assert clock.due()
    never = CheckpointClock(None)
    now[0] += 1e9
    assert not never.due()
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="minutes must be a positive number or None"):
            CheckpointClock(bad)
    for bad in ("5", True, [1]):
        with pytest.raises(TypeError, match="minutes must be a positive number or None, got"):
            CheckpointClock(bad)


# ---------------------------------------------------------------------------------------------------------
# Devices, seeds, parameters


def test_resolve_device():
    default = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device() == default and resolve_device("auto") == default
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    with pytest.raises(ValueError, match="'banana'"):
        resolve_device("banana")
    with pytest.raises(TypeError, match="device must be a str, torch.device or None, got int"):
        resolve_device(0)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="'cuda:0' was requested but CUDA is not available"):
            resolve_device("cuda:0")
    else:
        with pytest.raises(ValueError, match="CUDA device"):
            resolve_device(f"cuda:{torch.cuda.device_count()}")


def test_autocast_is_a_no_op_on_cpu_and_when_disabled():
    a = torch.randn(4, 4)
    with autocast(torch.device("cpu")):
        assert (a @ a).dtype == torch.float32
        assert not torch.is_autocast_enabled()
    with autocast("cuda", enabled=False):  # never touches CUDA, so this works on CPU-only machines too
        assert (a @ a).dtype == torch.float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_autocast_uses_bfloat16_on_cuda():
    a = torch.randn(4, 4, device="cuda")
    with autocast(torch.device("cuda")):
        assert (a @ a).dtype == torch.bfloat16
    assert (a @ a).dtype == torch.float32


def test_set_seed_makes_all_generators_repeat():
    def draw():
        return random.random(), float(np.random.rand()), torch.rand(3)

    set_seed(7)
    first = draw()
    set_seed(7)
    again = draw()
    set_seed(8)
    other = draw()
    assert first[:2] == again[:2] and torch.equal(first[2], again[2])
    assert first[0] != other[0] and first[1] != other[1] and not torch.equal(first[2], other[2])
    with pytest.raises(ValueError, match="seed must be an int >= 0, got -1"):
        set_seed(-1)
    with pytest.raises(ValueError, match="seed must be < 2\\*\\*32"):
        set_seed(2**32)


def test_count_parameters_counts_tied_weights_once():
    emb, head = nn.Embedding(10, 4), nn.Linear(4, 10, bias=False)
    head.weight = emb.weight  # weight tying, as in language models
    model = nn.Sequential(emb, nn.Linear(4, 4), head)
    assert count_parameters(model) == 10 * 4 + 4 * 4 + 4
    model[1].bias.requires_grad_(False)
    assert count_parameters(model, trainable_only=True) == 10 * 4 + 4 * 4
    assert count_parameters(unwrap_model(FakeCompiled(model))) == count_parameters(FakeCompiled(model))


def test_prune_checkpoints_keeps_the_newest_by_step_number(tmp_path):
    for step in (5, 40, 100, 7):
        checkpoint_path(tmp_path, step).write_bytes(b"x")
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    (tmp_path / "step_\u0663.pt").write_bytes(b"x")  # an Arabic-Indic 3: no step number of ours
    deleted = prune_checkpoints(tmp_path, keep=2)
    assert sorted(p.name for p in deleted) == ["step_00000005.pt", "step_00000007.pt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "step_00000040.pt", "step_00000100.pt",
                                                          "step_\u0663.pt"]
    assert prune_checkpoints(tmp_path / "missing") == []
    with pytest.raises(ValueError, match="keep must be a positive int, got 0"):
        prune_checkpoints(tmp_path, keep=0)


# ---------------------------------------------------------------------------------------------------------
# Hostile inputs: each error names the argument, what was expected and what was received


def test_csv_logger_refuses_cells_plot_curves_could_not_read(tmp_path):
    path = tmp_path / "train.csv"
    with CSVLogger(path, ["step", "loss", "note"]) as log:
        for bad, shown in [(torch.tensor([0.5, 0.6]), r"Tensor of shape \(2,\)"), ([1, 2], "list"),
                           (np.array([0.5, 0.6]), r"ndarray of shape \(2,\)"), (1 + 2j, "complex"),
                           (torch.tensor(1 + 2j), "Tensor"), ({}, "dict")]:
            with pytest.raises(TypeError, match=f"column 'loss' must be a number, str, None or a one-element "
                                                f"tensor, got .*{shown}"):
                log.log(step=1, loss=bad)
        with pytest.raises(ValueError, match="log\\(\\) needs at least one column"):
            log.log()
        log.log(step=np.int64(1), loss=torch.tensor([[0.25]]), note="ok")  # one element, any shape
        log.log(step=2, loss=np.float32(0.5), note=None)
        log.log(step=3, loss=np.array([0.125]))
    assert read_rows(path) == [["step", "loss", "note"], ["1", "0.25", "ok"], ["2", "0.5", ""], ["3", "0.125", ""]]


def test_csv_logger_resume_keeps_rows_whose_step_is_not_finite(tmp_path):
    # nan and inf are not steps, so they are never "after" the resume step; rows with extra cells stay as they are.
    path = tmp_path / "train.csv"
    path.write_text("step,loss\n1,2.5\nnan,2.0\ninf,1.9\n-inf,1.8\n1e400,1.7\n3,1.6\n1,2,extra\n")
    CSVLogger(path, ["step", "loss"], resume_step=2).close()
    assert read_rows(path) == [["step", "loss"], ["1", "2.5"], ["nan", "2.0"], ["inf", "1.9"], ["-inf", "1.8"],
                               ["1e400", "1.7"], ["1", "2", "extra"]]


def test_csv_files_that_are_not_utf8_are_named(tmp_path):
    path = tmp_path / "latin1.csv"
    path.write_bytes("step,loss\n1,caf\xe9\n".encode("latin-1"))
    for call in (lambda: CSVLogger(path, ["step", "loss"]), lambda: CSVLogger(path, ["step", "loss"], resume_step=0),
                 lambda: plot_curves(path, tmp_path / "x.png", x="step", ys=["loss"])):
        with pytest.raises(ValueError, match=f"{path} is not a UTF-8 text file"):
            call()
    assert path.read_bytes() == "step,loss\n1,caf\xe9\n".encode("latin-1")  # left as it was
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbfstep,loss\n1,2.5\n")  # written by a spreadsheet: the mark is not part of "step"
    CSVLogger(bom, ["step", "loss"]).close()


def test_csv_logger_paths_and_fieldnames(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="path must name a file, got the existing folder"):
        CSVLogger(tmp_path, ["step"])
    with pytest.raises(ValueError, match="path must name a file, got an empty path"):
        CSVLogger("", ["step"])
    with pytest.raises(TypeError, match="path must be a str or os.PathLike naming a file, got NoneType"):
        CSVLogger(None, ["step"])
    with pytest.raises(TypeError, match="fieldnames must be a sequence of non-empty str, got NoneType"):
        CSVLogger(tmp_path / "a.csv", None)
    with CSVLogger(tmp_path / "b.csv", (name for name in ["step", "loss"])) as log:  # a generator, read once
        assert log.fieldnames == ["step", "loss"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.csv"]
    with pytest.raises(NotADirectoryError, match="b.csv is a file, not a folder"):
        CSVLogger(tmp_path / "b.csv" / "runs" / "log.csv", ["step"])


def test_plot_curves_refuses_paths_that_are_no_png_file_and_names_bad_cells(tmp_path):
    pytest.importorskip("matplotlib")
    csv_path = tmp_path / "train.csv"
    csv_path.write_text("step,loss,note\n1,2.5,a\n2,,b\n3,2.0\n")
    folder = tmp_path / "plots"
    folder.mkdir()
    for png, message in [(folder, "png_path must name a file, got the existing folder"),
                         ("", "png_path must name a file, got an empty path"),
                         (tmp_path / "curves", "png_path must name a .png file"),
                         (tmp_path / "curves.jpg", "png_path must name a .png file")]:
        with pytest.raises(ValueError, match=message):
            plot_curves(csv_path, png, x="step", ys=["loss"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plots", "train.csv"]  # nothing written (plots.png)
    with pytest.raises(ValueError, match="line 2: column 'note' holds 'a', not a number"):
        plot_curves(csv_path, tmp_path / "c.png", x="step", ys=["note"])
    assert plot_curves(csv_path, tmp_path / "c.png", x="step", ys=(y for y in ["loss"])) is True  # short rows: skipped


def test_check_finite_losses_reads_any_iterable_once_and_names_bad_arguments():
    check_finite_losses((x for x in [1.0, 2.0]), (s for s in [1, 2]))  # generators: no len()
    check_finite_losses(torch.tensor([1.0, 2.0]), torch.tensor([3, 4]))
    check_finite_losses([torch.tensor(1.0), np.float32(2.0), 3], range(3))
    check_finite_losses([], [])
    with pytest.raises(TrainingDiverged, match="at step 8: the loss is nan"):
        check_finite_losses((x for x in [1.0, float("nan")]), np.array([7, 8]))
    with pytest.raises(TrainingDiverged, match="at step 1: the loss is inf"):
        check_finite_losses([torch.tensor(float("inf"))], [1])
    for losses, steps, message in [
        (None, [1], "losses must be an iterable of real numbers .*got NoneType"),
        ("12", [1, 2], "losses must be an iterable of real numbers .*got str"),
        (1.5, 1, "losses must be an iterable of real numbers .*got float"),
        (torch.ones(2, 2), [1, 2], r"losses must be an iterable .*got a Tensor of shape \(2, 2\)"),
        ([1 + 2j], [1], r"losses\[0\] is complex"),
        ([1.0, True], [1, 2], r"losses\[1\] is bool"),
        ([1.0], [1.5], r"steps must be an iterable of integers .*steps\[0\] is float"),
        ([1.0], None, "steps must be an iterable of integers .*got NoneType"),
    ]:
        with pytest.raises(TypeError, match=message):
            check_finite_losses(losses, steps)
    with pytest.raises(ValueError, match="same length, got 2 and 1"):
        check_finite_losses((x for x in [1.0, 2.0]), [1])


def test_devices_that_cannot_run_a_model_are_refused():
    for device, message in [("meta", "device must be a device that can run a model, got 'meta'"),
                            (torch.device("meta"), "got 'meta'"),
                            ("cpu:5", "device must be 'cpu' .*got 'cpu:5'; did you mean 'cuda:5'"),
                            ("opengl", "device 'opengl' was requested but this torch cannot place tensors there"),
                            ("gpu", "device must be 'auto', 'cpu', 'cuda'.*got 'gpu'")]:
        with pytest.raises(ValueError, match=message):
            resolve_device(device)
        with pytest.raises(ValueError, match=message):  # autocast reads its device the same way
            autocast(device)
    assert resolve_device("cpu:0") == torch.device("cpu:0")
    assert resolve_device(" CPU ") == torch.device("cpu")
    with pytest.raises(TypeError, match="device must be a str, torch.device or None, got int"):
        autocast(0)
    with pytest.raises(TypeError, match="enabled must be a bool, got 'no'"):
        autocast("cpu", enabled="no")
    with autocast(None):  # None and "auto", as resolve_device
        assert not torch.is_autocast_enabled()
    with pytest.raises(ValueError, match="device must be .*got 'gpu'"):
        autocast("gpu", enabled=False)  # disabled, the name is still checked
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="'cuda' was requested but CUDA is not available"):
            autocast("cuda")


def test_count_parameters_trainable_only_must_be_a_bool():
    with pytest.raises(TypeError, match="trainable_only must be a bool, got 'yes'"):
        count_parameters(nn.Linear(2, 2), trainable_only="yes")


def test_progress_checks_its_arguments():
    with pytest.raises(ValueError, match="total must be a number >= 0 or None, got 'x'"):
        progress(range(2), total="x")
    with pytest.raises(TypeError, match="iterable must be an iterable or None, got int"):
        progress(5)
    with pytest.raises(TypeError, match="desc must be a str or None, got int"):
        progress(range(2), desc=3)


def test_plot_curves_labels_the_axis_and_marks_single_points(tmp_path, monkeypatch):
    """What is drawn, read back from the figure before it is saved: the y label, the curves and the marks."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    csv_path = tmp_path / "log.csv"
    with CSVLogger(csv_path, ["step", "train_bpb", "val_bpb"]) as log:
        for step in range(1, 11):
            log.log(step=step, train_bpb=3 / step, **({"val_bpb": 3.5 / step} if step % 5 == 0 else {}))
    drawn = []
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: (drawn.append(fig), save(fig, *a, **k))[1])
    marks = {"test, whole split: 0.400": (10, 0.4)}
    assert plot_curves(csv_path, tmp_path / "a.png", x="step", ys=["train_bpb", "val_bpb"], ylabel="bits per byte",
                       marks=marks)
    ax = drawn[-1].axes[0]
    assert ax.get_ylabel() == "bits per byte" and ax.get_xlabel() == "step"
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines) == ["train_bpb", "val_bpb", "test, whole split: 0.400"]
    assert list(lines["val_bpb"].get_xdata()) == [5, 10]
    assert (list(lines["test, whole split: 0.400"].get_xdata()), list(lines["test, whole split: 0.400"].get_ydata())
            ) == ([10], [0.4])
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(lines)
    plot_curves(csv_path, tmp_path / "b.png", x="step", ys=["val_bpb"])
    assert drawn[-1].axes[0].get_ylabel() == "val_bpb"  # one curve and no ylabel: the column names the axis

    for bad in ({"a": (1,)}, {"a": ("x", 1)}, {3: (1, 2)}, {"a": (True, 1)}):
        with pytest.raises(ValueError, match="marks must map labels"):
            plot_curves(csv_path, tmp_path / "c.png", x="step", ys=["val_bpb"], marks=bad)
    with pytest.raises(TypeError, match="ylabel must be a str or None, got int 3"):
        plot_curves(csv_path, tmp_path / "c.png", x="step", ys=["val_bpb"], ylabel=3)

    # A linear axis by default; logy for losses. A long title is wrapped to lines the figure holds, not cut.
    assert drawn[-1].axes[0].get_yscale() == "linear"
    title = "enwik8_prefix.gz: training batches and validation estimate, in bits per byte, with a longer tail"
    plot_curves(csv_path, tmp_path / "d.png", x="step", ys=["train_bpb"], logy=True, title=title)
    ax = drawn[-1].axes[0]
    assert ax.get_yscale() == "log" and ax.get_title().replace("\n", " ") == title
    assert all(len(line) <= 70 for line in ax.get_title().split("\n")) and "\n" in ax.get_title()
    left, _, right, _ = ax.title.get_window_extent(drawn[-1].canvas.get_renderer()).extents
    assert 0 <= left and right <= drawn[-1].bbox.width  # inside the figure
    plot_curves(csv_path, tmp_path / "f.png", x="step", ys=["train_bpb"], title="first line\nsecond line")
    assert drawn[-1].axes[0].get_title() == "first line\nsecond line"  # the title's own line breaks are kept
    with pytest.raises(TypeError, match="logy must be a bool"):
        plot_curves(csv_path, tmp_path / "e.png", x="step", ys=["val_bpb"], logy="yes")


def test_resume_schedule_sets_the_new_rules_rate_at_the_saved_step():
    """A schedule rebuilt with another length, its state loaded: the rates are the new rule's at the saved step."""
    from torchformer.train.training import resume_schedule, warmup_cosine

    param = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([param], lr=1.0)
    old = warmup_cosine(opt, warmup_steps=2, total_steps=10)
    for _ in range(9):
        opt.step()
        old.step()
    saved_opt, saved_sched = opt.state_dict(), old.state_dict()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 7 / 8)))

    opt2 = torch.optim.SGD([param], lr=1.0)
    new = warmup_cosine(opt2, warmup_steps=2, total_steps=20)  # the run extended to 20 steps
    opt2.load_state_dict(saved_opt)
    new.load_state_dict(saved_sched)
    expected = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 7 / 18))  # step 9 of the new rule
    assert opt2.param_groups[0]["lr"] != pytest.approx(expected)  # what loading alone leaves: the old rule's rate
    assert resume_schedule(new) == [pytest.approx(expected)]
    assert opt2.param_groups[0]["lr"] == pytest.approx(expected) and new.get_last_lr() == [pytest.approx(expected)]
    with pytest.raises(TypeError, match="scheduler must be a torch.optim.lr_scheduler.LambdaLR, got StepLR"):
        resume_schedule(torch.optim.lr_scheduler.StepLR(opt2, 2))
