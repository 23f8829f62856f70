"""Collect the speed tricks of every twin from its `# trick:` comments: docs/tricks.md and the README's catalogue.

    python plots/tricks.py           # rewrite docs/tricks.md and the README's catalogue
    python plots/tricks.py --check   # exit 1 if either is out of date, or a hunk of a diff has no trick comment

The twin rule makes every difference between `<algo>.py` and `<algo>_torchcompile.py` a speed trick
with a `# trick: ...` comment (and every difference between a twin and a third file of its family, its
`_distributed.py` or pqn_device_env.py, one more step), so the comments are the list: docs/tricks.md gives
each distinct comment once, with every line that carries it. The README's catalogue has one row per kind of
trick (CATALOGUE below) and marks the scripts whose diff uses it: the lines a twin adds to its eager file (a
third file: to its twin) are searched for the row's pattern, so the marks follow the code. --check also holds
every hunk of those diffs to the rule (unexplained_hunks): a `# trick:` comment, or a pointer to one such as
`# (trick: CUDA graphs)`, explains it.
"""

import argparse
import difflib
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plot import splice  # noqa: E402  (plots/ is a folder of tools, not a package)

ROOT = Path(__file__).resolve().parents[1]
TRICK = re.compile(r"(?<!`)#\s*trick:\s*(.+)$")  # not a `# trick:` quoted in a docstring

# (trick, what it buys, pattern searched in the lines a script's diff adds: code or its comments)
CATALOGUE = [
    ("`torch.compile`", "fuses each step's and update's small ops (`--compile`)",
     r"torch\.compile\("),
    ("CUDA graphs", "`CudaGraphModule`: recorded once, one launch a call (`--cudagraphs`)",
     r"CudaGraphModule"),
    ("functions of tensors", "modules and storage bound with `partial`",
     r"\bpartial\("),
    ("device-side counters", "step or write position on the device: no sync",
     r"index_copy_|write (position|index)|step is (a device|an index) tensor"),
    ("random draws on the device", "drawn on the device, merged by `torch.where`",
     r"torch\.where\(|torch\.rand(int)?\("),
    ("fused, capturable Adam", "one kernel, the step count on the device: no sync",
     r"fused=|capturable="),
    ("one-graph update", "gradients and optimizer step traced into one graph",
     r"trace_autograd_ops|torch\.autograd\.grad\("),
    ("one compiled LSTM step", "`nested_compile_region`: compiled once, not unrolled",
     r"nested_compile_region"),
    ("`vmap` over Q-networks", "stacked Q-network parameters: batched matmuls", r"\bvmap\("),
    # (Adam's first moment is a lerp too, of adam["exp_avg"]: not a target update)
    ("fused target update", "one in-place `torch._foreach_lerp_`", r"_foreach_lerp_\((?!adam\[)|\.lerp_\("),
    ("GAE by recursive doubling", "the reverse recurrence in log2(T) whole-tensor steps", r"doubling"),
    ("minibatch gathered in the update", "the batch bound, indices the only input",
     r"inside the compiled"),
    ("`zero_grad` by hand", "grads set to None: `zero_grad` breaks the graph", r"\.grad = None"),
    ("no host reads in the hot loop", "losses stay on the device until a log point",
     r"no \.item\(\)|come to the host|stay on the device|read to the host once"),
    ("one output a replay", "the logged scalars as one tensor",
     r"clones? (one|each|every) (tensor|output)"),
    ("one upload a step", "one pinned copy a step, into the storage",
     r"non_blocking=True|pin_memory|uploaded once"),
    ("TF32 matmuls", "on GPUs that have them", r"set_float32_matmul_precision|allow_tf32"),
    ("no distribution checks", "validation off: each check is a host sync", r"validate_args"),
    ("aten's RNG on CPU", "`fallback_random`: inductor's CPU RNG runs Python", r"fallback_random"),
    ("one all-reduce", "gradients averaged in one buffer", r"all_reduce"),
    ("envs on every core", "`--env-threads -1`: a thread a core", r"sched_getaffinity"),
    ("overlapped envs", "`--async-envs`: half the envs step as the policy acts", r"\.send\("),
    ("env on the device", "the env as tensor math: no host step", r"env on the device"),
    ("many agents", "`--num-seeds`: N agents stacked, each its own draws", r"counter-based RNG"),
]  # fmt: skip

# a third file of a family, diffed against the twin it takes one step further (besides every `*_distributed.py`)
THIRD_FILES = {"pqn_device_env.py": "pqn_torchcompile.py", "ppo_device_env.py": "ppo_torchcompile.py"}

# the README's column for each pair (a script not listed here gets its file name)
LABELS = {
    "ppo": "PPO",
    "ppo_atari_envpool": "PPO Atari",
    "ppo_continuous_action": "PPO MuJoCo",
    "sac_continuous_action": "SAC",
    "td3_continuous_action": "TD3",
    "dqn": "DQN",
    "dqn_atari_envpool": "DQN Atari",
    "r2d2_atari_envpool": "R2D2",
    "pqn": "PQN",
    "pqn_atari_envpool": "PQN Atari",
    "ppo_atari_envpool_distributed": "PPO dist.",
    "pqn_device_env": "PQN dev.",
    "ppo_device_env": "PPO dev.",
}


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


def scripts(root=ROOT):
    """[(script, the file it is diffed against)]: each twin against its eager script, then each third file of a
    family (a distributed script, THIRD_FILES) against the twin it takes further; in the README's order (LABELS),
    then by name."""
    leanrl = Path(root) / "leanrl"
    twins = [(t, leanrl / t.name.replace("_torchcompile", "")) for t in leanrl.glob("*_torchcompile.py")]
    dist = [(d, leanrl / d.name.replace("_distributed", "_torchcompile")) for d in leanrl.glob("*_distributed.py")]
    dist += [(leanrl / name, leanrl / twin) for name, twin in THIRD_FILES.items() if (leanrl / name).exists()]
    order = list(LABELS)
    return sorted(
        twins + dist, key=lambda pair: (order.index(_pair(pair[0])) if _pair(pair[0]) in order else 99, pair[0].name)
    )


def _pair(script):
    return script.name.removesuffix(".py").removesuffix("_torchcompile")


def added_lines(script, base):
    """The lines of script that its diff against base adds (all of it where base is missing)."""
    new = script.read_text().splitlines()
    if not base.exists():
        return new
    matcher = difflib.SequenceMatcher(None, base.read_text().splitlines(), new, autojunk=False)
    return [
        new[j] for tag, _, _, j1, j2 in matcher.get_opcodes() if tag in ("replace", "insert") for j in range(j1, j2)
    ]


POINTER = re.compile(r"#.*\btrick")  # a `# trick:` comment, or a pointer to one: `# (trick: ...)`, `# trick above`


def unexplained_hunks(root=ROOT):
    """One line ("script:line: ...") per hunk of the diffs (scripts()) that no comment naming a trick explains: none on
    the script's lines of the hunk (a deletion: the lines on either side of it) or in the comment block right above.
    Only the module docstring is exempt: its header names the file and its Run: line."""
    found = []
    for script, base in scripts(root):
        old, new = base.read_text(), script.read_text()
        header = [text[: text.index('"""', 3)].count("\n") + 1 if text.startswith('"""') else 0 for text in (old, new)]
        old, new = old.splitlines(), new.splitlines()
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
            if tag == "equal" or (i2 <= header[0] and j2 <= header[1]):
                continue
            above = j1
            while above and new[above - 1].lstrip().startswith("#"):
                above -= 1
            lines = new[above:j2] if j2 > j1 else new[max(j1 - 1, 0) : j1 + 1] + new[above:j1]
            if not any(POINTER.search(line) for line in lines):
                first = new[j1].strip() if j2 > j1 else f"(deleted) {old[i1].strip()}"
                found.append(f"{script.name}:{j1 + 1}: no trick comment explains this hunk: {first}")
    return found


def _key(text):
    return " ".join(text.split()).rstrip(".")


WIDTH = 100  # docs/tricks.md's lines: a link is never split, so one may run longer alone


def _wrap(words, indent="  "):
    lines, line = [], "-"
    for word in words:
        if len(line) + 1 + len(word) > WIDTH and line.strip() != "-":
            lines.append(line)
            line = indent + word
        else:
            line += " " + word
    return lines + [line]


def _link(name, number, own):
    label = f"L{number}" if name == own else f"{LABELS.get(_pair(Path(name)), name)} L{number}"
    return f"[{label}](../leanrl/{name}#L{number})"


# docs/tricks.md before it is first generated: the part outside the markers is written by hand
DOC = """# The tricks

Every difference between `leanrl/<algo>.py` and `leanrl/<algo>_torchcompile.py` is a speed trick with a
`# trick:` comment where it first appears, so `diff` of the pair with this list beside it is the lesson.

<!-- lines:start -->
<!-- lines:end -->
"""


def tricks_doc(root=ROOT):
    """docs/tricks.md's generated part: every distinct `# trick:` comment once, with a link to every line
    that carries it. A comment of two or more twins is listed first, the others under their script: a
    twin's (with the lines of the distributed file that keeps it), then the distributed file's own."""
    carriers = {}  # key -> [text, [(script name, line)]], in the order the scripts come
    for script, _ in scripts(root):
        for number, text in find_tricks(script):
            carriers.setdefault(_key(text), [text, []])[1].append((script.name, number))
    twins = {key: {n for n, _ in places if n.endswith("_torchcompile.py")} for key, (_, places) in carriers.items()}
    out = [
        "Generated by `python plots/tricks.py` from the `# trick:` comments (a test fails when it is stale).",
        "A comment that several scripts carry is listed once, with every line that carries it.",
        "",
    ]
    shared = [key for key in carriers if len(twins[key]) > 1]
    sections = [("### Shared by several twins", shared, None)]
    for script, _ in scripts(root):
        own = [key for key in carriers if key not in shared and carriers[key][1][0][0] == script.name]
        title = f"### {LABELS.get(_pair(script), _pair(script))}: `{script.name}`"
        if script.name.endswith("_distributed.py"):
            title = f"### Scaling out: `{script.name}` (diff it against its twin)"
        elif script.name in THIRD_FILES:
            title = f"### The env on the device: `{script.name}` (diff it against `{THIRD_FILES[script.name]}`)"
        sections.append((title, own, script.name))
    for title, keys, own in sections:
        if not keys:
            continue
        out += [title, ""]
        for key in keys:
            text, places = carriers[key]
            links = [_link(name, number, own) + "," for name, number in places]
            links[-1] = links[-1].removesuffix(",") + ")"
            links[0] = "(" + links[0]
            out += _wrap(text.split() + links)
        out.append("")
    return "\n".join(out)


def catalogue(root=ROOT):
    """(markdown table: one row per CATALOGUE entry, a mark per script whose diff uses it; rows used by none)."""
    pairs = scripts(root)
    added = {script: "\n".join(added_lines(script, base)) for script, base in pairs}
    names = [_pair(script) for script, _ in pairs]
    out = [
        "| trick | what it buys | " + " | ".join(LABELS.get(n, n) for n in names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    unused = []
    for trick, what, pattern in CATALOGUE:
        marks = ["x" if re.search(pattern, added[script]) else "" for script, _ in pairs]  # (1 byte: a README of 15 KB)
        if not any(marks):
            unused.append(trick)
        out.append(f"| {trick} | {what} |" + "".join(f" {mark} |" if mark else " |" for mark in marks))
    return "\n".join(out) + "\n", unused


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", default=str(ROOT / "README.md"))
    parser.add_argument("--docs", default=str(ROOT / "docs" / "tricks.md"), help="the line-by-line list")
    parser.add_argument("--check", action="store_true", help="only check: both up to date, every hunk explained")
    args = parser.parse_args(argv)
    hunks = unexplained_hunks(ROOT) if args.check else []
    for hunk in hunks:
        print(hunk, file=sys.stderr)
    table, unused = catalogue()
    if unused:
        print(f"plots/tricks.py: catalogue rows used by no script: {unused}; fix CATALOGUE", file=sys.stderr)
        return 1
    readme, docs = Path(args.readme), Path(args.docs)
    doc = docs.read_text() if docs.exists() else DOC
    files = {readme: splice(readme.read_text(), "tricks", table), docs: splice(doc, "lines", tricks_doc())}
    stale = [str(path) for path, new in files.items() if not path.exists() or path.read_text() != new]
    if args.check:
        if stale:
            print(f"plots/tricks.py: out of date: {', '.join(stale)}: run python plots/tricks.py", file=sys.stderr)
        return 1 if stale or hunks else 0
    for path, new in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
