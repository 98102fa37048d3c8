"""Run the Python snippets of the docs and paste their real output under them.

Every ```python block that is followed by a ```text block is run in a fresh interpreter, and its printed output
replaces that ```text block; a block with no output block is an illustration (a fragment) and is not run. A page
with the marker ``<!-- snippets continue -->`` runs all its blocks in order in one namespace instead. A snippet that
raises stops the run. Print rounded figures: the last digits of float sums differ with the number of threads.

    python docs/update_snippets.py docs/*.md           # rewrite the outputs
    python docs/update_snippets.py --check docs/*.md   # exit 1 if any page's output differs from a fresh run
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

BLOCK = re.compile(r"```python\n(.*?)```\n(\s*```text\n.*?```\n)?", re.S)
SEPARATOR = "\n@@@SNIPPET-END@@@\n"
# The snippets run in the interpreter's real __main__ module (not a dict of their own), as a script would: tools that
# look names up in the module of the running code, such as torch.compile's guards, then find them.
DRIVER = r"""
import __main__, contextlib, io, json, sys
namespace = __main__.__dict__
for code in json.load(sys.stdin):
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        exec(compile(code, "<snippet>", "exec"), namespace)
    sys.stdout.write(buffer.getvalue() + SEPARATOR)
""".replace("SEPARATOR", repr(SEPARATOR))


def run(codes: list[str]) -> list[str]:
    # The snippets run in a temporary folder, so relative PYTHONPATH entries (e.g. PYTHONPATH=src) must be made
    # absolute first, or they would point nowhere.
    env = dict(os.environ)
    if env.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(str(pathlib.Path(p).resolve()) for p in env["PYTHONPATH"].split(os.pathsep))
    with tempfile.TemporaryDirectory() as cwd:  # snippets that write files write them somewhere harmless
        result = subprocess.run([sys.executable, "-c", DRIVER], input=json.dumps(codes), capture_output=True,
                                text=True, cwd=cwd, env=env, timeout=600)
    if result.returncode:
        raise SystemExit(f"a snippet failed:\n{result.stderr}")
    return result.stdout.split(SEPARATOR)[:-1]


def refresh(text: str, path: pathlib.Path) -> str:
    matches = list(BLOCK.finditer(text))
    if "<!-- snippets continue -->" not in text:
        matches = [m for m in matches if m.group(2) is not None]  # fragments without an output are not run
    codes = [m.group(1) for m in matches]
    if "<!-- snippets continue -->" in text:
        outputs = run(codes)
    else:
        outputs = [run([code])[0] for code in codes]
    pieces, position = [], 0
    for match, code, stdout in zip(matches, codes, outputs):
        pieces.append(text[position : match.start()])
        block = f"```python\n{code}```\n"
        if match.group(2) is not None:
            block += f"\n```text\n{stdout}```\n"
        elif stdout.strip():
            raise SystemExit(f"{path}: a snippet prints but has no ```text block after it:\n{code}")
        pieces.append(block)
        position = match.end()
    pieces.append(text[position:])
    return "".join(pieces)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pages", nargs="+", type=pathlib.Path)
    parser.add_argument("--check", action="store_true", help="report differences instead of rewriting")
    args = parser.parse_args()
    stale = []
    for path in args.pages:
        text = path.read_text()
        fresh = refresh(text, path)
        if args.check and fresh != text:
            stale.append(path)
        elif not args.check and fresh != text:
            path.write_text(fresh)
        print(f"{path}: {'differs' if fresh != text else 'up to date'}")
    if stale:
        raise SystemExit(f"outputs differ from a fresh run in: {', '.join(map(str, stale))}")


if __name__ == "__main__":
    main()
