"""Ablations as one command: a base run of an example script and its variants, each with several seeds.

    python examples/ablate.py examples/ablations/enwik8-cpu.toml --out runs/ablate-enwik8 --threads 2
    python examples/ablate.py examples/ablations/enwik8-cpu.toml --out runs/ablate-enwik8 --jobs 2 --threads 2
    python examples/ablate.py FILE --out DIR --table    # only the table of the runs finished so far

The file names the script, its base flags, the seeds, the metric and the variants (torchformer.scripts.ablation).
Every run goes to DIR/runs/<variant>/seed-<s>; kill this anywhere and start it again with the same command: the
finished runs are kept and the interrupted one resumes from its checkpoint. The table goes to DIR/ablation.md and
DIR/ablation.json, the validation curves to DIR/curves.png. docs/training.md says more.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from torchformer.scripts.ablation import read_ablation, read_records, run_ablation, write_outputs
from torchformer.scripts.cli import POSITIVE_INT, WRITABLE_FOLDER, check_flags


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", help="the ablation: a TOML file (examples/ablations/*.toml)")
    p.add_argument("--out", required=True, help="folder for the runs, the table and the curves")
    p.add_argument("--jobs", type=int, default=1, help="runs at once (default 1)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads in all, split between the jobs "
                   "(default: one per job)")
    p.add_argument("--table", action="store_true", help="run nothing: write the table of the finished runs")
    args = p.parse_args(argv)
    check_flags(p, args, {"jobs": POSITIVE_INT, "threads": POSITIVE_INT, "out": WRITABLE_FOLDER})
    try:
        ablation = read_ablation(args.file)
    except (OSError, ValueError) as e:
        p.error(f"{args.file}: {e}" if str(args.file) not in str(e) else str(e))
    out = Path(args.out)
    try:
        records = (read_records(ablation, out) if args.table else
                   run_ablation(ablation, out, jobs=args.jobs, threads=args.threads))
    except ValueError as e:  # another harness runs one of the runs
        sys.exit(f"ablate.py: error: {e}")
    for path in write_outputs(out, ablation, records):
        print(f"wrote {path}")
    print((out / "ablation.md").read_text())
    missing = len(ablation.variants) * len(ablation.seeds) - len(records)
    if missing:
        print(f"{missing} run(s) not finished: run the same command again")
    return records


if __name__ == "__main__":
    main()
