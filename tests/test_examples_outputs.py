"""The training scripts check where they will write before they train, and report file-system trouble as errors
that name the path (no tracebacks): an output name taken by a folder, the log.csv of another script's run, a cache
folder (TORCHFORMER_HOME) that is a file."""

from __future__ import annotations

from pathlib import Path

import pytest
from script_loader import load_script
from test_examples_enwik8 import corpus, tiny as enwik8_flags  # noqa: F401 - the fixture and its flags
from test_examples_pretrain_imdb import data_dir, tiny as pretrain_flags  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ("generate_enwik8", "classify_imdb", "pretrain_imdb")


def flags(name: str, corpus, data_dir, out) -> list[str]:
    if name == "generate_enwik8":
        return enwik8_flags(corpus, out)
    return pretrain_flags(data_dir, out)  # classify_imdb.py takes the same flags


@pytest.mark.parametrize("name", SCRIPTS)
def test_an_output_taken_by_a_folder_is_a_usage_error_before_training(name, corpus, data_dir, tmp_path, capsys):
    script = load_script(ROOT / "examples" / f"{name}.py")
    out = tmp_path / "out"
    (out / "results.json").mkdir(parents=True)  # written at the very end of a run
    with pytest.raises(SystemExit) as info:
        script.main(flags(name, corpus, data_dir, out))
    assert info.value.code == 2  # parse_args' usage error: no data read, no step trained
    assert f"{out / 'results.json'} is not a file (a folder?), and this run writes a file there" in \
        capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["results.json"]


@pytest.mark.parametrize("name", ("classify_imdb", "pretrain_imdb"))
def test_the_log_of_another_run_in_out_is_an_error_naming_it(name, data_dir, tmp_path):
    script = load_script(ROOT / "examples" / f"{name}.py")
    out = tmp_path / "out"
    out.mkdir()
    (out / "log.csv").write_text("step,loss,train_bpb,lr\n1,5.5,7.9,0.001\n")  # generate_enwik8.py's columns
    with pytest.raises(SystemExit, match=rf"{name}\.py: error: .*log\.csv already has columns \['step', 'loss'"):
        script.main(pretrain_flags(data_dir, out))
    assert (out / "log.csv").read_text() == "step,loss,train_bpb,lr\n1,5.5,7.9,0.001\n"  # left as it was


@pytest.mark.parametrize("name", ("generate_enwik8", "classify_imdb"))
def test_a_cache_folder_that_is_a_file_is_an_error_naming_it(name, tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.write_text("not a folder")
    monkeypatch.setenv("TORCHFORMER_HOME", str(home))
    script = load_script(ROOT / "examples" / f"{name}.py")
    with pytest.raises(SystemExit, match=rf"error: root {home} is a file, not a folder"):
        script.main(["--out", str(tmp_path / "out"), "--device", "cpu", "--threads", "1", "-N" if
                     name == "generate_enwik8" else "-e", "1"])


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_full_disk_while_saving_is_an_error_naming_the_file(name, corpus, data_dir, tmp_path, monkeypatch):
    import errno

    import torch

    script = load_script(ROOT / "examples" / f"{name}.py")

    def full_disk(obj, f):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    ckpt = tmp_path / "ckpt"
    with pytest.raises(SystemExit, match=rf"error: \[Errno 28\] No space left on device; cannot write the file, which "
                                         rf"is as it was: '{ckpt}/step_\d+\.pt'\. The checkpoints written before "
                                         rf"are kept\."):
        script.main([*flags(name, corpus, data_dir, tmp_path / "out"), "--checkpoint", str(ckpt)])


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_temporary_of_a_killed_final_save_in_out_is_removed(name, corpus, data_dir, tmp_path, capsys):
    import subprocess
    import sys

    from torchformer._files import host_tag

    script = load_script(ROOT / "examples" / f"{name}.py")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # reaped: its pid names no process
    out = tmp_path / "out"
    out.mkdir()
    left = out / f".model.pt.tmp-{host_tag()}-{dead.pid}-0badcafe"  # a save of the final model, killed
    left.write_bytes(b"half a model")
    script.main(flags(name, corpus, data_dir, out))
    assert not left.exists() and f"removed {left.name}" in capsys.readouterr().out


@pytest.mark.parametrize("name, size", [("generate_enwik8", ["-E", str(2**17)]), ("classify_imdb", ["-M", str(10**9)]),
                                        ("pretrain_imdb", ["-E", str(2**17)])])
def test_a_model_too_large_for_memory_is_an_error_not_an_oom_kill(name, size, corpus, data_dir, tmp_path,
                                                                  monkeypatch):
    """Learned positions for 10**9 tokens (32 * 10**9 weights), or -E 131072: the script stopped only when the
    operating system killed it. The model is now sized on the meta device first (8 GiB free, say)."""
    import torchformer.scripts.cli as cli

    monkeypatch.setattr(cli, "available_memory", lambda device: 8 * 2**30)
    script = load_script(ROOT / "examples" / f"{name}.py")
    with pytest.raises(SystemExit, match=r"cannot build the model from these flags: the model has [\d,]+ parameters "
                                         r"\([\d.]+ GiB\); training needs at least 4 times that .* but cpu has 8\.0 "
                                         r"GiB free: choose smaller sizes"):
        script.main([*flags(name, corpus, data_dir, tmp_path / "out"), *size])
