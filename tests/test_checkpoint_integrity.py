"""Damaged checkpoints are detected, a run resumes from the newest intact one, and interrupted saves leave nothing
behind (torchformer.train.checkpoint)."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from torchformer import GTransformer
from torchformer._files import STALE_AFTER_S, host_tag, write_atomically
from torchformer.train.checkpoint import (
    CheckpointError,
    CheckpointVersionError,
    checkpoint_path,
    latest_intact_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    read_checkpoint,
    remove_stale_temporaries,
    save_checkpoint,
    verify_checkpoint,
)


def tiny(seed: int = 0) -> GTransformer:
    torch.manual_seed(seed)
    return GTransformer(16, 2, 1, 8, 20)


def saved(tmp_path, step: int = 1, model=None):
    model = model or tiny()
    opt = torch.optim.Adam(model.parameters())
    model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    opt.step()  # so the optimizer state holds tensors too
    return save_checkpoint(checkpoint_path(tmp_path, step), model=model, optimizer=opt, step=step,
                           extra={"note": "x", "values": [1.5, 2]})


def flip(path, position: int, count: int = 64) -> None:
    data = bytearray(path.read_bytes())
    for i in range(position, min(position + count, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_flipped_bytes_anywhere_are_detected_or_change_nothing(tmp_path):
    # The outside probe flipped 64 bytes and loaded weights off by up to 266.8. Now every flip either raises
    # CheckpointError or (in bytes torch.load never reads, such as zip padding) leaves the loaded content unchanged.
    model = tiny()
    path = saved(tmp_path, model=model)
    original = path.read_bytes()
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    rng = random.Random(0)
    detected = 0
    for _ in range(60):
        path.write_bytes(original)
        flip(path, rng.randrange(len(original)))
        target = tiny(seed=1)
        try:
            load_checkpoint(path, model=target)
        except CheckpointError as e:
            assert str(path) in str(e)
            detected += 1
            continue
        assert all(torch.equal(target.state_dict()[k], v) for k, v in expected.items())
    assert detected >= 50  # nearly every position is content


def test_a_flip_inside_the_weights_is_named_as_damage(tmp_path):
    model = tiny()
    path = saved(tmp_path, model=model)
    # Find a weight's bytes in the file and flip one bit there: torch.load reads it without complaint.
    weight = max(model.state_dict().values(), key=torch.Tensor.numel).numpy().tobytes()
    data = path.read_bytes()
    where = data.find(weight[:64])
    assert where > 0
    flip(path, where + 10, count=1)
    torch.load(path, weights_only=True)  # still a readable file ...
    with pytest.raises(CheckpointError, match="damaged: its content changed after it was written"):
        load_checkpoint(path, model=tiny())  # ... but not the one that was written
    with pytest.raises(CheckpointError, match=str(path)):
        verify_checkpoint(path)
    read_checkpoint(path)  # metadata only (memory-mapped): documented not to check the weights


def test_changed_plain_values_are_detected(tmp_path):
    # The digest covers the non-tensor content too (step, extra): rewrite the file with one value changed.
    path = saved(tmp_path)
    payload = torch.load(path, weights_only=True)
    payload["step"] = 7
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match="damaged"):
        load_checkpoint(path, model=tiny())


@pytest.mark.parametrize("content, says", [
    (b"", "empty file"),
    (None, "damaged \\(truncated\\?\\) or not a checkpoint"),  # truncated (filled in below)
    (bytes(random.Random(1).getrandbits(8) for _ in range(4096)), "damaged \\(truncated\\?\\) or not a checkpoint"),
    (b"\x89PNG\r\n\x1a\n" + bytes(200), "damaged \\(truncated\\?\\) or not a checkpoint"),
])
def test_unreadable_files_are_one_clear_error_naming_the_file(tmp_path, content, says):
    path = saved(tmp_path)
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2] if content is None else content)
    for call in (lambda: load_checkpoint(path, model=tiny()), lambda: read_checkpoint(path),
                 lambda: verify_checkpoint(path)):
        with pytest.raises(CheckpointError, match=says) as info:
            call()
        assert str(path) in str(info.value)
        assert "weights_only=False" not in str(info.value)  # torch's advice to load unsafely is not passed on
        assert isinstance(info.value, ValueError)


def test_a_checkpoint_without_digest_still_loads(tmp_path):
    # Files written before the digest existed (format 1) and bare state_dicts load unchecked.
    model = tiny()
    path = saved(tmp_path, model=model)
    payload = torch.load(path, weights_only=True)
    del payload["integrity"]
    payload["format_version"] = 1  # what files of before the digest say
    torch.save(payload, path)
    verify_checkpoint(path)
    load_checkpoint(path, model=tiny(seed=3))
    torch.save(model.state_dict(), tmp_path / "bare.pt")
    verify_checkpoint(tmp_path / "bare.pt")


def test_resume_falls_back_to_the_newest_intact_checkpoint_and_warns(tmp_path):
    for step in (10, 20, 30):
        saved(tmp_path, step)
    newest = checkpoint_path(tmp_path, 30)
    newest.write_bytes(newest.read_bytes()[:500])  # truncated by a crash
    middle = checkpoint_path(tmp_path, 20)
    flip(middle, len(middle.read_bytes()) // 2)  # damaged in the middle
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = latest_intact_checkpoint(tmp_path)
    assert found == checkpoint_path(tmp_path, 10)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2 and str(newest) in messages[0] and str(middle) in messages[1]
    assert load_checkpoint(found, model=tiny())["step"] == 10


def test_a_resumed_run_sets_the_damaged_checkpoints_aside_so_pruning_keeps_its_own(tmp_path):
    """Resuming at step 10 past damaged steps 20 and 30, then saving steps 11 and 12: without set_aside, pruning
    (which keeps the highest numbers) deleted 11 and 12 and kept the two damaged files."""
    for step in (10, 20, 30):
        saved(tmp_path, step)
    for step in (20, 30):
        checkpoint_path(tmp_path, step).write_bytes(b"")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert latest_intact_checkpoint(tmp_path, set_aside=True) == checkpoint_path(tmp_path, 10)
    assert [re.search(r"(step_\d+)\.pt.*\(renamed \1\.pt\.damaged, so that", str(w.message))[1]
            for w in caught] == ["step_00000030", "step_00000020"]
    for step in (11, 12):
        saved(tmp_path, step)
        prune_checkpoints(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step_00000011.pt", "step_00000012.pt", "step_00000020.pt.damaged", "step_00000030.pt.damaged"]
    assert latest_intact_checkpoint(tmp_path) == checkpoint_path(tmp_path, 12)
    with pytest.raises(TypeError, match="set_aside must be a bool, got 'yes'"):
        latest_intact_checkpoint(tmp_path, set_aside="yes")


def test_latest_intact_checkpoint_without_any(tmp_path):
    assert latest_intact_checkpoint(tmp_path / "none") is None
    path = saved(tmp_path)
    path.write_bytes(b"")
    with pytest.warns(UserWarning, match="empty file"):
        assert latest_intact_checkpoint(tmp_path) is None


def temporary(tmp_path, host: str, pid: int):
    path = tmp_path / f".step_00000005.pt.tmp-{host}-{pid}-0badcafe"
    path.write_bytes(b"half a checkpoint")
    return path


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # reaped: its pid no longer names a process (until reused, which takes a long time)
    return proc.pid


def test_stale_temporaries_of_killed_saves_are_removed_and_live_ones_kept(tmp_path):
    saved(tmp_path, 1)
    dead = temporary(tmp_path, host_tag(), dead_pid())
    mine = temporary(tmp_path, host_tag(), os.getpid())  # a save in progress in this process
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = temporary(tmp_path, host_tag(), sleeper.pid)  # another live process's save
        other_host_new = temporary(tmp_path, "elsewhere", 1)
        other_host_old = tmp_path / ".step_00000006.pt.tmp-elsewhere-1-00ff"  # abandoned a day ago
        other_host_old.write_bytes(b"x")
        old = time.time() - STALE_AFTER_S - 60
        os.utime(other_host_old, (old, old))
        removed = prune_checkpoints(tmp_path, keep=2)  # pruning counts (removes) them too
        assert sorted(removed) == sorted([dead, other_host_old])
        assert live.exists() and mine.exists() and other_host_new.exists()
        assert checkpoint_path(tmp_path, 1).exists()
        assert remove_stale_temporaries(tmp_path) == []
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_killed_save_leaves_a_temporary_that_the_next_start_removes(tmp_path):
    # A real kill -9 in the middle of write_atomically: the process writes part of its temporary file and dies.
    script = (
        "import os, sys; from pathlib import Path; from torchformer._files import write_atomically\n"
        "def write(tmp):\n"
        "    tmp.write_bytes(b'partial'); os.kill(os.getpid(), 9)\n"
        "write_atomically(Path(sys.argv[1]) / 'step_00000002.pt', write)\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env)
    assert result.returncode == -9
    left = [p for p in tmp_path.iterdir() if p.name.startswith(".step_00000002.pt.tmp-")]
    assert len(left) == 1 and not (tmp_path / "step_00000002.pt").exists()
    assert remove_stale_temporaries(tmp_path) == left
    assert list(tmp_path.iterdir()) == []


def test_write_atomically_names_its_temporary_for_the_cleanup(tmp_path):
    names = []
    write_atomically(tmp_path / "a.pt", lambda tmp: (names.append(tmp.name), tmp.write_bytes(b"1")))
    assert names[0].startswith(f".a.pt.tmp-{host_tag()}-{os.getpid()}-")


# ---------------------------------------------------------------------------------------------------------
# Loading changes nothing unless everything fits; saving refuses what it could not load again


def test_an_optimizer_that_does_not_fit_changes_nothing(tmp_path):
    path = saved(tmp_path)
    model = tiny(seed=5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="parameter groups of sizes \\[\\d+\\].*sizes \\[3\\]"):
        load_checkpoint(path, model=model, optimizer=torch.optim.Adam(list(model.parameters())[:3]))
    with pytest.raises(ValueError, match="state of a Adam optimizer, but the optimizer given is a SGD"):
        load_checkpoint(path, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    # Over the same parameters in reverse order: Adam's moments would go to parameters of other shapes.
    with pytest.raises(ValueError, match=r"optimizer state 'exp_avg' of shape \(\d+(, \d+)?\) for parameter \d+ of "
                                         r"group 0, whose shape is \(\d+(, \d+)?\): build the optimizer over the "
                                         r"same parameters, in the same order"):
        load_checkpoint(path, model=model, optimizer=torch.optim.Adam(list(model.parameters())[::-1]))
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())  # the weights did not change


def test_a_factored_optimizer_state_that_broadcasts_to_its_parameter_loads():
    """The shape check must not refuse state that is smaller than its parameter by design (1 in a dimension)."""
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    saved_state = opt.state_dict()
    for entry in saved_state["state"].values():
        entry["row"] = torch.zeros(*entry["exp_avg"].shape[:-1], 1)  # as Adafactor keeps a factored moment
    from torchformer.train.checkpoint import check_optimizer_groups
    check_optimizer_groups(saved_state, torch.optim.Adam(model.parameters()), Path("c.pt"))


def test_a_scheduler_of_another_class_is_refused(tmp_path):
    model = tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    path = save_checkpoint(tmp_path / "c.pt", model=model, optimizer=opt, step=1,
                           scheduler=torch.optim.lr_scheduler.StepLR(opt, 10))
    with pytest.raises(ValueError, match="StepLR scheduler, but the scheduler given is a LambdaLR"):
        load_checkpoint(path, model=model, scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_an_unavailable_map_location_is_named_not_called_damage(tmp_path):
    path = saved(tmp_path)
    with pytest.raises(ValueError, match="map_location 'cuda' was requested but CUDA is not available"):
        load_checkpoint(path, model=tiny(), map_location="cuda")
    with pytest.raises(ValueError, match="map_location must name a device.*'gpu'"):
        load_checkpoint(path, model=tiny(), map_location="gpu")


def test_save_paths_that_are_no_file_are_named(tmp_path):
    model = tiny()
    (tmp_path / "folder").mkdir()
    (tmp_path / "a_file").write_text("x")
    for path, error, match in [
        (tmp_path / "folder", IsADirectoryError, "got the existing folder .*folder; pass a file in it"),
        ("", ValueError, "path must name a file"),
        (".", ValueError, "path must name a file"),
        (tmp_path / "a_file" / "c.pt", NotADirectoryError, "a_file is a file, not a folder"),
        (tmp_path / "a_file" / "deeper" / "c.pt", NotADirectoryError, "a_file is a file, not a folder"),
        (3, TypeError, "path must be a str or os.PathLike"),
        (f"{tmp_path}/new_folder/", ValueError, "path must name a file, got the folder .*new_folder/'; pass a file"),
    ]:
        with pytest.raises(error, match=match):
            save_checkpoint(path, model=model, step=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "folder"]  # nothing written anywhere


def test_tensors_without_dense_data_are_refused_by_name(tmp_path):
    model = tiny()
    with pytest.raises(TypeError, match=r"\['extra'\]\['s'\]: it is a torch.sparse_coo tensor"):
        save_checkpoint(tmp_path / "c.pt", model=model, step=1, extra={"s": torch.eye(3).to_sparse()})
    with pytest.raises(TypeError, match="a meta tensor"):
        save_checkpoint(tmp_path / "c.pt", model=tiny().to("meta"), step=1)


def test_a_newer_format_and_a_removed_digest_are_refused(tmp_path):
    path = saved(tmp_path)
    payload = torch.load(path, weights_only=True)
    torch.save({**payload, "format_version": 99}, tmp_path / "newer.pt")
    with pytest.raises(CheckpointError, match=r"newer\.pt has format 99, written by a newer torchformer; this one "
                                              r"reads formats up to 3"):
        load_checkpoint(tmp_path / "newer.pt", model=tiny())
    edited = {k: v for k, v in payload.items() if k != "integrity"}
    edited["model"] = {k: torch.zeros_like(v) for k, v in edited["model"].items()}  # and the weights zeroed
    torch.save(edited, tmp_path / "edited.pt")
    with pytest.raises(CheckpointError, match=r"edited\.pt is damaged: it has format 3 but no integrity record"):
        verify_checkpoint(tmp_path / "edited.pt")
    with pytest.raises(TypeError, match="restore_rng must be a bool, got 'no'"):
        load_checkpoint(path, model=tiny(), restore_rng="no")


def test_hand_made_files_with_a_bad_model_or_rng_entry_are_named_before_anything_loads(tmp_path):
    payload = torch.load(saved(tmp_path), weights_only=True)
    payload.pop("integrity")
    payload["format_version"] = 1  # as a file of before the digest: nothing else would check it
    torch.save({**payload, "model": "x"}, tmp_path / "model_x.pt")
    with pytest.raises(CheckpointError, match=r"model_x\.pt is damaged or not a checkpoint: its 'model' must be a "
                                              r"state_dict \(names -> tensors\), got str 'x'"):
        load_checkpoint(tmp_path / "model_x.pt", model=tiny())
    torch.save({**payload, "rng": {**payload["rng"], "torch_cpu": torch.zeros(3)}}, tmp_path / "rng.pt")
    model = tiny(seed=5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"rng\.pt is damaged: its random number generator states do not "
                                              r"restore .*restore_rng=False"):
        load_checkpoint(tmp_path / "rng.pt", model=model)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())  # the weights did not change
    assert load_checkpoint(tmp_path / "rng.pt", model=model, restore_rng=False)["step"] == 1


def test_lbfgs_state_of_its_own_shapes_still_loads(tmp_path):
    """L-BFGS keeps flat vectors as long as all parameters together under parameter 0: not a misordering."""
    model = torch.nn.Sequential(torch.nn.LayerNorm(4), torch.nn.Linear(4, 2))  # parameter 0 is 1-D, (4,)
    opt = torch.optim.LBFGS(model.parameters())

    def closure():
        opt.zero_grad()
        loss = model(torch.ones(3, 4)).pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    path = save_checkpoint(tmp_path / "lbfgs.pt", model=model, optimizer=opt, step=1)
    fresh = torch.nn.Sequential(torch.nn.LayerNorm(4), torch.nn.Linear(4, 2))
    assert load_checkpoint(path, model=fresh, optimizer=torch.optim.LBFGS(fresh.parameters()))["step"] == 1


def test_a_checkpoint_of_a_newer_torchformer_is_neither_skipped_nor_set_aside(tmp_path):
    """It is intact: skipping it would go back to an older step silently, renaming it would lose it."""
    saved(tmp_path, 1)
    newer = saved(tmp_path, 2)
    payload = torch.load(newer, weights_only=True)
    torch.save({**payload, "format_version": 4}, newer)
    with pytest.raises(CheckpointVersionError, match=r"step_00000002\.pt has format 4, written by a newer"):
        latest_intact_checkpoint(tmp_path, set_aside=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000001.pt", "step_00000002.pt"]


def test_a_checkpoint_the_system_cannot_read_is_not_called_damaged(tmp_path, monkeypatch):
    """A permission or I/O error says nothing about the file: it is raised as it is, and nothing is set aside."""
    import errno

    saved(tmp_path, 1)
    saved(tmp_path, 2)
    real_load = torch.load

    def load(path, *args, **kwargs):
        if "step_00000002" in str(path):
            raise OSError(errno.EIO, "Input/output error")
        return real_load(path, *args, **kwargs)

    monkeypatch.setattr(torch, "load", load)
    with pytest.raises(OSError, match="Input/output error"):
        latest_intact_checkpoint(tmp_path, set_aside=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000001.pt", "step_00000002.pt"]
