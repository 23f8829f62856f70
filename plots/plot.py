"""Turn measured runs into the speed table, bar charts and return curves; splice tables into the READMEs.

    python plots/plot.py                          # runs/results.jsonl -> plots/*.png, plots/speed.md, README table
    python plots/plot.py --results plots/data/*/results.jsonl       # several machines, one table each
    python plots/plot.py --rl-ops benchmarks/results/rl_ops_cpu.md   # splice the operator table: benchmarks/README.md
    python plots/plot.py --replay benchmarks/results/replay_cpu.md   # splice the replay-buffer table there too

Reads only the results lines that the scripts append (one JSON object per run) and the return curves
they write next to them (<results dir>/<run_name>/returns.csv), and the command that run.sh records
beside them (<results dir>/command.txt). Every table and figure is stamped with the hardware it was
measured on; runs from different machines never share a table.
"""

import argparse
import csv
import json
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ["eager", "twin", "twin --compile", "twin --cudagraphs", "twin --compile --cudagraphs"]
TWIN_SUFFIX = "_torchcompile"
DISTRIBUTED_SUFFIX = "_distributed"


def variant_of(line):
    """Name the variant of a results line: the eager script, or the twin with its flags (the distributed file is
    the twin made data-parallel: its runs are twin runs of their own pair, see pair_of)."""
    if not line["script"].removesuffix(".py").endswith((TWIN_SUFFIX, DISTRIBUTED_SUFFIX)):
        return "eager"
    flags = [flag for flag in ("compile", "cudagraphs") if line.get(flag)]
    return " ".join(["twin"] + [f"--{flag}" for flag in flags])


def pair_of(line):
    name = line["script"].removesuffix(".py").removesuffix(TWIN_SUFFIX)
    if name.endswith(DISTRIBUTED_SUFFIX):  # one row per world size: 1, 2 and all GPUs are separate measurements
        name += f" x{line.get('world_size', 1)}"
    return name


def hardware_of(line):
    """The stamp that separates tables: accelerator (or cpu), CPU model and cores, torch version."""
    return f"{line['device']} · {line['cpu']} ({line['cpu_count']} cores) · torch {line['torch']}"


def slug(text):
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60]


def read_results(path):
    """All results lines of a file, skipping lines that are not JSON objects (a run killed mid-write).

    Each line is tagged with where it came from, so its return curve and run.sh command can be found.
    """
    path = Path(path)
    command_file = path.parent / "command.txt"
    commands = command_file.read_text().split("\n") if command_file.exists() else []
    command = "`, then `".join(c.strip() for c in commands if c.strip()) or "the scripts"
    lines = []
    for raw in path.read_text().splitlines():
        try:
            line = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if isinstance(line, dict) and "script" in line:
            lines.append(dict(line, _results=str(path), _command=command))
    return lines


@dataclass
class Cell:
    sps: list = field(default_factory=list)
    returns: list = field(default_factory=list)
    steps: list = field(default_factory=list)
    runs: list = field(default_factory=list)


def group_runs(lines):
    """{hardware: {(pair, env_id): {variant: Cell}}} from the training runs that finished ok.

    A later run with the same hardware, script, env, flags and seed replaces an earlier one, so
    re-running run.sh refreshes the table instead of averaging old and new code.
    """
    latest = {}
    for line in lines:
        if line.get("mode", "train") != "train" or line.get("status") != "ok" or not line.get("sps"):
            continue
        key = (
            hardware_of(line),
            line["script"],
            line["env_id"],
            line.get("compile"),
            line.get("cudagraphs"),
            line["seed"],
        )
        latest[key] = line
    tables = defaultdict(lambda: defaultdict(lambda: defaultdict(Cell)))
    for line in latest.values():
        cell = tables[hardware_of(line)][(pair_of(line), line["env_id"])][variant_of(line)]
        cell.sps.append(line["sps"])
        cell.steps.append(line["steps"])
        cell.runs.append(line)
        if line.get("mean_return") is not None:
            cell.returns.append(line["mean_return"])
    return tables


def failed_runs(lines):
    return [line for line in lines if line.get("mode", "train") == "train" and line.get("status") != "ok"]


def fmt_sps(values):
    mean = statistics.fmean(values)
    spread = f" ± {statistics.stdev(values):.0f}" if len(values) > 1 else ""
    return f"{mean:,.0f}{spread}"


def speedup(cells):
    """Best measured twin variant (compile + cudagraphs where it exists, else --compile) over eager."""
    if "eager" not in cells:
        return None, None
    for variant in ("twin --compile --cudagraphs", "twin --compile"):
        if variant in cells:
            return statistics.fmean(cells[variant].sps) / statistics.fmean(cells["eager"].sps), variant
    return None, None


def speed_markdown(tables, failures):
    """One markdown table per hardware: steps/s (mean ± std over seeds) per variant and the speed-up."""
    out = []
    for hardware, rows in sorted(tables.items()):
        commands = sorted({line["_command"] for cells in rows.values() for c in cells.values() for line in c.runs})
        command = "`, `".join(commands)
        variants = [v for v in VARIANTS if any(v in cells for cells in rows.values())]
        out.append(
            f"Measured on **{hardware}** by `{command}`; steps/s from burn-in to the end, mean ± std over"
            " seeds (n = seeds).\n"
        )
        out.append("| script | env | steps | " + " | ".join(variants) + " | speed-up |")
        out.append("|---" * (len(variants) + 4) + "|")
        for (pair, env_id), cells in sorted(rows.items()):
            steps = max(max(cell.steps) for cell in cells.values())
            row = [f"`{pair}`", env_id, f"{steps:,}"]
            for variant in variants:
                cell = cells.get(variant)
                row.append(f"{fmt_sps(cell.sps)} (n={len(cell.sps)})" if cell else "—")
            ratio, over = speedup(cells)
            row.append(f"{ratio:.2f}x ({over.removeprefix('twin ')})" if ratio else "—")
            out.append("| " + " | ".join(row) + " |")
        out.append("")
        out.append("Mean episodic return at the end, and wall seconds of the whole run (compilation included):\n")
        out.append("| script | env | " + " | ".join(f"{v}: return, wall" for v in variants) + " |")
        out.append("|---" * (len(variants) + 2) + "|")
        for (pair, env_id), cells in sorted(rows.items()):
            row = [f"`{pair}`", env_id]
            for variant in variants:
                cell = cells.get(variant)
                if not cell:
                    row.append("—")
                    continue
                ret = f"{statistics.fmean(cell.returns):.1f}" if cell.returns else "—"
                row.append(f"{ret}, {statistics.fmean(line['wall_s'] for line in cell.runs):.0f} s")
            out.append("| " + " | ".join(row) + " |")
        out.append(
            f"\n![steps/s per variant](plots/speed_{slug(hardware)}.png)"
            f" ![returns](plots/returns_{slug(hardware)}.png)\n"
        )
    if failures:
        out.append(
            "Runs that did not finish ok: "
            + "; ".join(
                f"`{f['script']}` {variant_of(f) if 'compile' in f else ''} seed {f.get('seed')}: {f.get('status')}"
                for f in failures
            )
            + "\n"
        )
    return "\n".join(out).strip() + "\n"


def splice(text, marker, content):
    """Replace what stands between <!-- marker:start --> and <!-- marker:end --> in text."""
    start, end = f"<!-- {marker}:start -->", f"<!-- {marker}:end -->"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"plot.py: error: README has no {start} ... {end} markers")
    return pattern.sub(lambda _: f"{start}\n{content.strip()}\n{end}", text)


def read_returns(line):
    path = Path(line["_results"]).parent / line.get("run_name", "") / "returns.csv"
    if not path.exists():
        return []
    with path.open() as f:
        return [(float(r["step"]), float(r["wall_s"]), float(r["return"])) for r in csv.DictReader(f)]


def plot_speed(hardware, rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = [v for v in VARIANTS if any(v in cells for cells in rows.values())]
    groups = sorted(rows)
    width = 0.8 / len(variants)
    fig, ax = plt.subplots(figsize=(2.2 + 2.2 * len(groups), 4.2))
    for i, variant in enumerate(variants):
        xs, means, errs = [], [], []
        for g, key in enumerate(groups):
            cell = rows[key].get(variant)
            if cell:
                xs.append(g + (i - (len(variants) - 1) / 2) * width)
                means.append(statistics.fmean(cell.sps))
                errs.append(statistics.stdev(cell.sps) if len(cell.sps) > 1 else 0.0)
        ax.bar(xs, means, width, yerr=errs, label=variant, capsize=2)
    ax.set_xticks(range(len(groups)), [f"{pair}\n{env}" for pair, env in groups], fontsize=8)
    ax.set_ylabel("env steps / s")
    ax.set_title(hardware, fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_returns(hardware, rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted(rows)
    fig, axes = plt.subplots(len(groups), 2, figsize=(10, 3 * len(groups)), squeeze=False)
    colors = {v: f"C{i}" for i, v in enumerate(VARIANTS)}
    for (ax_steps, ax_wall), key in zip(axes, groups, strict=True):
        for variant, cell in rows[key].items():
            for n, line in enumerate(cell.runs):
                curve = read_returns(line)
                if not curve:
                    continue
                steps, wall, returns = zip(*curve, strict=True)
                label = variant if n == 0 else None
                ax_steps.plot(steps, returns, color=colors[variant], alpha=0.7, lw=1, label=label)
                ax_wall.plot(wall, returns, color=colors[variant], alpha=0.7, lw=1, label=label)
        ax_steps.set_title(f"{key[0]} · {key[1]}", fontsize=9)
        ax_steps.set_xlabel("env steps")
        ax_wall.set_xlabel("wall seconds")
        ax_steps.set_ylabel("episodic return")
        ax_steps.legend(fontsize=7)
    fig.suptitle(hardware, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--results", nargs="+", help="results files the scripts wrote (default runs/results.jsonl, none with --rl-ops)"
    )
    parser.add_argument("--out", default=str(ROOT / "plots"), help="folder for speed.md and the PNGs")
    parser.add_argument("--readme", default=str(ROOT / "README.md"), help="README to splice the tables into")
    parser.add_argument("--no-readme", action="store_true", help="write the files but leave the README alone")
    parser.add_argument("--rl-ops", help="markdown table written by benchmarks/rl_ops.py to splice in")
    parser.add_argument("--replay", help="markdown table written by benchmarks/replay.py to splice in")
    parser.add_argument(
        "--benchmarks-readme",
        default=str(ROOT / "benchmarks" / "README.md"),
        help="README to splice the --rl-ops and --replay tables into",
    )
    args = parser.parse_args(argv)
    benchmarks = {"rl-ops": args.rl_ops, "replay": args.replay}
    if args.results is None:
        args.results = [] if any(benchmarks.values()) else ["runs/results.jsonl"]

    readme = Path(args.readme)
    text = readme.read_text() if readme.exists() else ""
    present = [path for path in args.results if Path(path).exists()]
    if present:
        lines = [line for path in present for line in read_results(path)]
        tables = group_runs(lines)
        if not tables:
            raise SystemExit(f"plot.py: error: no finished training runs in {' '.join(present)}")
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        table = speed_markdown(tables, failed_runs(lines))
        (out / "speed.md").write_text(table)
        for hardware, rows in tables.items():
            plot_speed(hardware, rows, out / f"speed_{slug(hardware)}.png")
            plot_returns(hardware, rows, out / f"returns_{slug(hardware)}.png")
        print(table)
        if not args.no_readme:
            readme.write_text(splice(text, "speed-table", table))
    elif not any(benchmarks.values()):
        raise SystemExit(f"plot.py: error: no results file at {' '.join(args.results)} (run ./run.sh first)")
    if any(benchmarks.values()) and not args.no_readme:  # the benchmark tables live in benchmarks/README.md
        bench_readme = Path(args.benchmarks_readme)
        bench_text = bench_readme.read_text()
        for marker, table in benchmarks.items():
            if table:
                bench_text = splice(bench_text, marker, Path(table).read_text())
        bench_readme.write_text(bench_text)


if __name__ == "__main__":
    main()
