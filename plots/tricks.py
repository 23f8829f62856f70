"""List the speed tricks of every twin from its `# trick:` comments and splice the list into the README.

    python plots/tricks.py           # rewrite the README's tricks section
    python plots/tricks.py --check   # exit 1 if the README's section is out of date

The twin rule makes every difference between `<algo>.py` and `<algo>_torchcompile.py` a speed trick
with a `# trick: ...` comment (and every difference between a twin and its `_distributed.py` a step of
scaling out), so the comments are the list: this keeps the README from going stale.
"""

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plot import splice  # noqa: E402  (plots/ is a folder of tools, not a package)

ROOT = Path(__file__).resolve().parents[1]
TRICK = re.compile(r"(?<!`)#\s*trick:\s*(.+)$")  # not a `# trick:` quoted in a docstring


def find_tricks(script):
    """[(line number, text)] of the `# trick:` comments of a script, continuation lines joined."""
    tricks = []
    lines = script.read_text().splitlines()
    for number, line in enumerate(lines, start=1):
        match = TRICK.search(line)
        if not match:
            continue
        text = match.group(1).strip()
        # a trick comment on a line of its own may go on over the following comment lines at its indentation;
        # one after code ends with its line
        indent = line[: len(line) - len(line.lstrip())]
        for follow in lines[number:] if line.lstrip().startswith("#") else []:
            if not follow.startswith(indent + "#") or TRICK.search(follow):
                break
            text += " " + follow.strip().lstrip("#").strip()
        tricks.append((number, text))
    return tricks


def tricks_markdown(root=ROOT):
    out = []
    scripts = sorted([*(root / "leanrl").glob("*_torchcompile.py"), *(root / "leanrl").glob("*_distributed.py")])
    for twin in scripts:
        # a twin is diffed against its eager script, a distributed script against the twin it scales out
        base = twin.name.replace("_torchcompile", "").replace("_distributed", "_torchcompile")
        out.append(f"**`{twin.name}`** (diff it against `{base}`):\n")
        out.append("| line | trick |")
        out.append("|---|---|")
        for number, text in find_tricks(twin):
            out.append(f"| [{number}](leanrl/{twin.name}#L{number}) | {text.replace('|', '/')} |")
        out.append("")
    return "\n".join(out).strip() + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", default=str(ROOT / "README.md"))
    parser.add_argument("--check", action="store_true", help="only check that the README is up to date")
    args = parser.parse_args(argv)
    readme = Path(args.readme)
    text = readme.read_text()
    new = splice(text, "tricks", tricks_markdown())
    if args.check:
        if new != text:
            print("plots/tricks.py: README tricks section is out of date: run python plots/tricks.py", file=sys.stderr)
            return 1
        return 0
    readme.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
