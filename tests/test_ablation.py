"""The ablation harness (torchformer.scripts.ablation, examples/ablate.py): the table's arithmetic, the file's checks,
and a 2-variant x 2-seed ablation on the bundled enwik8 sample that is killed mid-run and finishes on restart."""

from __future__ import annotations

import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from script_loader import ROOT, load_script
from torchformer.scripts.ablation import (Ablation, Variant, markdown_table, read_ablation, run_ablation,
                                          summarize)

SCRIPT = ROOT / "examples" / "generate_enwik8.py"
TINY = ["-N", "12", "-b", "4", "-C", "32", "-E", "32", "-H", "2", "-d", "1", "--lr-warmup", "2", "--test-every", "3",
        "--test-subset", "500", "--device", "cpu"]


def record(variant, seed, metric, commit="abc", **more):
    return {"variant": variant, "seed": seed, "metric": metric, "commit": commit, "tokens_per_s": 100.0 * seed,
            "parameters": 10, "active_parameters": 8, "minutes": 1.5, "curve": [], **more}


def test_the_table_has_the_seeds_mean_and_spread_and_paired_differences_from_the_base():
    ablation = Ablation(SCRIPT, (), (Variant("base"), Variant("wide", ("-E", "64")), Variant("never run")), (1, 2, 3))
    records = [record("base", 1, 2.0), record("base", 2, 2.2), record("base", 3, 2.1),
               record("wide", 1, 1.9), record("wide", 2, 2.0, commit="def"), record("wide", 3, 2.15)]
    base, wide, never = summarize(ablation, records)
    assert base["mean"] == pytest.approx(2.1) and base["spread"] == pytest.approx(statistics.stdev([2.0, 2.2, 2.1]))
    assert base["difference"] is None and base["other_commit"] == []
    differences = [1.9 - 2.0, 2.0 - 2.2, 2.15 - 2.1]  # paired by seed: the seeds' shared luck cancels
    assert wide["difference"] == pytest.approx(statistics.mean(differences))
    assert wide["difference_spread"] == pytest.approx(statistics.stdev(differences))
    assert wide["tokens_per_s"] == pytest.approx(200.0) and wide["other_commit"] == [2]  # most runs: "abc"
    assert never["runs"] == 0 and never["mean"] is None and never["difference"] is None
    table = markdown_table(ablation, [base, wide, never])
    assert "| wide † | `-E 64` | 3 | 2.0167 ± 0.1258 | -0.0833 ± 0.1258 |" in table
    assert "†: some of the variant's runs were made at another code commit" in table
    one_seed = summarize(Ablation(SCRIPT, (), (Variant("base"),), (1,)), [record("base", 1, 2.0)])[0]
    assert one_seed["spread"] is None and not math.isnan(one_seed["mean"])


def test_seed_in_a_flag_is_the_runs_seed_in_its_command_only(tmp_path):
    """A file made once per seed (a pretrained model) is named with ``{seed}``: each run's script is given its own
    seed there, and the table shows the flag as written."""
    script = tmp_path / "echo.py"  # a script that reports the arguments it was called with as its results
    script.write_text("import json, pathlib, sys\n"
                      "out = pathlib.Path(sys.argv[sys.argv.index('--out') + 1])\n"
                      "out.mkdir(parents=True, exist_ok=True)\n"
                      "(out / 'results.json').write_text(json.dumps({'bpb': 1.0, 'argv': sys.argv[1:]}))\n")
    ablation = Ablation(script, ("--data", "d-{seed}"), (Variant("base"), Variant("pre", ("--pretrained",
                                                                                          "p/seed-{seed}/m.pt"))), (1, 7),
                        curve=None)
    records = run_ablation(ablation, tmp_path / "out", echo=lambda line: None)
    given = {(r["variant"], r["seed"]): r["results"]["argv"] for r in records}
    assert given[("pre", 1)][:4] == ["--data", "d-1", "--pretrained", "p/seed-1/m.pt"]
    assert given[("pre", 7)][:6] == ["--data", "d-7", "--pretrained", "p/seed-7/m.pt", "--seed", "7"]
    assert given[("base", 7)][:4] == ["--data", "d-7", "--seed", "7"]
    assert next(r for r in records if r["variant"] == "pre")["flags"] == ["--pretrained", "p/seed-{seed}/m.pt"]
    assert "`--pretrained p/seed-{seed}/m.pt`" in markdown_table(ablation, summarize(ablation, records))


@pytest.mark.parametrize("text, message", [
    ('script = "s.py"\nbogus = 1', "unknown key"),
    ('script = "nowhere.py"', "is not a file"),
    ('script = "s.py"\nseeds = [1, 1]', "seeds must differ"),
    ('script = "s.py"\nseeds = []', "seeds must be a non-empty list"),
    ('script = "s.py"\nbase = "--preset cpu"', "base must be a list of strings"),
    ('script = "s.py"\n[[variants]]\nname = "p"\nflags = ["m-{Seed}.pt"]', r"holds \{Seed\}; the one placeholder is"),
    ('script = "s.py"\n[[variants]]\nname = "Wide"\n[[variants]]\nname = "wide"', "two variants share the name"),
    ('script = "s.py"\n[[variants]]\nflags = ["-E", "64"]', r"variants\[0\] must be a table with a name"),
    ("script = [", "not a TOML file"),
])
def test_a_bad_file_is_refused_naming_what_is_wrong(tmp_path, text, message):
    (tmp_path / "s.py").write_text("")
    (tmp_path / "a.toml").write_text(text)
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        read_ablation(tmp_path / "a.toml")


@pytest.mark.parametrize("path", sorted((ROOT / "examples" / "ablations").glob("*.toml")), ids=lambda p: p.name)
def test_the_shipped_ablation_files_read_and_name_only_their_scripts_flags(path):
    """Each file of examples/ablations: it reads, and every flag of its base and variants is one its script's
    --help lists (a renamed flag would fail each run hours into an ablation)."""
    ablation = read_ablation(path)
    usage = subprocess.run([sys.executable, str(ablation.script), "--help"], capture_output=True, text=True,
                           check=True).stdout
    options = {word.strip(",[]") for word in usage.split() if word.startswith("-")}
    flags = [f for v in ablation.variants for f in (*ablation.base, *v.flags)
             if f.startswith("--") or f[:1] == "-" and f[1:2].isalpha()]  # not values such as -1
    assert flags and not [f for f in flags if f not in options]


def write_file(folder: Path) -> Path:
    flags = ", ".join(f'"{f}"' for f in TINY)
    path = folder / "tiny.toml"
    path.write_text(f'script = "{SCRIPT}"\nbase = [{flags}]\nseeds = [1, 2]\nmetric = "bpb"\ncurve = "val_bpb"\n'
                    f'[[variants]]\nname = "learned positions"\nflags = ["--positions", "learned"]\n')
    return path


def test_an_ablation_killed_mid_run_finishes_on_restart_with_the_uninterrupted_figures(tmp_path):
    file, out = write_file(tmp_path), tmp_path / "out"
    command = [sys.executable, str(ROOT / "examples" / "ablate.py"), str(file), "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    second = out / "runs" / "base" / "seed-2"
    harness = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (second / "checkpoints" / "step_00000003.pt").is_file():  # the second run is under way
        assert harness.poll() is None and time.time() < deadline, "the harness ended before its second run got going"
        time.sleep(0.02)
    os.kill(harness.pid, signal.SIGKILL)
    harness.wait()
    assert (out / "runs" / "base" / "seed-1" / "record.json").is_file() and not (second / "record.json").is_file()
    time.sleep(1)  # the run dies with its harness (PR_SET_PDEATHSIG): nothing writes into its folder any more
    assert not any(str(second) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").replace("\0", " ")
                   for pid in os.listdir("/proc") if pid.isdigit() and Path(f"/proc/{pid}/cmdline").exists()) \
        if sys.platform.startswith("linux") else True

    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "1 run(s) done, 3 to run" in done.stdout and f"resuming base, seed 2 in {second}" in done.stdout
    table = json.loads((out / "ablation.json").read_text())
    assert [(row["variant"], row["runs"]) for row in table["rows"]] == [("base", 2), ("learned positions", 2)]
    assert (out / "ablation.md").read_text().startswith("| variant | flags | seeds | bpb (mean ± sd) |")

    # The interrupted run's figure is the one an uninterrupted run of the same command gets, to the last bit.
    alone = load_script(SCRIPT).main([*TINY, "--seed", "2", "--out", str(tmp_path / "alone"), "--threads", "1"])
    resumed = json.loads((second / "record.json").read_text())
    assert resumed["metric"] == alone["bpb"] and resumed["command"][-6:] == ["--seed", "2", "--out", str(second),
                                                                              "--checkpoint", str(second / "checkpoints")]
    assert resumed["parameters"] > 0 and resumed["commit"] and resumed["torch"] and resumed["curve"]
    assert resumed["machine"]["processor"] and resumed["machine"]["cpus"] == os.cpu_count()
    base = table["rows"][0]
    assert base["mean"] == pytest.approx(statistics.mean(json.loads((out / "runs" / "base" / f"seed-{s}" /
                                                                     "record.json").read_text())["metric"]
                                                          for s in (1, 2)))
