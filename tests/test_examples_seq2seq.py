"""examples/seq2seq.py: bad flags are usage errors before training; a tiny run goes end to end."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from script_loader import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "seq2seq.py"


@pytest.fixture(scope="module")
def script():
    return load_script(SCRIPT, "seq2seq_example")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--steps", "0"], "--steps must be a positive int, got 0"),  # was a ZeroDivisionError in the schedule
        (["--steps", "-5"], "--steps must be a positive int, got -5"),  # trained nothing, silently
        (["--beam-size", "0"], "--beam-size must be a positive int (1: greedy), got 0"),  # failed after training
        (["--beam-size", "-1"], "--beam-size must be a positive int (1: greedy), got -1"),
        (["--out", "{file}"], "--out must be a folder"),  # failed after training and evaluation
        (["--out", "{file}/sub"], "--out must be a folder"),
        (["--device", "gpu"], "--device: device must be 'auto', 'cpu', 'cuda'"),
        (["--device", "cuda:99"], "--device: device 'cuda:99' was requested but"),
        (["--threads", "0"], "--threads must be a positive int, got 0"),
        (["--threads", "-1"], "--threads must be a positive int, got -1"),
        (["--seed", str(2**70)], "--seed must be an int in [0, 2**32)"),
        (["--seed", "-1"], "--seed must be an int in [0, 2**32), got -1"),
        (["--preset", "tpu"], "--preset"),
        (["--decode", "12a"], "--decode takes a string of digits 0-9, got '12a'"),
        (["--decode", ""], "--decode takes a string of digits 0-9, got ''"),
    ],
)
def test_bad_flags_are_usage_errors_naming_the_flag(script, argv, message, tmp_path, capsys):
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(SystemExit) as info:
        script.main([a.replace("{file}", str(tmp_path / "a_file")) for a in argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_every_flag_has_help(script, capsys):
    with pytest.raises(SystemExit):
        script.parse_args(["--help"])
    options = capsys.readouterr().out.split("options:")[1].split("\npresets:")[0]  # the flags, not the epilog
    entries = re.split(r"\n  (?=-)", options.strip())  # "--seed SEED   seed for ...", one per flag
    assert len(entries) == 9  # -h and the eight flags
    for entry in entries:
        invocation, *text = re.split(r"\s{2,}", entry, maxsplit=1)
        assert text, f"{invocation} has no help text"
    assert "(--preset cpu: 1500; --preset gpu: 6000)" in " ".join(options.split())  # --steps: what presets set


def test_tiny_run_decodes_and_plots(script, tmp_path):
    result = script.main(["--steps", "2", "--beam-size", "2", "--threads", "1", "--device", "cpu",
                          "--out", str(tmp_path)])
    assert set(result) == {"greedy", "beam"} and all(0 <= v <= 1 for v in result.values())
    pytest.importorskip("matplotlib")
    assert (tmp_path / "cross_attention.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_trained_model_is_saved_and_decode_reverses_strings_with_it(script, tmp_path, capsys):
    """--decode rebuilds the model from --out/model.pt alone and prints what seq2seq_generate gives."""
    import torch

    from torchformer import load_model, seq2seq_generate

    script.main(["--steps", "3", "--threads", "1", "--device", "cpu", "--out", str(tmp_path)])
    assert ", 1 CPU thread(s) (--threads)" in capsys.readouterr().out
    lines = script.main(["--decode", "4740", "--decode", "123", "--beam-size", "2", "--out", str(tmp_path),
                         "--threads", "1"])
    assert capsys.readouterr().out.splitlines() == lines
    model = load_model(tmp_path / "model.pt")
    for digits, line in zip(["4740", "123"], lines):
        src = torch.tensor([[script.DIGIT0 + int(d) for d in digits]])
        greedy = script.as_text(seq2seq_generate(model, src, len(digits) + 1, bos=script.BOS, eos=script.EOS)[0])
        beam = seq2seq_generate(model, src, len(digits) + 1, bos=script.BOS, eos=script.EOS, beam_size=2)
        beam = script.as_text(beam[0])
        assert line == f"{digits} -> {greedy} (greedy), {beam} (beam 2)"
    with pytest.raises(SystemExit, match="trained on strings of 3 to 10 digits, got 11"):
        script.main(["--decode", "1" * 11, "--out", str(tmp_path), "--threads", "1"])
    with pytest.raises(SystemExit, match="trained on strings of 3 to 10 digits, got 2"):  # shorter: never learned
        script.main(["--decode", "12", "--out", str(tmp_path), "--threads", "1"])
    assert script.main(["--decode", "123", "--beam-size", "1", "--out", str(tmp_path), "--threads", "1"])[0].endswith(
        "(greedy)")  # beam 1 is greedy: said once
    with pytest.raises(SystemExit, match="no trained model at .*model.pt: train first"):
        script.main(["--decode", "12", "--out", str(tmp_path / "none"), "--threads", "1"])


def test_the_default_output_folder_is_under_runs(script):
    assert script.parse_args([]).out == Path("runs/seq2seq")  # never the current folder (the repository root)
