"""torchformer.scripts.cli: the flag checks the example scripts share."""

from __future__ import annotations

import argparse
import os

import pytest
import torch

from torchformer.scripts.cli import (
    POSITIVE, POSITIVE_INT, WRITABLE_FOLDER, available_memory, busy_cores, check_flags, check_model_fits,
    check_outputs, choose_threads, files_in_the_way, remove_interrupted_saves,
    preset_flags, utf8_text, writable_folder,
)


def test_writable_folder(tmp_path):
    (tmp_path / "a_file").write_text("x")
    assert writable_folder(tmp_path) and writable_folder(tmp_path / "new" / "deeper")  # exists, or can be made
    assert not writable_folder(tmp_path / "a_file")  # a file is no folder
    assert not writable_folder(tmp_path / "a_file" / "below")  # nor can one be made under a file
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    assert not writable_folder(tmp_path / "dangling")


def test_files_in_the_way_are_the_outputs_taken_by_something_else(tmp_path):
    (tmp_path / "log.csv").write_text("step\n")  # a file: overwritten or appended to, not in the way
    (tmp_path / "model.pt").mkdir()
    (tmp_path / "results.json").mkdir()
    names = ["log.csv", "results.json", "new.png", "model.pt"]
    assert files_in_the_way(tmp_path, names) == [tmp_path / "results.json", tmp_path / "model.pt"]
    assert files_in_the_way(str(tmp_path / "not_yet"), names) == []  # a folder still to be made holds nothing


def test_check_outputs_is_a_usage_error_naming_the_path(tmp_path, capsys):
    (tmp_path / "model.pt").mkdir()
    parser = argparse.ArgumentParser(prog="train.py")
    check_outputs(parser, tmp_path, ["log.csv"])  # nothing in the way
    with pytest.raises(SystemExit) as info:
        check_outputs(parser, tmp_path, ["log.csv", "model.pt"])
    assert info.value.code == 2
    assert f"--out {tmp_path}: {tmp_path / 'model.pt'} is not a file (a folder?)" in capsys.readouterr().err


def test_remove_interrupted_saves_names_each_file_it_removes(tmp_path, capsys):
    import subprocess
    import sys

    from torchformer._files import host_tag

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # reaped: its pid names no process
    left = tmp_path / f".model.pt.tmp-{host_tag()}-{dead.pid}-00"
    left.write_bytes(b"half")
    live = tmp_path / f".step_00000002.pt.tmp-{host_tag()}-{os.getpid()}-00"  # a save in progress: kept
    live.write_bytes(b"half")
    remove_interrupted_saves(tmp_path, None, tmp_path / "missing")
    assert not left.exists() and live.exists()
    assert capsys.readouterr().out == f"removed {left.name}, left by a save that was interrupted\n"


def test_utf8_text_names_a_byte_of_the_command_line_that_is_not_utf8():
    assert utf8_text("caf\u00e9 \u2014 fine") == "caf\u00e9 \u2014 fine"
    # Python passes the byte 0xff of argv as the lone surrogate \udcff (surrogateescape).
    with pytest.raises(argparse.ArgumentTypeError, match=r"not valid UTF-8 text: the byte 0xff at character 6 of"):
        utf8_text("great \udcff")
    with pytest.raises(argparse.ArgumentTypeError, match=r"not valid UTF-8 text: '\\ud800' at character 0"):
        utf8_text("\ud800")


def test_check_model_fits_counts_on_the_meta_device(monkeypatch):
    import torchformer.scripts.cli as cli

    built = []

    def build():
        built.append(torch.get_default_device() if hasattr(torch, "get_default_device") else None)
        return torch.nn.Linear(1000, 1000)  # 1,001,000 float32 parameters: 4.0 MB, 16.0 MB for training

    monkeypatch.setattr(cli, "available_memory", lambda device: 16_000_000)
    with pytest.raises(MemoryError, match=r"the model has 1,001,000 parameters \(0\.0 GiB\); training needs at least "
                                          r"4 times that"):
        check_model_fits(build, "cpu")
    monkeypatch.setattr(cli, "available_memory", lambda device: 17_000_000)
    check_model_fits(build, "cpu")
    monkeypatch.setattr(cli, "available_memory", lambda device: None)  # unknown: no check
    check_model_fits(build, "cpu")
    if built[0] is not None:
        assert built[0] == torch.device("meta")  # built without memory
    assert available_memory("meta") is None and available_memory("cpu") > 0


def test_check_flags_names_the_first_bad_flag(capsys, tmp_path):
    parser = argparse.ArgumentParser()
    checks = {"batch_size": POSITIVE_INT, "learn_rate": POSITIVE, "out": WRITABLE_FOLDER}
    good = argparse.Namespace(batch_size=4, learn_rate=1e-3, out=tmp_path)
    check_flags(parser, good, checks)
    check_flags(parser, argparse.Namespace(batch_size=None, learn_rate=None, out=None), checks)  # not given
    for bad, message in [({"batch_size": 0}, "--batch-size must be a positive int, got 0"),
                         ({"learn_rate": float("inf")}, "--learn-rate must be a positive number, got inf"),
                         ({"out": tmp_path / "f" / "x"}, "--out must be a folder this user can write in")]:
        (tmp_path / "f").write_text("x")
        with pytest.raises(SystemExit) as info:
            check_flags(parser, argparse.Namespace(**{**vars(good), **bad}), checks)
        assert info.value.code == 2 and message in capsys.readouterr().err


def test_preset_flags_appends_each_flags_default_or_what_each_preset_sets():
    parser = argparse.ArgumentParser()
    add = preset_flags(parser, {"cpu": {"steps": 2000, "lr": 0.005}, "gpu": {"lr": 0.001}})
    add("--steps", type=int, help="training steps")
    add("--lr", type=float, help="learning rate")
    add("--clip", type=float, default=1.0, help="gradient norm")
    add("--name", help="a label")
    add("--hidden", type=int, default=3, help=argparse.SUPPRESS)
    add("--fast", action="store_true", help="go fast")
    add("--share", type=float, default=0.5, help="a share")
    add("--seed", type=int, default=0, help="a seed")
    helps = {a.dest: a.help for a in parser._actions}
    assert helps["steps"] == "training steps (--preset cpu: 2000; --preset gpu: not set)"
    assert helps["lr"] == "learning rate (--preset cpu: 0.005; --preset gpu: 0.001)"
    assert helps["clip"] == "gradient norm (default: 1.0)"
    assert helps["name"] == "a label" and helps["fast"] == "go fast"  # no default worth saying
    assert helps["hidden"] == argparse.SUPPRESS
    assert "(default: 0.5)" in parser.format_help()  # the text survives argparse's %-formatting
    assert helps["seed"] == "a seed (default: 0)"  # 0 is a default worth saying (though 0 == False)


def test_choose_threads_leaves_the_busy_cores_to_other_programs(monkeypatch):
    import torchformer.scripts.cli as cli

    assert choose_threads(1) == (1, "--threads")
    usable = len(os.sched_getaffinity(0))
    assert "more than the" in choose_threads(usable + 1)[1]  # oversubscribed: said so
    cores = max(1, min(len(os.sched_getaffinity(0)), torch.get_num_threads()))
    monkeypatch.setattr(cli, "busy_cores", lambda **_: 0.1)
    assert choose_threads()[0] == cores
    monkeypatch.setattr(cli, "busy_cores", lambda **_: 0.9 * cores)  # every core busy elsewhere: still one thread
    threads, why = choose_threads()
    assert threads == 1 and (cores == 1 or "busy with other programs" in why)
    monkeypatch.setattr(cli, "busy_cores", lambda **_: None)  # no /proc/stat: torch's own choice
    assert choose_threads()[0] == cores


def test_busy_cores_sees_a_process_that_keeps_a_core_busy():
    """/proc/stat read twice: a child process spinning on one core shows as about one busy core."""
    import subprocess
    import sys

    if not os.path.exists("/proc/stat"):
        pytest.skip("no /proc/stat (not Linux)")
    idle = busy_cores(0.3)
    assert idle is not None and 0 <= idle <= os.cpu_count()
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        import time

        time.sleep(0.3)  # let it start
        assert busy_cores(0.5) >= 0.6
    finally:
        spinner.kill()
        spinner.wait()


def test_busy_cores_counts_only_the_cores_asked_about(monkeypatch):
    """Core 1 fully busy and core 0 idle over the interval: 1 busy core in all, none among {0}, one among {1}."""
    import torchformer.scripts.cli as cli

    # ticks per core: user nice system idle iowait; between the two reads core 0 idles 100 ticks, core 1 works 100.
    reads = iter([{0: [0, 0, 0, 0, 0], 1: [0, 0, 0, 0, 0]}, {0: [0, 0, 0, 100, 0], 1: [80, 0, 20, 0, 0]}] * 3)
    monkeypatch.setattr(cli, "_cpu_times", lambda: next(reads))
    assert busy_cores(0) == pytest.approx(1.0)
    assert busy_cores(0, cpus=[0]) == pytest.approx(0.0)
    assert busy_cores(0, cpus=[1]) == pytest.approx(1.0)
    monkeypatch.setattr(cli, "_cpu_times", lambda: {})  # no per-core lines: unknown, not zero
    assert busy_cores(0) is None


def test_preset_epilog_writes_each_preset_as_flags_without_splitting_one():
    from torchformer.scripts.cli import as_flag, preset_epilog

    assert as_flag("num_batches", 2000) == "--num-batches 2000"
    assert as_flag("kqnorm", True) == "--kqnorm" and as_flag("kqnorm", False) == "--no-kqnorm"
    presets = {"cpu": {f"option_number_{i}": i * 1000 for i in range(12)}, "gpu": {"minutes": 10.0, "wide": True}}
    text = preset_epilog(presets, width=60)
    lines = text.splitlines()
    assert lines[0].startswith("presets") and all(len(line) <= 60 for line in lines[1:])
    typed = " ".join(lines[1:]).split()
    for i in range(12):  # every flag is followed by its own value, wherever the lines break
        assert typed[typed.index(f"--option-number-{i}") + 1] == str(i * 1000)
    assert lines[-1] == "  --preset gpu means --minutes 10.0 --wide"


def test_flags_saved_before_0_5_with_rotary_read_as_the_interleaved_layout_of_the_model(tmp_path):
    """A script's own "positions" flag follows the model's record, which reads an old "rotary" as interleaved."""
    from torchformer import GTransformer
    from torchformer.scripts.cli import flags_as_saved
    from torchformer.train.checkpoint import _digest, read_checkpoint, save_checkpoint

    flags = {"positions": "rotary", "depth": 1}
    path = save_checkpoint(tmp_path / "new.pt", model=GTransformer(16, 2, 1, 8, 11, positions="rotary"), step=1,
                           extra={"config": flags})
    assert flags_as_saved(read_checkpoint(path), flags) == flags  # written today: "rotary" is "rotary"
    old = {k: v for k, v in torch.load(path, weights_only=True).items() if k not in ("integrity", "config_version")}
    old["format_version"] = 2  # as torchformer 0.4 wrote it, its "rotary" the adjacent pairs
    torch.save({**old, "integrity": {"sha256": _digest(old)}}, tmp_path / "old.pt")
    assert flags_as_saved(read_checkpoint(tmp_path / "old.pt"), flags) == {"positions": "rotary_interleaved",
                                                                         "depth": 1}
    assert flags_as_saved({"config": None}, flags) == flags and flags_as_saved(read_checkpoint(path), {}) == {}
