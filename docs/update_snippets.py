"""Run the Python snippets of the docs and paste their real output under them.

Every ```python block that is followed by a ```text block is run in a fresh interpreter, and its printed output
replaces that ```text block; a block with no output block is an illustration (a fragment) and is not run. A page
with the marker ``<!-- snippets continue -->`` runs all its blocks in order in one namespace instead. A snippet that
raises stops the run. Print rounded figures: the last digits of float sums differ with the number of threads.

    python docs/update_snippets.py docs/*.md           # rewrite the outputs
    python docs/update_snippets.py --check docs/*.md   # exit 1 if a fresh run disagrees with a page's output

The outputs were recorded on one machine, and another CPU (AVX2 instead of AVX-512, ARM, another number of cores)
rounds float sums differently, so a fresh run is compared with a page's output with a tolerance, never exactly
(``disagreements``). The text between the numbers must match (runs of spaces aside), and so must every integer;
a decimal may differ by one unit of its last printed digit (a value near a rounding boundary lands on either side).
Where more depends on the machine, a comment right after the output block says what, and the page says it in words:

    <!-- varies by CPU: decimals 2%, points 1, round-off, sample -->

- ``decimals 2%``: every decimal within 2 % of the recorded one (losses after some training steps);
- ``points 1``: every number followed by ``%`` within 1 (an accuracy in percent);
- ``round-off``: every number in e-notation at most ten times the recorded one, or below 1e-6 (the difference of
  two float32 computations that agree up to rounding);
- ``quotes``: the text inside printed string literals (``b'...'``, ``'...'``) is not compared, only that there is
  one (generated text: a tiny change of a probability changes a draw, or a greedy choice between two close ones,
  and every token after it);
- ``sample``: the block is not compared at all, only that it printed something (a block that prints a sample).
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

# A python block, its output block if it has one, and the comment saying what of that output varies by CPU.
BLOCK = re.compile(r"```python\n(.*?)```\n(?:\s*```text\n(.*?)```\n(?:<!-- varies by CPU: (.*?) -->\n)?)?", re.S)
RULE = re.compile(r"decimals (\d+(?:\.\d+)?)%|points (\d+(?:\.\d+)?)|round-off|quotes|sample")
# A Python string literal as repr prints it, b'...' or "..." (a string holding a ' is printed in double quotes).
QUOTED = re.compile(r"b?'(?:[^'\\\n]|\\.)*'" + r'|b?"(?:[^"\\\n]|\\.)*"')
# A number not glued to a word or to another number: "step_300", "v2" and "2.13.0" are text, "[0.5," holds 0.5 and
# "3.68." ends a sentence with 3.68. An optional sign and exponent belong to it.
NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:e[-+]?\d+)?(?!\w|\.\d)", re.I)
ROUND_OFF_FLOOR = 1e-6
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


def snippets(text: str) -> list[re.Match]:
    """The blocks of a page that run: those with an output block, or all of them on a page that continues."""
    matches = list(BLOCK.finditer(text))
    if "<!-- snippets continue -->" not in text:
        matches = [m for m in matches if m.group(2) is not None]  # fragments without an output are not run
    return matches


def fresh_outputs(text: str) -> list[str]:
    """What each snippet of the page prints today (one interpreter for a page that continues, else one each)."""
    codes = [m.group(1) for m in snippets(text)]
    if "<!-- snippets continue -->" in text:
        return run(codes)
    return [run([code])[0] for code in codes]


def refresh(text: str, path: pathlib.Path, outputs: list[str] | None = None) -> str:
    """The page with every output block replaced by ``outputs`` (by default, a fresh run's)."""
    matches = snippets(text)
    outputs = fresh_outputs(text) if outputs is None else outputs
    pieces, position = [], 0
    for match, stdout in zip(matches, outputs):
        pieces.append(text[position : match.start()])
        block = f"```python\n{match.group(1)}```\n"
        if match.group(2) is not None:
            block += f"\n```text\n{stdout}```\n"
            if match.group(3) is not None:
                block += f"<!-- varies by CPU: {match.group(3)} -->\n"
        elif stdout.strip():
            raise SystemExit(f"{path}: a snippet prints but has no ```text block after it:\n{match.group(1)}")
        pieces.append(block)
        position = match.end()
    pieces.append(text[position:])
    return "".join(pieces)


def parse_rules(rules: str | None) -> dict:
    """``"decimals 2%, sample"`` -> ``{"decimals": 0.02, "points": 0.0, "round-off": False, "sample": True}``."""
    parsed = {"decimals": 0.0, "points": 0.0, "round-off": False, "quotes": False, "sample": False}
    for rule in filter(None, (r.strip() for r in (rules or "").split(","))):
        match = RULE.fullmatch(rule)
        if match is None:
            raise ValueError(f"unknown rule {rule!r} in 'varies by CPU' (known: decimals N%, points N, round-off, "
                             f"quotes, sample)")
        if match.group(1):
            parsed["decimals"] = float(match.group(1)) / 100
        elif match.group(2):
            parsed["points"] = float(match.group(2))
        else:
            parsed[rule] = True
    return parsed


def last_digit(number: str) -> float:
    """One unit of the last printed digit: 0.01 for "3.72", 1e-08 for "1.2e-07"; 0 for a number with no digit after
    its point ("95", "1.", "2e-04"), whose last digit is the whole value: such a number is compared exactly."""
    mantissa, _, exponent = number.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 10.0 ** (int(exponent or 0) - decimals) if decimals else 0.0


def numbers_agree(recorded: str, fresh: str, rules: dict, percent: bool) -> bool:
    """Whether one printed number of a fresh run holds the recorded one, by the rules of its block."""
    a, b = float(recorded), float(fresh)
    if percent and rules["points"]:
        return abs(a - b) <= rules["points"] + 1e-9
    if rules["round-off"] and "e" in recorded.lower():
        return abs(b) <= max(10 * abs(a), ROUND_OFF_FLOOR)
    if not any(c in recorded.lower() for c in ".e"):
        return recorded.lstrip("+") == fresh.lstrip("+")  # an integer: a count, a size, a step, an id
    slack = max(last_digit(recorded), rules["decimals"] * abs(a))  # the recorded number's: "3.72" is not "4"
    return abs(a - b) <= slack * (1 + 1e-9)


def spaced(text: str) -> str:
    """``text`` with each run of spaces and tabs as one space: a number of another width moves the columns. Line
    breaks stay: they are the output's structure."""
    return re.sub(r"[ \t]+", " ", text).strip(" ")


def disagreement(recorded: str, fresh: str, rules: str | None) -> str | None:
    """Where a fresh run's output fails to hold a recorded one (None if it holds). The text between the numbers
    must be the same (runs of spaces aside: a number of another width moves the columns); each number must agree by
    the rules of its block (the module docstring lists them)."""
    parsed = parse_rules(rules)
    if parsed["sample"]:
        return None if fresh.strip() else "printed nothing"
    if parsed["quotes"]:
        recorded, fresh = QUOTED.sub("'...'", recorded), QUOTED.sub("'...'", fresh)
    split_recorded, split_fresh = NUMBER.split(recorded), NUMBER.split(fresh)
    numbers_recorded, numbers_fresh = NUMBER.findall(recorded), NUMBER.findall(fresh)
    same_text = [spaced(t) for t in split_recorded] == [spaced(t) for t in split_fresh]
    if not same_text:
        return f"the text differs:\n--- recorded\n{recorded}--- fresh\n{fresh}"
    for number, new, after in zip(numbers_recorded, numbers_fresh, split_recorded[1:]):
        if not numbers_agree(number, new, parsed, percent=after.lstrip().startswith("%")):
            return f"{new} where the page has {number} (rules: {rules or 'none'})"
    return None


def disagreements(text: str, outputs: list[str]) -> list[str]:
    """Every output block of a page that ``outputs`` (a fresh run's) fails to hold, named by its first line."""
    problems = []
    for match, fresh in zip(snippets(text), outputs):
        if match.group(2) is not None:
            problem = disagreement(match.group(2), fresh, match.group(3))
            if problem:
                first = match.group(2).partition("\n")[0]
                problems.append(f"output starting {first!r}: {problem}")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pages", nargs="+", type=pathlib.Path)
    parser.add_argument("--check", action="store_true", help="report differences instead of rewriting")
    args = parser.parse_args()
    stale = []
    for path in args.pages:
        text = path.read_text()
        outputs = fresh_outputs(text)
        fresh = refresh(text, path, outputs)
        if args.check:
            problems = disagreements(text, outputs)
            stale += [f"{path}: {problem}" for problem in problems]
            within = " (some digits differ, within the rules)" if fresh != text and not problems else ""
            print(f"{path}: {'disagrees' if problems else 'holds'}{within}")
            continue
        if fresh != text:
            path.write_text(fresh)
        print(f"{path}: {'rewritten' if fresh != text else 'up to date'}")
    if stale:
        raise SystemExit("a fresh run disagrees with the outputs of the pages:\n" + "\n".join(stale))


if __name__ == "__main__":
    main()
