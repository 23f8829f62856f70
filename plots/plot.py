"""Turn measured runs into the speed and returns tables, bar charts and return curves; splice tables into the READMEs.

    python plots/plot.py --results runs/results.jsonl           # -> runs/speed.md, runs/speed_*.png, runs/returns_*.png
    python plots/plot.py --results runs/learning/results.jsonl --learning    # -> returns.md beside CleanRL's figures
    python plots/plot.py --results runs/quick/results.jsonl --publish        # and the README table, plots/*.png
    python plots/plot.py --learning --part atari --results plots/learning-runs/atari/results.jsonl --out runs --publish
    python plots/plot.py --rl-ops benchmarks/results/rl_ops_cpu.md   # the operator table's cut: benchmarks/README.md
    python plots/plot.py --replay benchmarks/results/replay_cpu.md   # the replay-buffer table's cut there too
    python plots/plot.py --steady benchmarks/results/steady_cpu.md   # the steady table: README.md, docs/cpu-speed.md
    python plots/plot.py --steady benchmarks/results/steady_cpu.md benchmarks/results/steady_cpu_X.md  # re-measured X
    python plots/plot.py --gpu OUT/results.jsonl --publish           # benchmarks/gpu_session.sh's: README.md's cut
    python plots/plot.py --gpu A.jsonl B.jsonl --publish --readme docs/gpu-checks.md   # sessions A and B there
    python plots/plot.py --time-to-score OUT/time_to_score.jsonl --publish  # benchmarks/time_to_score.sh's runs
    python plots/plot.py --seeds runs/CartPole-v1__pqn_device_env__1__...   # a --num-seeds run: every seed's curve

Reads only the results lines that the scripts append (one JSON object per run) and the return curves
they write next to them (<results dir>/<run_name>/returns.csv), and the command that run.sh records
beside them (<results dir>/command.txt). Every table and figure is stamped with the hardware it was
measured on; runs from different machines never share a table. The tables and PNGs go beside the results;
only --publish touches the repository (README.md between its markers, plots/).
"""

import argparse
import csv
import json
import math
import os
import re
import shutil
import statistics
import sys
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ["eager", "twin", "twin --compile", "twin --cudagraphs", "twin --compile --cudagraphs"]
COLORS = {variant: f"C{i}" for i, variant in enumerate(VARIANTS)}
# twins give the same returns as each other on the same seed: a dashed line over a solid one keeps both visible
STYLES = dict(zip(VARIANTS, ["-", "-", (0, (4, 2)), (0, (1, 1.5)), (0, (6, 2, 1, 2))]))
PUBLISHED = Path(__file__).resolve().parent / "published_returns.csv"  # CleanRL's figures, with their source
# published wall-clock times of whole runs (sources cited in the file), beside benchmarks/time_to_score.py's curves
TIME_TO_SCORE = Path(__file__).resolve().parent / "published_time_to_score.csv"
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


def budget_of(line):
    """The run's --total-timesteps (older results lines lack it: the steps it did)."""
    return line.get("total_timesteps") or line["steps"]


def group_runs(lines, by_budget=False):
    """{hardware: {(pair, env_id): {variant: Cell}}} from the training runs that finished ok.

    A later run with the same hardware, script, env, flags and seed replaces an earlier one, so
    re-running run.sh refreshes the table instead of averaging old and new code. With by_budget, runs of
    different --total-timesteps are kept apart: the keys are (pair, env_id, budget).
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
            budget_of(line) if by_budget else None,
        )
        latest[key] = line
    tables = defaultdict(lambda: defaultdict(lambda: defaultdict(Cell)))
    for line in latest.values():
        key = (pair_of(line), line["env_id"]) + ((budget_of(line),) if by_budget else ())
        cell = tables[hardware_of(line)][key][variant_of(line)]
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
    ratios = speedups(cells)
    for variant in ("twin --compile --cudagraphs", "twin --compile"):
        if ratios.get(variant, (None,))[0] is not None:
            return ratios[variant][0], variant
    return None, None


def speedups(cells):
    """{variant: (speed-up over the eager script, mean steps/s, std steps/s)} for one pair's cells, variants in
    VARIANTS order; the speed-up is the ratio of the means over seeds (eager: 1), None where no eager run exists."""
    eager = statistics.fmean(cells["eager"].sps) if "eager" in cells else None
    out = {}
    for variant in VARIANTS:
        if variant in cells:
            sps = cells[variant].sps
            mean, std = statistics.fmean(sps), statistics.stdev(sps) if len(sps) > 1 else 0.0
            out[variant] = (mean / eager if eager else None, mean, std)
    return out


def failures_markdown(failures):
    if not failures:
        return []
    runs = "; ".join(
        f"`{f['script']}` {variant_of(f) if 'compile' in f else ''} seed {f.get('seed')}: {f.get('status')}"
        for f in failures
    )
    return [f"Runs that did not finish ok: {runs}\n"]


def commands_of(rows):
    return "`, `".join(sorted({line["_command"] for cells in rows.values() for c in cells.values() for line in c.runs}))


def commits_of(rows):
    """The commits a table's runs ran at, as their results lines name them ("" for a line from before they did)."""
    return sorted({line.get("commit") or "" for cells in rows.values() for c in cells.values() for line in c.runs})


def provenance(rows, images="", name=""):
    """The command(s) that made a table, quoted, and the commit(s) its runs ran at; in the README (images set) a list
    of several commands gives way to the first and a link to the table's own file `name`, which lists them all."""
    commands = commands_of(rows).replace("`, then `", "`, `").split("`, `")
    if not images or len(commands) == 1:
        made = "`" + "`, then `".join(commands) + "`"
    else:
        made = f"`{commands[0]}` and {len(commands) - 1} more (all in [{name}]({images}{name}))"
    named = [f"`{commit}`" for commit in commits_of(rows) if commit]
    if named:
        made += f" at commit{'s' if len(named) > 1 else ''} {', '.join(named)}"
    if "" in commits_of(rows):
        made += (", and" if named else ",") + " runs from before commits were recorded"
    return made


def speed_markdown(tables, failures, images="", returns=True):
    """One markdown table per hardware: steps/s (mean ± std over seeds) per variant and the speed-up.

    images: where the PNGs are, relative to the file the table goes into ("" beside it, "plots/" from the README).
    returns: also the mean return and wall time of each cell (the README leaves them to plots/speed.md).
    """
    out = []
    for hardware, rows in sorted(tables.items()):
        command = provenance(rows, images, "speed.md")
        variants = [v for v in VARIANTS if any(v in cells for cells in rows.values())]
        out.append(
            f"Measured on **{hardware}** by {command}; steps/s from burn-in to the end, mean ± std over"
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
        if not returns:
            out.append(f"Each cell's return and wall time: [{images}speed.md]({images}speed.md).")
        else:
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
            f"\n![speed-up over eager per variant]({images}speed_{slug(hardware)}.png)"
            f" ![returns]({images}returns_{slug(hardware)}.png)\n"
        )
    out += failures_markdown(failures)
    return "\n".join(out).strip() + "\n"


def read_published(path=PUBLISHED):
    """{(script, env_id): [(steps, mean, std), ...]}: CleanRL's published returns, mean and std as the source writes
    them (strings); the file's lines starting with # cite the source."""
    published = defaultdict(list)
    with open(path) as fh:
        for row in csv.DictReader(line for line in fh if not line.startswith("#")):
            published[(row["script"], row["env_id"])].append((int(row["steps"]), row["mean"], row["std"]))
    return dict(published)


def fmt_steps(steps):
    """1M, 500k, 600: a budget as people write it."""
    return f"{steps / 1e6:g}M" if steps >= 1e6 else f"{steps / 1e3:g}k" if steps >= 1e3 else f"{steps:g}"


def fmt_wall(seconds):
    """Seconds, minutes or hours, whichever reads best."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def fmt_return(mean, std=None):
    digits = 1 if abs(mean) < 1000 else 0
    return f"{mean:,.{digits}f}" + (f" ± {std:,.{digits}f}" if std is not None else "")


def published_cell(published, pair, env_id, budget):
    """CleanRL's figure for the same env and budget (within 2%: a run stops at a whole number of iterations); else
    its figure for the env at its own budget, named as such; else a dash."""
    rows = published.get((pair, env_id), [])
    for steps, mean, std in rows:
        if abs(budget - steps) <= 0.02 * steps:
            return f"{mean} ± {std}"
    if rows:
        return "— (" + "; ".join(f"{mean} ± {std} at {fmt_steps(steps)}" for steps, mean, std in rows) + ")"
    return "—"


def returns_markdown(tables, failures, published, images="", png="learning", part=False):
    """One markdown table per hardware: the return at the end of each full-budget run (mean of its last 100 episodes),
    mean ± std over seeds per variant, beside CleanRL's published figure for the same env and budget; its curves are
    the PNG named png_<hardware>.png. A part (published below the main table) says what its cells are in brief."""
    out = []
    for hardware, rows in sorted(tables.items()):
        variants = [v for v in VARIANTS if any(v in cells for cells in rows.values())]
        what = (
            "the cells as in the README's first returns table"
            if part
            else "each run's mean return over its last 100 episodes, mean ± std over seeds (n; one run's wall time); "
            "CleanRL: its published 3-seed figure, same env and budget (`plots/published_returns.csv`)"
        )
        command = provenance(rows, images, png.replace("learning", "returns") + ".md")
        out.append(f"Measured on **{hardware}** by {command}: {what}.\n")
        out.append("| script | env | steps | " + " | ".join(variants) + " | CleanRL |")
        out.append("|---" * (len(variants) + 4) + "|")
        for (pair, env_id, budget), cells in sorted(rows.items()):
            row = [f"`{pair}`", env_id, f"{budget:,}"]
            for variant in variants:
                cell = cells.get(variant)
                if not cell:
                    row.append("—")
                    continue
                wall = statistics.fmean(line["wall_s"] for line in cell.runs)
                ret = cell.returns
                std = statistics.stdev(ret) if len(ret) > 1 else None
                value = fmt_return(statistics.fmean(ret), std) if ret else "—"
                row.append(f"{value} (n={len(ret)}, {fmt_wall(wall)})")
            row.append(published_cell(published, pair, env_id, budget))
            out.append("| " + " | ".join(row) + " |")
        out.append(f"\n![return curves, mean over seeds]({images}{png}_{slug(hardware)}.png)\n")
    out += failures_markdown(failures)
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


def bin_mean(xs, ys, edges):
    """The mean of ys whose xs fall in each bin [edges[i], edges[i + 1]) (the last bin also takes its right edge);
    NaN for a bin no point falls in, so a line drawn through the bins breaks there instead of bridging the gap."""
    import numpy as np

    xs, ys = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    index = np.clip(np.searchsorted(edges, xs, side="right") - 1, 0, len(edges) - 2)
    inside = (xs >= edges[0]) & (xs <= edges[-1])
    sums = np.bincount(index[inside], weights=ys[inside], minlength=len(edges) - 1)
    counts = np.bincount(index[inside], minlength=len(edges) - 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def mean_band(curves, edges):
    """Bin centres and, over the curves (one (xs, returns) per seed, each binned with bin_mean), the mean and the
    min-max band per bin. A bin takes the seeds that ended an episode in it; where none did, all three are NaN."""
    import numpy as np

    binned = np.array([bin_mean(xs, ys, edges) for xs, ys in curves]).reshape(len(curves), len(edges) - 1)
    with warnings.catch_warnings():  # an all-NaN bin is a gap, not an error
        warnings.simplefilter("ignore", RuntimeWarning)
        mean, lo, hi = np.nanmean(binned, 0), np.nanmin(binned, 0), np.nanmax(binned, 0)
    return (edges[:-1] + edges[1:]) / 2, mean, lo, hi


def bin_edges(curves, max_bins=60, per_bin=4):
    """Equal bins from the first x of the curves to the end of the shortest (past it the mean would be over fewer
    seeds: a step in the line that is only a run ending); about per_bin episodes of the median curve per bin, 5 to
    max_bins bins."""
    import numpy as np

    lo, hi = min(min(xs) for xs, _ in curves), min(max(xs) for xs, _ in curves)
    n = int(np.clip(statistics.median(len(xs) for xs, _ in curves) // per_bin, 5, max_bins))
    return np.linspace(lo, hi, n + 1) if hi > lo else np.linspace(lo - 0.5, hi + 0.5, n + 1)


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def panel_title(key):
    """pair · env, and the budget where runs are grouped by it (--learning)."""
    return " · ".join([*key[:2], *(f"{fmt_steps(budget)} steps" for budget in key[2:])])


def grid(n, cols):
    cols = min(cols, n)
    return math.ceil(n / cols), cols


def plot_speed(hardware, rows, path):
    """One panel per pair: each variant's speed-up over that pair's eager script, printed on its bar, with its
    steps/s under it (a 3,500 and a 70 steps/s pair on one axis would leave the second a sliver)."""
    plt = pyplot()
    groups = sorted(rows)
    nrows, ncols = grid(len(groups), 4)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(max(3.3 * ncols, 6.0), 3.0 * nrows + 0.7), squeeze=False, layout="constrained"
    )
    for ax in axes.flat[len(groups) :]:
        ax.axis("off")
    for ax, key in zip(axes.flat, groups):
        ratios = speedups(rows[key])
        names = list(ratios)
        ax.set_title(panel_title(key), fontsize=9)
        ax.set_xticks(
            range(len(names)),
            [f"{v.removeprefix('twin ')}\n{mean:,.0f}/s" for v, (_, mean, _) in ratios.items()],
            fontsize=7,
        )
        if ratios[names[0]][0] is None:  # no eager run: no ratio to draw
            ax.text(0.5, 0.5, "no eager run", ha="center", va="center", transform=ax.transAxes)
            ax.set_yticks([])
            continue
        heights = [ratio for ratio, _, _ in ratios.values()]
        errors = [std * ratio / mean for ratio, mean, std in ratios.values()]
        ax.bar(range(len(names)), heights, 0.7, yerr=errors, capsize=2, color=[COLORS[v] for v in names])
        for i, (height, error) in enumerate(zip(heights, errors)):  # the value above its error bar
            ax.annotate(f"{height:.2f}x", (i, height + error), xytext=(0, 2), textcoords="offset points",
                        ha="center", va="bottom", fontsize=8, fontweight="bold")  # fmt: skip
        ax.axhline(1.0, color="0.3", lw=0.8, ls="--")
        ax.set_ylim(0, max(h + e for h, e in zip(heights, errors)) * 1.22)
        ax.tick_params(axis="y", labelsize=7)
    for ax in axes[:, 0]:
        ax.set_ylabel("speed-up over eager", fontsize=8)
    fig.suptitle(
        f"{hardware}\nspeed-up over each pair's eager script: ratio of the mean steps/s over seeds\n"
        "(error bar: std over seeds); the steps/s under each bar",
        fontsize=8,
    )
    fig.savefig(path, dpi=110)
    plt.close(fig)


def draw_band(ax, curves, edges, color, label):
    """The mean over seeds as a line, broken where no episode ended, and the min-max band; isolated bins as dots."""
    import numpy as np

    x, mean, lo, hi = mean_band(curves, edges)
    ax.plot(x, mean, color=color, ls=STYLES[label], lw=1.4, label=f"{label} (n={len(curves)})")
    if len(curves) > 1:
        ax.fill_between(x, lo, hi, color=color, alpha=0.2, lw=0)
    finite = np.isfinite(mean)
    isolated = finite & ~np.r_[False, finite[:-1]] & ~np.r_[finite[1:], False]
    ax.plot(x[isolated], mean[isolated], "o", color=color, ms=3)


def plot_returns(hardware, rows, path, title="return curves"):
    """Per pair, against env steps and against wall seconds: each variant's mean return over seeds, binned by steps
    (or seconds), with the min-max band over seeds."""
    plt = pyplot()
    groups = sorted(rows)
    fig, axes = plt.subplots(len(groups), 2, figsize=(10, 2.9 * len(groups) + 0.5), squeeze=False, layout="constrained")
    for (ax_steps, ax_wall), key in zip(axes, groups, strict=True):
        for variant in [v for v in VARIANTS if v in rows[key]]:
            curves = [curve for curve in map(read_returns, rows[key][variant].runs) if curve]
            if not curves:
                continue
            for ax, column in ((ax_steps, 0), (ax_wall, 1)):
                xy = [([point[column] for point in curve], [point[2] for point in curve]) for curve in curves]
                draw_band(ax, xy, bin_edges(xy), COLORS[variant], variant)
        ax_steps.set_title(panel_title(key), fontsize=9)
        ax_steps.xaxis.set_major_formatter(lambda x, _: fmt_steps(x) if x > 0 else f"{x:g}")
        ax_wall.set_title("the same against wall time (compilation included)", fontsize=8)
        ax_steps.set_xlabel("env steps", fontsize=8)
        ax_wall.set_xlabel("wall seconds", fontsize=8)
        ax_steps.set_ylabel("episodic return", fontsize=8)
        for ax in (ax_steps, ax_wall):
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
        if ax_steps.has_data():
            ax_steps.legend(fontsize=7)
    fig.suptitle(f"{hardware}\n{title}: mean over seeds, binned by steps (gaps: no episode ended), band: min-max",
                 fontsize=8)  # fmt: skip
    fig.savefig(path, dpi=110)
    plt.close(fig)


def publish_files(out, plots_dir, names):
    """Copy the named files from out into plots_dir (the committed copies the README links to)."""
    plots_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        if (out / name).resolve() != (plots_dir / name).resolve():
            shutil.copyfile(out / name, plots_dir / name)


GPU_COLUMNS = ["eager", "twin", "twin --compile", "twin --compile --cudagraphs"]
# LeanRL's published twin speeds, --compile --cudagraphs, steps/s on one H100 (LeanRL's README and charts, copied from
# the project's anchors, shared/anchors/published_returns.md): the floor for a script run alone
LEANRL_PUBLISHED = {"ppo_atari_envpool": 6809, "ppo_continuous_action": 1774, "sac_continuous_action": 725,
                    "td3_continuous_action": 936}  # fmt: skip
HELD = 0.2  # two readings of a ratio hold when the larger is at most 20% over the smaller


def median_of(cell):
    """A steady table's cell "262 (259–264)" (median, min–max over the rounds): its median."""
    return cell.split(" (")[0]


PEER_NAMES = {"peer": "LeanRL", "sb3": "SB3", "torchrl": "TorchRL"}  # steady.py's peer sides, as the README names them


def steady_rows(table):
    """A steady table's rows as lists of cells, and its column names."""
    lines = table.strip().splitlines()
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines if line.startswith("| `")]
    header = [line for line in lines if line.startswith("| run | side |")]
    return rows, cells_of(header[0]) if header else []


def steady_pair(label):
    """The pair a steady table's run label belongs to: "`sac_continuous_action_torchcompile.py --compile`" -> its
    eager script's name."""
    return re.sub(r"(_torchcompile)?\.py.*", "", label.strip("`"))


def steady_measured(table):
    """(UTC date, commit of ours, rounds) from a steady table's head: when and at what a table was measured."""
    date = re.search(r"(\d{4}-\d\d-\d\d \d\d:\d\d) UTC", table)
    commit = re.search(r"Sides: (?:.*?, )?new = ([^,\n]+)", table)
    rounds = re.search(r"(\d+) interleaved round", table)
    return date.group(1) if date else "", commit.group(1) if commit else "", int(rounds.group(1)) if rounds else 1


def steady_brief(table, link, parts=()):
    """The README's cut of benchmarks/steady.py's table with peer sides (LeanRL, SB3, TorchRL, whichever it has): one
    row a script of ours, its steps per CPU-second, our ratio to each peer with its range over the rounds (SB3 has no
    compile option: a twin's ratio is to SB3's eager run, as the whole table pairs them), and our cold warm-up, as
    medians; each peer's own figures stay in `link`. Without a peer: as is.

    parts: (table, link) of later re-measures of some of its scripts, oldest first: their rows replace the same
    scripts' rows, and the head says when and at what commit each part was measured."""
    tables = [(table, link), *sorted(parts, key=lambda part: steady_measured(part[0])[0])]
    parsed = [(*steady_rows(text), text, where) for text, where in tables]
    present = [side for side in PEER_NAMES if any(row[1] == side for rows, *_ in parsed for row in rows)]
    if not present:
        return table
    ours = {}  # a script of ours: its row, rendered from the latest table that has it (first seen order kept)
    for rows, columns, _, _ in parsed:
        ratio_at = {}  # peer side: the column of our ratio to it, per CPU-second
        for i, name in enumerate(columns):
            if name.endswith(", CPU-s") and "/" in name:
                ratio_at[name.removesuffix(", CPU-s").split("/")[1]] = i
        for row in rows:
            if row[1] not in PEER_NAMES:
                ratios = [(row[ratio_at[s]] if ratio_at.get(s, len(row)) < len(row) else "") or "—" for s in present]
                ratios = [re.sub(r"x([–)])", r"\1", ratio) for ratio in ratios]  # "1.2x (1.1x–1.3x)": "1.2x (1.1–1.3)"
                ours[row[0]] = [steady_pair(row[0]), steady_run(row[0]), median_of(row[3]), *ratios, median_of(row[5])]
    head = brief_head([line for line in table.strip().splitlines() if not line.startswith("|")][:2])
    remeasures, day = [], steady_measured(table)[0][:10]
    for rows, _, text, where in parsed[1:]:
        date, commit, rounds = steady_measured(text)
        pairs = ", ".join(dict.fromkeys(steady_pair(row[0]) for row in rows if row[1] not in PEER_NAMES))
        when = "" if date[:10] == day else f" on {date[:10]}"  # the whole table's day: said in its head
        remeasures.append(f"{pairs}{when} at {commit}, {rounds} rounds ([table]({where}))")
    head += [f"Re-measured: {'; '.join(remeasures)}."] if remeasures else []
    rounds = steady_measured(table)[2]
    how = "one round" if rounds == 1 else f"{rounds} rounds: medians and the ratio's range"
    names = [PEER_NAMES[side] for side in present]
    out = [*head, "", f"Steps per CPU-second, ours and our ratio to each peer, {how} ([theirs]({link})).", ""]
    out += ["| pair | run | ours | " + " | ".join(f"ours / {n}" for n in names) + " | warm-up s |"]
    out += ["|---" * (4 + len(names)) + "|"]
    row_pairs = [cells[0] for cells in ours.values()]
    for i, cells in enumerate(ours.values()):  # a pair named once, on its first row
        out.append("| " + " | ".join([f"`{cells[0]}`" if cells[0] not in row_pairs[:i] else "", *cells[1:]]) + " |")
    return "\n".join(out) + "\n"


def steady_run(label):
    """A steady row's run in the README's cut: "eager" for a pair's eager script, else its twin's flags."""
    flags = label.strip("`").split(".py")[-1].strip()
    return "eager" if "_torchcompile" not in label else f"twin {flags}".strip()


def brief_head(lines):
    """The README's cut of a steady table's two head lines, shorter: the day without the hour, no load average (the
    whole table has both), no output folder in the command, no rounds (the table's line says them), each side as the
    README names it (how LeanRL was patched: the text around the table), no torch named again after a peer when it is
    the measurement's torch."""
    torch = re.search(r"; torch ([^;]+);", lines[0])
    first = re.sub(r" --results-dir \S+?`", "`", lines[0].replace("Measured on cpu; CPU ", "Measured on "))
    first = re.sub(r"; \d+ interleaved round\(s\)|, load average [\d.]+ at start| \d\d:\d\d UTC", "", first)
    first = first.replace("an empty compile cache for each run", "cold compile caches")
    out = [first]
    for line in lines[1:]:
        if torch:
            line = line.replace(f" (torch {torch.group(1)})", "")
        if line.startswith("Sides: "):  # "new = abc, sb3 = stable-baselines3 2.9.2" -> "ours at abc; SB3 2.9.2"
            sides = re.findall(r"(\w+) = (.*?)(?=, \w+ = |\.$)", line.removeprefix("Sides: "))
            named = [
                f"ours at {what}" if side == "new"
                else what if side not in PEER_NAMES or what.startswith(PEER_NAMES[side])
                else f"{PEER_NAMES[side]} {what.split(' ', 1)[-1]}"
                for side, what in sides
            ]  # fmt: skip
            line = re.sub(r" \(patched, see [^)]*\)", " (patched)", f"Sides: {'; '.join(named)}." if sides else line)
        out.append(line)
    return out


def publish_steady(table, results):
    """Put a steady table among the published ones in `results`: steady_cpu.md, the whole table, and re-measures of
    some of its scripts beside it (steady_cpu_<scripts>.md). A table with every script of ours the whole one has
    replaces it and the re-measures; one with fewer goes beside it, replacing a re-measure of the same scripts.
    Returns the published tables, the whole one first."""
    whole = results / "steady_cpu.md"
    scripts = lambda text: [row[0] for row in steady_rows(text)[0] if row[1] not in PEER_NAMES and row[1] != "base"]
    new = scripts(table.read_text())
    if not whole.exists() or set(new) >= set(scripts(whole.read_text())):
        for part in results.glob("steady_cpu_*.md"):
            part.unlink()
        target = whole
    else:
        target = results / f"steady_cpu_{'+'.join(dict.fromkeys(steady_pair(label) for label in new))}.md"
    shutil.copyfile(table, target)
    return [str(whole), *sorted(str(part) for part in results.glob("steady_cpu_*.md"))]


def table_blocks(text):
    """Markdown text as [(is_table, lines)], a table being consecutive lines that start with |."""
    blocks = []
    for line in text.strip().splitlines():
        is_table = line.startswith("|")
        if blocks and blocks[-1][0] == is_table:
            blocks[-1][1].append(line)
        else:
            blocks.append((is_table, [line]))
    return blocks


def cells_of(line):
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def rl_ops_brief(table, link):
    """benchmarks/README.md's cut of bench_rl_operators.py's table: one row an operator, at its largest size (of
    equal ones the last), every column; the other sizes and the table of candidates stay in `link`."""
    blocks = table_blocks(table)
    if not any(is_table for is_table, _ in blocks):
        return table
    out, first = [], True
    for i, (is_table, lines) in enumerate(blocks):
        if not is_table:
            if first or not (i + 1 < len(blocks) and blocks[i + 1][0]):  # text before a later table goes with it
                out += [*lines, ""]
            continue
        if not first:
            continue
        first, largest = False, {}
        for line in lines[2:]:
            size = math.prod(int(n) for n in re.findall(r"=(\d+)", cells_of(line)[1]))
            op = cells_of(line)[0]
            if size >= largest.get(op, (0, ""))[0]:
                largest[op] = (size, line)
        rows = [line for line in lines[2:] if largest.get(cells_of(line)[0], (0, ""))[1] == line]
        out += [f"One row an operator, at its largest size; every size and form: [{Path(link).name}]({link}).", ""]
        out += [*lines[:2], *rows, ""]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip() + "\n"


def replay_brief(table, link):
    """benchmarks/README.md's cut of replay.py's table: for each buffer the study gives rates for, the row with the
    least margin over its need (whichever operation, script, form and capacity that was); every row stays in
    `link`. The sampler table, and every line of text, as they are."""
    blocks = table_blocks(table)
    if not any(is_table for is_table, _ in blocks):
        return table
    out, first = [], True
    for is_table, lines in blocks:
        if not is_table or not first:
            out += [*lines, ""]
            continue
        first, least = False, {}
        for line in lines[2:]:
            cells = cells_of(line)
            if cells[-1] in ("—", ""):
                continue
            margin = float(cells[-1].rstrip("x").replace(",", ""))
            if margin < least.get(cells[0], (math.inf, ""))[0]:
                least[cells[0]] = (margin, line)
        rows = [line for line in lines[2:] if any(line == kept for _, kept in least.values())]
        out += [
            "For each buffer, the row with the least margin over the study's need; every operation, script, form and "
            f"capacity: [{Path(link).name}]({link}).",
            "",
        ]
        out += [*lines[:2], *rows, ""]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip() + "\n"


def gpu_sessions(records):
    """[(machine, runs, ceilings), ...] from benchmarks/gpu_session.py's results.jsonl, one per session; plain
    results lines (a GPU run of the scripts alone) become runs of their own machine, with their sps and no window."""
    sessions, current = {}, None
    for rec in records:
        if rec.get("kind") == "machine":
            current = f"{rec['device']} · {rec['cpu']} ({rec['cpu_count']} cores) · torch {rec['torch']}"
            current += f" · {rec.get('time', '')} · {rec.get('commit', '')}"  # two calls, one machine: two tables
            sessions.setdefault(current, (rec, [], []))
        elif rec.get("kind") in ("run", "ceiling") and current is not None:
            sessions[current][1 if rec["kind"] == "run" else 2].append(rec)
        elif "script" in rec and rec.get("mode", "train") == "train":
            hardware = hardware_of(rec)
            machine = dict(device=rec["device"], cpu=rec["cpu"], cpu_count=rec["cpu_count"], torch=rec["torch"])
            run = dict(
                side="leanrl", pair=pair_of(rec), variant=variant_of(rec), env_id=rec["env_id"], num_envs=None,
                sps=rec.get("sps") if rec.get("status") == "ok" else None, status=rec.get("status"),
                message=rec.get("message"), steps=rec.get("steps"),
            )  # fmt: skip
            sessions.setdefault(hardware, (machine, [], []))[1].append(run)
    return list(sessions.values())


def ratio_rounds(rounds):
    """Per pair of the ratio rounds (gpu_session.py --rounds): our twin's and LeanRL's steps/s by round, the ratio of
    each round where both have a window, their median, how far the readings differ (the larger over the smaller, less
    1) and whether they hold (two readings within HELD)."""
    pairs = defaultdict(lambda: dict(ours={}, peer={}))
    for r in rounds:
        row = pairs[(r["pair"], r["env_id"], r.get("num_envs"))]
        row["ours" if r["side"] == "leanrl" else "peer"][r["round"]] = r.get("sps")
    out = []
    for (pair, env_id, num_envs), row in sorted(pairs.items()):
        numbers = sorted(set(row["ours"]) | set(row["peer"]))
        ratios = {n: row["ours"][n] / row["peer"][n] for n in numbers if row["ours"].get(n) and row["peer"].get(n)}
        values = list(ratios.values())
        differ = max(values) / min(values) - 1 if len(values) > 1 else None
        out.append(dict(pair=pair, env_id=env_id, num_envs=num_envs, rounds=numbers, ours=row["ours"],
                        peer=row["peer"], ratios=ratios, median=statistics.median(values) if values else None,
                        differ=differ, held=len(values) == 2 and differ <= HELD))  # fmt: skip
    return out


def rounds_markdown(rounds):
    """The ratio rounds' table: both readings, their median, a mark where they differ by more than HELD."""
    sps = lambda by, n: f"{by[n]:,.0f}" if by.get(n) else "—"
    lines = [
        "Our twin and LeanRL's, the same flags, at the same moment on equal cores, then with the cores "
        f"swapped: the median of the rounds' ratios, each round's in brackets; readings more than {HELD:.0%} apart "
        "are marked, not a ratio that holds.",
        "",
        "| pair | env | ours, by round | LeanRL's twin, by round | ours / LeanRL: median (by round) | readings |",
        "|---|---|---|---|---|---|",
    ]
    for row in ratio_rounds(rounds):
        env = row["env_id"] + (f" ({row['num_envs']} envs)" if row["num_envs"] and row["num_envs"] > 1 else "")
        each = ", ".join(f"{row['ratios'][n]:.2f}x" if n in row["ratios"] else "—" for n in row["rounds"])
        median = f"{row['median']:.2f}x ({each})" if row["median"] is not None else "—"
        mark = (
            f"hold ({row['differ']:.0%} apart)"
            if row["held"]
            else f"**differ by {row['differ']:.0%}**"
            if row["differ"] is not None
            else "**one reading**"
        )
        ours = " / ".join(sps(row["ours"], n) for n in row["rounds"])
        peer = " / ".join(sps(row["peer"], n) for n in row["rounds"])
        lines.append(f"| `{row['pair']}` | {env} | {ours} | {peer} | {median} | {mark} |")
    return lines + [""]


def alone_markdown(alone):
    """Each twin run alone on the machine (PPO Atari's at 8 envs; --fast: PQN Atari's fast configuration), beside the
    env's ceiling on the same cores (and LeanRL's published figure where it has one)."""
    lines = []
    for twin in (r for r in alone if r.get("kind") == "run"):
        ceiling = next((r for r in alone if r.get("kind") == "ceiling" and (r["env_id"], r["num_envs"]) == (
            twin["env_id"], twin["num_envs"])), None)  # fmt: skip
        sps = twin.get("sps")
        line = (
            f"Alone on the machine ({twin.get('cores')} cores, nothing else on the GPU): `{twin['pair']}` "
            f"{twin['variant']}{' in its fast configuration' if twin.get('fast') else ''}, {twin['env_id']} at "
            f"{twin['num_envs']} envs: "
        ) + (f"{sps:,.0f} steps/s" if sps else f"no steady figure ({twin.get('status')})")
        if ceiling and ceiling.get("sps"):
            line += f"; the env's ceiling on the same cores: {ceiling['sps']:,.0f} steps/s"
            line += f" ({sps / ceiling['sps']:.0%} of it)" if sps else ""
        if twin["pair"] in LEANRL_PUBLISHED and not twin.get("fast"):
            line += f"; LeanRL's published H100 figure: {LEANRL_PUBLISHED[twin['pair']]:,} steps/s"
        lines += [line + ".", ""]
    return lines


GPU_SIDES = {"leanrl-peer": "LeanRL", "sb3": "SB3", "torchrl": "TorchRL"}  # gpu_session.py's peer sides
# gpu_session.py --peers: TorchRL's runs by the variant of ours they run beside (its compile options as our flags)
TORCHRL_VARIANTS = {"eager": "eager", "twin --compile": "compile",
                    "twin --compile --cudagraphs": "compile + cudagraphs"}  # fmt: skip


def gpu_sps(r, brief=False):
    """A GPU table's cell: steps/s over the window, with the seconds to the window unless brief."""
    if r is None:
        return "—"
    to_window = r.get("to_window_s")
    return f"{r['sps']:,.0f}" + (f" ({to_window:.0f} s)" if to_window is not None and not brief else "")


def gpu_ratio(a, b):
    return f"{a['sps'] / b['sps']:.2f}x" if a and b else "—"


def peers_markdown(machine, runs, brief=False):
    """gpu_session.py --peers: per pair, ours (the eager script, the twin) beside SB3's run and TorchRL's (compile
    options off, compile, compile and cudagraphs), with our ratio to each as the CPU table gives it: the eager script
    to SB3's run and to TorchRL's eager one; the twin to SB3's (it has no compile option) and to TorchRL's fastest.
    brief: ours and the ratios (the peers' own figures stay in the full table)."""
    rows = defaultdict(dict)
    for r in runs:
        if r.get("sps"):
            rows[(r["pair"], r["env_id"])][(r["side"], r["variant"])] = r
    if not rows:
        return []
    found = machine.get("peers") or {}
    version = lambda name: found.get(name) or "?"
    lines = [
        f"Beside SB3 {version('stable-baselines3')} and TorchRL {version('torchrl')} (tensordict "
        f"{version('tensordict')}), `gpu_session.py --peers`: ours and theirs in lanes side by side, each lane on its "
        "own cores, all sharing the GPU; their work per env step ours (`benchmarks/peers/README.md`), SB3 on its "
        "default device, TorchRL's sota-implementations with `compile.compile` off and on (then its mode is "
        "reduce-overhead) and with `compile.cudagraphs` too. A peer's window starts where its env steps pass those of "
        "our warm-up.",
        "",
    ]
    torchrl = [f"TorchRL {name}" for name in TORCHRL_VARIANTS.values()]
    head = ["pair", "env", "eager", "twin", *([] if brief else ["SB3", *torchrl])]
    head += ["ours / SB3: eager", "twin", "ours / TorchRL: eager", "twin / its fastest compiled"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    fastest = lambda runs: max((r for r in runs if r), key=lambda r: r["sps"], default=None)
    for (pair, env_id), row in sorted(rows.items()):
        eager = row.get(("leanrl", "eager"))
        twin = fastest(r for (side, variant), r in row.items() if side == "leanrl" and variant != "eager")
        sb3 = row.get(("sb3", "eager"))
        theirs = [row.get(("torchrl", variant)) for variant in TORCHRL_VARIANTS]
        line = [f"`{pair}`", env_id, gpu_sps(eager, brief), gpu_sps(twin, brief)]
        line += [] if brief else [gpu_sps(r) for r in (sb3, *theirs)]
        line += [gpu_ratio(eager, sb3), gpu_ratio(twin, sb3), gpu_ratio(eager, theirs[0])]
        line += [gpu_ratio(twin, fastest(theirs[1:]))]
        lines.append("| " + " | ".join(line) + " |")
    return lines + [""]


def gpu_markdown(records, brief=False, checks=True):
    """One table per session: each env's ceiling, each pair's eager script and twin variants, LeanRL's scripts
    beside them, the ratios; then the checks (recompiles, host syncs) and the runs with no steady window.
    brief: the README's cut, the eager script and the twin with both flags beside LeanRL's, and the ratios.
    checks=False: without the checks table (docs/gpu-checks.md's cut; the archive pages keep it)."""
    out = []
    for machine, runs, ceilings in gpu_sessions(records):
        rounds, alone = [r for r in runs if r.get("round")], [r for r in runs + ceilings if r.get("alone")]
        runs = [r for r in runs if not r.get("round") and not r.get("alone")]
        beside = [r for r in runs if r.get("peers") or r.get("side") in ("sb3", "torchrl")]  # --peers' lanes
        ceilings = [c for c in ceilings if not c.get("alone")]
        stamp = f"{machine['device']} · {machine['cpu']} ({machine['cpu_count']} cores) · torch {machine['torch']}"
        if brief:
            out += [
                f"Measured on **{stamp}**, {machine.get('time', '')[:10]}, by `benchmarks/gpu_session.sh`"
                + (f" at commit `{machine['commit']}`" if machine.get("commit") else "")
                + ": steps/s "
                f"over a steady window after compile and capture, one seed, {len({r.get('lane') for r in runs})} lanes "
                "of runs sharing the GPU (all of it: [docs/gpu-checks.md](docs/gpu-checks.md)).",
                "",
            ]
        else:
            out += [f"### {stamp}", ""]
        if machine.get("time") and not brief:
            out += [
                f"Measured {machine['time'][:10]} by `benchmarks/gpu_session.sh`"
                + (f" at commit `{machine['commit']}`" if machine.get("commit") else "")
                + (" (dry run, CPU: no --compile/--cudagraphs)" if machine.get("dry_run") else "")
                + f"; tensordict {machine.get('tensordict')}, envpool {machine.get('envpool')}, driver "
                f"{machine.get('driver')}"
                + (f", inductor options {machine['inductor']}" if machine.get("inductor") else "")
                + ". Steps/s over a steady window after compile and capture; "
                + (
                    f"{len({r.get('lane') for r in runs})} lanes ran at the same time, each on its own CPU cores, "
                    "sharing the GPU. In brackets: seconds from the start to the window."
                    if runs
                    else "how the runs shared the machine: below."
                ),
                "",
            ]
        if ceilings and not brief:
            out += ["| env ceiling (random actions, no agent) | envs | steps/s |", "|---|---|---|"]
            for c in ceilings:
                sps = f"{c['sps']:,.0f}" if c.get("sps") else "failed"
                out.append(f"| {c['env_id']} ({c['family']}) | {c['num_envs']} | {sps} |")
            out.append("")
        ceiling_of = {(c["env_id"], c["num_envs"]): c.get("sps") for c in ceilings}
        cells = defaultdict(dict)
        for r in runs:
            if r.get("sps") and r not in beside:
                cells[(r["pair"], r["env_id"], r.get("num_envs"))][(r["side"], r["variant"])] = r
        has_peer = any(side != "leanrl" for row in cells.values() for side, _ in row)
        columns = [GPU_COLUMNS[0], GPU_COLUMNS[-1]] if brief else GPU_COLUMNS
        best_twin = "twin" if brief else "best twin"
        head = ["pair", "env", *columns, f"{best_twin} / eager"]
        if has_peer:
            head += ["LeanRL eager", "LeanRL twin" + ("" if brief else " (its flags)"), "ours / LeanRL: eager"]
            head += ["twin" if brief else "twin, same flags"]
        if ceilings:
            head.append(f"{best_twin} / env ceiling")
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] if cells else []
        fmt, ratio = lambda r: gpu_sps(r, brief), gpu_ratio
        for (pair, env_id, num_envs), row in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][2] or 0)):
            ours = {v: row.get(("leanrl", v)) for v in columns}
            twins = [r for v, r in ours.items() if v != "eager" and r]
            best = max(twins, key=lambda r: r["sps"], default=None)
            env = env_id + (f" ({num_envs} envs)" if num_envs and num_envs > 1 else "")
            line = [f"`{pair}`", env, *(fmt(ours[v]) for v in columns), ratio(best, ours["eager"])]
            if has_peer:
                peer_eager = row.get(("leanrl-peer", "eager"))
                peer_twins = [row[("leanrl-peer", v)] for v in reversed(GPU_COLUMNS[1:]) if ("leanrl-peer", v) in row]
                peer_twin = peer_twins[0] if peer_twins else None  # its fastest variant measured: both flags first
                flags = f" {peer_twin['variant'].removeprefix('twin').strip() or 'no flag'}" if peer_twin else ""
                flags = "" if brief and peer_twin and peer_twin["variant"] == GPU_COLUMNS[-1] else flags
                line += [fmt(peer_eager), fmt(peer_twin) + flags, ratio(ours["eager"], peer_eager)]
                line += [ratio(ours.get(peer_twin["variant"]), peer_twin) if peer_twin else "—"]
            if ceilings:
                top = ceiling_of.get((env_id, num_envs))
                line.append(f"{best['sps'] / top:.0%}" if best and top else "—")
            out.append("| " + " | ".join(line) + " |")
        out += [""] if cells else []
        out += peers_markdown(machine, beside, brief)
        out += alone_markdown(alone) + (rounds_markdown(rounds) if rounds else [])
        if brief:
            continue
        checked = [r for r in runs if "recompiles_after" in r or "syncs" in r] if checks else []
        if checked:
            out += ["| twin run | recompiles in warm-up / after | host syncs after the window (script line: count) |"]
            out += ["|---|---|---|"]
            for r in checked:
                syncs = r.get("syncs")
                where = (
                    "not counted"
                    if syncs is None
                    else "none"
                    if not syncs
                    else "; ".join(f"`{k}`: {v}" for k, v in sorted(syncs.items(), key=lambda kv: -kv[1]))
                )
                if syncs is not None:
                    where += f" (over {r.get('sync_iters')} iterations)"
                rec = f"{r.get('recompiles_warmup', '—')} / {r.get('recompiles_after', '—')}"
                side = f"{GPU_SIDES[r['side']]} " if r["side"] in GPU_SIDES else ""
                name = f"{side}`{r['pair']}` {r['variant']} ({r.get('num_envs')})"
                out.append(f"| {name} | {rec} | {where} |")
            out.append("")
        missing = [r for r in runs if not r.get("sps")]
        if missing:
            out += ["Runs without a steady figure:", ""]
            for r in missing:
                why = r.get("status") or "failed"
                tail = " / ".join(r.get("log_tail") or ([r["message"]] if r.get("message") else []))
                tail = " ".join(tail.split())[:300]
                side = f"{GPU_SIDES[r['side']]} " if r.get("side") in GPU_SIDES else ""
                out.append(
                    f"- {side}`{r['pair']}` {r['variant']} ({r['env_id']}): {why}" + (f": {tail}" if tail else "")
                )
            out.append("")
    skipped = [r for r in records if str(r.get("status", "")).startswith("skipped")]
    if skipped and not brief:
        out += ["Not started before the session's deadline: " + ", ".join(r["what"] for r in skipped) + ".", ""]
    return "\n".join(out)


def read_anchors(path=TIME_TO_SCORE):
    """The published end points: [{pair, label, env_id, steps, mean, std, minutes, hardware, source}], the numbers as
    floats (mean and std None where the source gives no return); the file's lines starting with # cite the sources."""
    with open(path) as fh:
        rows = list(csv.DictReader(line for line in fh if not line.startswith("#")))
    for row in rows:
        row["minutes"] = float(row["minutes"])
        row["mean"], row["std"] = (float(row[k]) if row[k] else None for k in ("mean", "std"))
    return rows


def read_time_to_score(paths):
    """benchmarks/time_to_score.py's records in these files, each with its curve under "_curve": [(wall_s, step,
    return, last100_mean)] from the CSV the record names beside the file (empty if it is not there)."""
    records = []
    for path in map(Path, paths):
        for raw in path.read_text().splitlines():
            rec = json.loads(raw) if raw.strip() else {}
            if rec.get("kind") != "time_to_score":
                continue
            curve = path.parent / rec["curve"]
            rows = list(csv.DictReader(curve.open())) if curve.exists() else []
            rec["_curve"] = [(float(r["wall_s"]), int(r["step"]), float(r["return"]), float(r["last100_mean"]))
                             for r in rows]  # fmt: skip
            records.append(rec)
    return records


def machine_of(rec):
    """A time-to-score record's machine: accelerator (or cpu), CPU model, the cores the run could use, torch."""
    m = rec["machine"]
    return f"{m['device']} · {m['cpu']} ({m['cores']} cores) · torch {m['torch']}"


def anchors_of(anchors, rec):
    pair = rec["script"].removesuffix(".py").removesuffix(TWIN_SUFFIX)
    return [a for a in anchors if a["pair"] == pair and a["env_id"] == rec["env_id"]]


def run_of(rec):
    """A time-to-score record's run: our script, or SB3's algorithm at the zoo's settings (time_to_score.py --sb3)."""
    return f"SB3 {rec['sb3_algo'].upper()} (zoo)" if rec.get("sb3_algo") else f"`{rec['script']}`"


def minutes_cell(rec):
    """Minutes from launch to the target (bold), else the last-100 mean when the run stopped, and when."""
    if rec["reached"]:
        return f"**{rec['seconds_to_score'] / 60:.1f}**"
    if rec.get("results") is None:
        return "failed"
    last = rec["last100_at_end"]
    return ("no game" if last is None else fmt_return(last)) + f" at {rec['wall_s_at_end'] / 60:.1f}"


def time_to_score_brief(records, link):
    """The README's cut of the CPU runs beside SB3: a row a task (algorithm, env, target), the minutes of our eager
    script, our twin --compile and SB3 at the zoo's settings (else the mean each had when stopped); every column
    and the curves in `link`."""
    commits = defaultdict(set)
    for rec in records:
        commits[machine_of(rec)].add(f"`{(rec['machine'].get('commit') or 'no commit')[:7]}`")
    # more than three commits: their count (the linked table names each row's)
    stamps = "; ".join(
        f"{machine}, {', '.join(sorted(c)) if len(c) <= 3 else f'{len(c)} commits'}" for machine, c in commits.items()
    )
    out = [
        f"Beside SB3 at rl-baselines3-zoo's settings, on {stamps}: minutes from launch (cold compile included) to the "
        f"target, else the last-100 mean at the stop ([all columns]({link})).",
        "",
        "| algorithm | env, target | ours | our twin --compile | SB3 (zoo) |",
        "|---|---|---|---|---|",
    ]
    tasks = {}
    for rec in records:
        algo = (rec.get("sb3_algo") or rec["script"].removesuffix(".py").removesuffix(TWIN_SUFFIX)).upper()
        algo = algo.replace("_CONTINUOUS_ACTION", "").replace("_", " ")
        side = "sb3" if rec.get("sb3_algo") else "twin" if rec["script"].endswith(TWIN_SUFFIX + ".py") else "eager"
        tasks.setdefault((algo, rec["env_id"], rec["target"]), {})[side] = minutes_cell(rec)
    for (algo, env_id, target), cells in tasks.items():
        row = [algo, f"{env_id}, {target:,g}", *(cells.get(side, "—") for side in ("eager", "twin", "sb3"))]
        out.append("| " + " | ".join(row) + " |")
    return "\n".join(out) + "\n"


def time_to_score_markdown(records, anchors, images=""):
    """The table: per run, the minutes from launch to the target (or the last-100 mean where the deadline stopped
    it), the env steps then, the run's steps/s, and the published whole-run minutes of the same pair; the figure."""
    on_cpu = all(rec["machine"]["device"] == "cpu" for rec in records)  # a CPU's runs: one core each, beside SB3
    out = [
        "`benchmarks/time_to_score.py` (`--sb3 VENV`: SB3 at rl-baselines3-zoo's settings), one pinned core a run: "
        "minutes from launch (cold compile included) until the last-100-games mean reached the target, else that mean "
        "at the stop."
        if on_cpu
        else "`benchmarks/time_to_score.sh`: minutes from launch (compile included) until the last-100-games mean "
        "reached the target, else that mean at the stop; published: whole 10M-step runs "
        "(`plots/published_time_to_score.csv`).",
        "",
        "| script | machine | minutes to the score | steps then | steps/s | published, min |",
        "|---|---|---|---|---|---|",
    ]
    for rec in records:
        m = rec["machine"]
        commit = f", `{m['commit'][:7]}`" if m.get("commit") else ""
        where = f"{m['device']}, {m['cores']} cores, torch {m['torch']}{commit}"
        if rec["reached"]:
            got, steps = f"**{rec['seconds_to_score'] / 60:.1f}** (target {rec['target']:g})", rec["steps_at_score"]
        elif rec.get("results") is None:  # the script wrote no results line: it failed, its log says why
            got, steps = f"failed (exit {rec.get('exit_code')}, no results line)", rec["steps_at_end"]
        else:
            last = rec["last100_at_end"]
            got = "not reached: " + ("no game" if last is None else f"{fmt_return(last)}")
            got += f" at {rec['wall_s_at_end'] / 60:.1f} min (target {rec['target']:g})"
            steps = rec["steps_at_end"]
        sps = (rec.get("results") or {}).get("sps")
        published = "; ".join(f"{a['label']}: {a['minutes']:g}" for a in anchors_of(anchors, rec)) or "—"
        row = [run_of(rec), where, got, f"{steps:,}", "—" if sps is None else f"{sps:,.0f}", published]
        out.append("| " + " | ".join(row) + " |")
    for machine in dict.fromkeys(map(machine_of, records)):
        out.append(f"\n![last-100 mean against wall-clock minutes]({images}time_to_score_{slug(machine)}.png)")
    return "\n".join(out) + "\n"


def plot_time_to_score(machine, records, anchors, path):
    """The last-100 mean against wall-clock minutes from launch (log scale), each run's target dashed, beside the
    published end points: a marker at (minutes, return ± std), a dotted line where the source gives no return."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.6), layout="constrained")
    for i, rec in enumerate(records):
        curve = rec["_curve"]
        label = run_of(rec).strip("`") + (" (dry run)" if rec.get("dry_run") else "")
        if curve:
            ax.plot([max(w, 1.0) / 60 for w, *_ in curve], [c[3] for c in curve], color=f"C{i}", lw=1.4, label=label)
        ax.axhline(rec["target"], color=f"C{i}", lw=0.8, ls="--")
        if rec["reached"]:
            ax.plot(rec["seconds_to_score"] / 60, rec["mean_at_score"], "o", color=f"C{i}", ms=6)
    shown = {a["label"]: a for rec in records for a in anchors_of(anchors, rec)}
    for j, a in enumerate(shown.values()):
        color = f"C{len(records) + j}"
        text = f"{a['label']}, {a['minutes']:g} min" + (f" ({a['hardware']})" if a["hardware"] else "")
        if a["mean"] is None:
            ax.axvline(a["minutes"], color=color, ls=":", lw=1.2, label=text + ", no return published")
        else:
            ax.errorbar(a["minutes"], a["mean"], yerr=a["std"], fmt="s", color=color, capsize=3, label=text)
    ax.set_xscale("log")
    ax.set_xlabel("wall-clock minutes from launch (log scale)", fontsize=8)
    ax.set_ylabel("mean return of the last 100 games", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left")
    env = ", ".join(dict.fromkeys(rec["env_id"] for rec in records))
    fig.suptitle(f"{machine}\n{env}: time to score (dashed: target; dot: reached), beside published whole runs",
                 fontsize=8)  # fmt: skip
    fig.savefig(path, dpi=110)
    plt.close(fig)


def read_seed_curves(run_dir):
    """A --num-seeds run's returns.csv (step,wall_s,return,seed): {seed: ([steps], [last-100 means])}, each seed's
    mean of its last up to 100 episodes after each of its episodes."""
    games = defaultdict(list)
    with open(Path(run_dir) / "returns.csv") as f:
        for row in csv.DictReader(f):
            games[int(row["seed"])].append((int(row["step"]), float(row["return"])))
    curves = {}
    for seed, rows in sorted(games.items()):
        returns = [r for _, r in rows]
        means = [statistics.fmean(returns[max(0, i - 99) : i + 1]) for i in range(len(returns))]
        curves[seed] = ([step for step, _ in rows], means)
    return curves


def mean_over_seeds(curves, grid):
    """The mean over seeds of each seed's last-100 mean at each step of grid (a seed's last value at or before the
    step; a seed with no episode yet is left out of that step's mean, a step no seed reached is None)."""
    import numpy as np

    out = []
    for step in grid:
        at = [means[i - 1] for steps, means in curves.values() if (i := int(np.searchsorted(steps, step, "right")))]
        out.append(statistics.fmean(at) if at else None)
    return out


def plot_seeds(run_dir, path, solved_at=None, title=""):
    """Every seed's last-100 mean against env steps (thin), their mean over seeds (bold), solved_at dashed."""
    plt = pyplot()
    curves = read_seed_curves(run_dir)
    fig, ax = plt.subplots(figsize=(8, 4.6), layout="constrained")
    for steps, means in curves.values():
        ax.plot(steps, means, color="C0", lw=0.6, alpha=max(0.08, min(0.6, 8 / len(curves))))
    last = max(steps[-1] for steps, _ in curves.values() if steps)
    grid = [last * (i + 1) / 200 for i in range(200)]
    mean = mean_over_seeds(curves, grid)
    ax.plot([g for g, m in zip(grid, mean) if m is not None], [m for m in mean if m is not None], color="C3", lw=2,
            label=f"mean over {len(curves)} seeds")  # fmt: skip
    if solved_at is not None:
        ax.axhline(solved_at, color="k", lw=0.8, ls="--", label=f"solved ({solved_at:g})")
    ax.set_xlabel("env steps (each agent's)", fontsize=8)
    ax.set_ylabel("mean return of the last 100 episodes", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(title or Path(run_dir).name, fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def many_agents_markdown(lines):
    """--many-agents: a row per run (a --num-seeds run or a one-seed script beside it): its wall time, each agent's
    steps, the last-100 mean (over seeds: their mean ± std and interquartile mean) and the fraction of seeds at the
    env's solved mark, stamped with each machine and commit."""
    stamps = sorted({f"{hardware_of(line)}, `{(line.get('commit') or 'no commit')[:7]}`" for line in lines})
    out = [f"Measured on {'; '.join(stamps)} ([runs](plots/many-agents/results.jsonl)): wall time, compile included; "
           "the mean of each seed's last 100 episodes.", "",
           "| run | wall time | steps an agent | last-100 mean | seeds at the mark |",
           "|---|---|---|---|---|"]  # fmt: skip
    for line in lines:
        seeds, agg = (line.get("seeds") or {}).get("seed", [line["seed"]]), line.get("aggregate") or {}
        run = f"`{line['script']}`" + (" --compile" if line.get("compile") else "")
        run += f" --num-seeds {len(seeds)}" if len(seeds) > 1 else ", one seed"
        if len(seeds) > 1 and agg.get("mean") is not None:
            mean = f"{fmt_return(agg['mean'], agg['std'])}, IQM {fmt_return(agg['iqm'])}"
            solved = f"{agg['solved']:.0%} at {agg['solved_at']:g}"
        else:
            mean, solved = ("—" if line["mean_return"] is None else fmt_return(line["mean_return"])), "—"
        out.append(f"| {run} | {line['wall_s']:.0f} s | {line['steps']:,} | {mean} | {solved} |")
    return "\n".join(out) + "\n"


def seeds_main(args):
    """--seeds: a PNG of every seed's curve with their mean for each run folder, stamped with the run's hardware from
    its results line (in the results file beside the folder)."""
    for run_dir in map(Path, args.seeds):
        results = run_dir.parent / "results.jsonl"
        lines = [json.loads(raw) for raw in results.read_text().splitlines() if raw.strip()] if results.exists() else []
        line = next((x for x in lines if x.get("run_name") == run_dir.name), None)
        title, solved_at = run_dir.name, None
        if line is not None:
            agg = line.get("aggregate") or {}
            solved_at = agg.get("solved_at")
            solved = "n/a" if agg.get("solved") is None else f"{agg['solved']:.0%}"
            title = f"{hardware_of(line)}\n{line['script']} {line['env_id']}: {agg.get('num_seeds')} seeds, {solved} "
            title += f"at {solved_at} at the end, mean {fmt_return(agg.get('mean') or float('nan'))}"
        out = Path(args.out or run_dir)
        out.mkdir(parents=True, exist_ok=True)
        png = out / f"seeds_{slug(run_dir.name)}.png"
        plot_seeds(run_dir, png, solved_at, title)
        print(f"plot.py: wrote {png}")


def time_to_score_main(args):
    """--time-to-score: the table (printed, OUT/time_to_score.md) and a figure per machine; --publish splices the
    table into the README (time-to-score markers) and copies the figures into --plots-dir."""
    records = read_time_to_score(args.time_to_score)
    if not records:
        raise SystemExit(f"plot.py: error: no time_to_score records in {' '.join(args.time_to_score)}")
    anchors = read_anchors(args.anchors)
    out = Path(args.out or Path(args.time_to_score[0]).parent)
    out.mkdir(parents=True, exist_ok=True)
    by_machine = defaultdict(list)
    for rec in records:
        by_machine[machine_of(rec)].append(rec)
    pngs = [f"time_to_score_{slug(machine)}.png" for machine in by_machine]
    for png, (machine, recs) in zip(pngs, by_machine.items()):
        plot_time_to_score(machine, recs, anchors, out / png)
    (out / "time_to_score.md").write_text(time_to_score_markdown(records, anchors))
    print(time_to_score_markdown(records, anchors))
    print(f"plot.py: wrote {out / 'time_to_score.md'} and {', '.join(pngs)} in {out}")
    if args.publish:
        dry = [rec["script"] for rec in records if rec.get("dry_run")]
        commits = [rec["machine"].get("commit") or "" for rec in records]
        dirty = [commit for commit in commits if "uncommitted" in commit]
        if dry or dirty:  # a published figure is a real run's, and names the commit that measured it
            why = f"{dry[0]} was a dry run (a smoke, not a result)" if dry else f"a run measured {dirty[0]}"
            print(f"plot.py: error: {why}: not published", file=sys.stderr)
            raise SystemExit(2)
        readme = Path(args.readme or ROOT / "README.md")
        plots_dir = Path(args.plots_dir)
        images = Path(os.path.relpath(plots_dir, readme.resolve().parent)).as_posix() + "/"
        # a GPU's runs: the whole table; a CPU's (beside SB3): the cut, the whole table in plots_dir
        gpu = [rec for rec in records if rec["machine"]["device"] != "cpu"]
        cpu = [rec for rec in records if rec["machine"]["device"] == "cpu"]
        text = readme.read_text()
        if gpu:
            text = splice(text, "time-to-score", time_to_score_markdown(gpu, anchors, images))
        if cpu:
            text = splice(text, "time-to-score-cpu", time_to_score_brief(cpu, images + "time_to_score_cpu.md"))
        publish_files(out, plots_dir, pngs)
        if cpu:
            (plots_dir / "time_to_score_cpu.md").write_text(time_to_score_markdown(cpu, anchors))
        readme.write_text(text)
        print(f"plot.py: published: {readme} (time-to-score) and {', '.join(pngs)} in {plots_dir}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--results", nargs="+", help="results files the scripts wrote (default runs/results.jsonl, none with --rl-ops)"
    )
    parser.add_argument("--out", help="folder for the table and the PNGs (default: the first results file's folder)")
    parser.add_argument(
        "--learning",
        action="store_true",
        help="the runs are ./run.sh --learning's: write returns.md (the returns beside CleanRL's published ones) and "
        "learning_*.png instead of the speed table and charts",
    )
    parser.add_argument(
        "--publish",
        action="store_true",
        help="also splice the table into --readme (speed-table or returns-table markers) and copy it and its PNGs "
        "into --plots-dir: the only way this script changes the repository's README and plots",
    )
    parser.add_argument(
        "--part",
        help="--learning: these runs are one part of the returns section, published beside the others (markers "
        "returns-table-PART, returns_PART.md, learning_PART_*.png) instead of replacing the main table",
    )
    parser.add_argument(
        "--readme",
        help="file that --publish splices into (default: README.md; a speed table: docs/cpu-speed.md, the README's "
        "speed section holding the GPU session's and the steady-state tables)",
    )
    parser.add_argument("--plots-dir", default=str(ROOT / "plots"), help="where --publish copies table and PNGs")
    parser.add_argument("--published", default=str(PUBLISHED), help="CleanRL's returns (csv, --learning)")
    parser.add_argument("--rl-ops", help="markdown table written by benchmarks/bench_rl_operators.py to splice in")
    parser.add_argument("--replay", help="markdown table written by benchmarks/replay.py to splice in")
    parser.add_argument(
        "--steady",
        nargs="+",
        help="markdown tables written by benchmarks/steady.py to splice into --readme: the whole table, then any "
        "re-measures of some of its scripts (their rows replace the same scripts' rows)",
    )
    parser.add_argument(
        "--steady-publish",
        help="a table of benchmarks/steady.py to publish (run.sh --steady --publish): it replaces "
        "benchmarks/results/steady_cpu.md if it has every script of ours that one has, else it goes beside it as a "
        "re-measure, steady_cpu_<scripts>.md; then --steady with them all",
    )
    parser.add_argument(
        "--gpu",
        nargs="+",
        help="results.jsonl files of benchmarks/gpu_session.sh (or GPU results lines): print one table per machine, "
        "and with --out write it to OUT/gpu.md",
    )
    parser.add_argument(
        "--time-to-score",
        nargs="+",
        help="time_to_score.jsonl files of benchmarks/time_to_score.py: the table (OUT/time_to_score.md) and the "
        "last-100 mean against wall-clock minutes beside the published end points (time_to_score_<machine>.png)",
    )
    parser.add_argument("--anchors", default=str(TIME_TO_SCORE), help="published whole-run times (--time-to-score)")
    parser.add_argument(
        "--benchmarks-readme",
        default=str(ROOT / "benchmarks" / "README.md"),
        help="README to splice the --rl-ops and --replay tables into",
    )
    parser.add_argument("--seeds", nargs="+", help="run folders of --num-seeds runs: every seed's last-100 mean and "
                        "their mean against steps (OUT or the folder: seeds_<run>.png)")  # fmt: skip
    parser.add_argument("--many-agents", nargs="+", help="results files of --num-seeds runs and one-seed runs "
                        "beside them: the table (printed; --publish: into the many-agents markers)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.steady_publish:
        args.steady = publish_steady(Path(args.steady_publish), ROOT / "benchmarks" / "results")
    if args.seeds:
        return seeds_main(args)
    if args.many_agents:
        table = many_agents_markdown([line for path in args.many_agents for line in read_results(path)])
        print(table)
        if args.publish:
            readme = Path(args.readme or ROOT / "README.md")
            readme.write_text(splice(readme.read_text(), "many-agents", table))
            print(f"plot.py: published: {readme} (many-agents)")
        return
    if args.time_to_score:
        return time_to_score_main(args)
    if args.gpu:
        records = [json.loads(raw) for path in args.gpu for raw in Path(path).read_text().splitlines() if raw.strip()]
        table = gpu_markdown(records)
        print(table)
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / "gpu.md").write_text(table)
        if args.publish:  # the README's cut, between its gpu-table markers
            commits = [r.get("commit") or "" for r in records if r.get("kind") == "machine"]
            dirty = [commit for commit in commits if "uncommitted" in commit]
            if dirty:  # a published figure names the commit that measured it
                print(f"plot.py: error: the GPU session measured {dirty[0]}: commit, rerun, publish", file=sys.stderr)
                raise SystemExit(2)
            readme = Path(args.readme or ROOT / "README.md")
            text = readme.read_text()
            if "<!-- gpu-sessions:start -->" in text:  # docs/gpu-checks.md: every session, without the checks
                text, marker = splice(text, "gpu-sessions", gpu_markdown(records, checks=False)), "gpu-sessions"
            else:  # the README: its brief cut
                text, marker = splice(text, "gpu-table", gpu_markdown(records, brief=True)), "gpu-table"
            readme.write_text(text)
            print(f"plot.py: published: {readme} ({marker})")
        return
    if args.part is not None and not (args.learning and re.fullmatch(r"[a-z0-9]+", args.part)):
        parser.error("--part goes with --learning and is a word of lowercase letters and digits")
    benchmarks = {"rl-ops": args.rl_ops, "replay": args.replay}
    if args.results is None:
        args.results = [] if any(benchmarks.values()) or args.steady else ["runs/results.jsonl"]

    present = [path for path in args.results if Path(path).exists()]
    if present:
        lines = [line for path in present for line in read_results(path)]
        tables = group_runs(lines, by_budget=args.learning)
        if not tables:
            raise SystemExit(f"plot.py: error: no finished training runs in {' '.join(present)}")
        out = Path(args.out or Path(present[0]).parent)
        out.mkdir(parents=True, exist_ok=True)
        failures = failed_runs(lines)
        if args.learning:
            part = f"_{args.part}" if args.part else ""
            marker, name, png = f"returns-table{part.replace('_', '-')}", f"returns{part}.md", f"learning{part}"
            published = read_published(args.published)
            table = lambda images: returns_markdown(tables, failures, published, images, png, bool(part))
            pngs = [f"{png}_{slug(hardware)}.png" for hardware in tables]
            for hardware, rows in tables.items():
                plot_returns(hardware, rows, out / f"{png}_{slug(hardware)}.png", "returns at full budget")
        else:
            marker, name = "speed-table", "speed.md"
            table = lambda images: speed_markdown(tables, failures, images, returns=not images)
            pngs = []
            for hardware, rows in tables.items():
                pngs += [f"speed_{slug(hardware)}.png", f"returns_{slug(hardware)}.png"]
                plot_speed(hardware, rows, out / pngs[-2])
                plot_returns(hardware, rows, out / pngs[-1])
        (out / name).write_text(table(""))
        print(table(""))
        print(f"plot.py: wrote {out / name} and {', '.join(pngs)} in {out}")
        if args.publish:
            dirty = [c for rows in tables.values() for c in commits_of(rows) if "uncommitted" in c]
            if dirty:  # a published figure names the commit that measured it
                print(f"plot.py: error: runs of this table ran at {dirty[0]}: commit, rerun, publish", file=sys.stderr)
                raise SystemExit(2)
            readme = Path(args.readme or ROOT / ("README.md" if args.learning else "docs/cpu-speed.md"))
            plots_dir = Path(args.plots_dir)
            images = Path(os.path.relpath(plots_dir, readme.resolve().parent)).as_posix() + "/"
            text = readme.read_text() if readme.exists() else ""
            if args.part and f"<!-- {marker}:start -->" not in text:  # a part the README links, not splices: its file
                publish_files(out, plots_dir, [name, *pngs])
                print(f"plot.py: published: {name} and the PNGs in {plots_dir} ({readme} links them)")
                return
            text = splice(text, marker, table(images))
            publish_files(out, plots_dir, [name, *pngs])
            readme.write_text(text)
            print(f"plot.py: published: {readme} ({marker}), {name} and the PNGs in {plots_dir}")
    elif not any(benchmarks.values()) and not args.steady:
        raise SystemExit(f"plot.py: error: no results file at {' '.join(args.results)} (run ./run.sh first)")
    if any(benchmarks.values()):  # the benchmark tables live in benchmarks/README.md, their brief cuts
        bench_readme = Path(args.benchmarks_readme)
        bench_text = bench_readme.read_text()
        briefs = {"rl-ops": rl_ops_brief, "replay": replay_brief}
        for marker, table in benchmarks.items():
            if table:
                link = Path(os.path.relpath(Path(table).resolve(), bench_readme.resolve().parent)).as_posix()
                bench_text = splice(bench_text, marker, briefs[marker](Path(table).read_text(), link))
        bench_readme.write_text(bench_text)
    if args.steady:  # the steady-state speed and compile times of the eager scripts and compiled twins
        tables = [Path(path) for path in args.steady]
        for path in tables:
            if "uncommitted changes" in path.read_text():  # a published figure names the commit that measured it
                print(
                    f"plot.py: error: {path} was measured on uncommitted changes: commit, rerun, publish",
                    file=sys.stderr,
                )
                raise SystemExit(2)
        readmes = [Path(args.readme)] if args.readme else [ROOT / "README.md", ROOT / "docs" / "cpu-speed.md"]
        for readme in readmes:  # by default the README's cut and docs/cpu-speed.md's, the same table
            if not args.readme and (not readme.exists() or "<!-- steady-table:start -->" not in readme.read_text()):
                continue
            links = [Path(os.path.relpath(path.resolve(), readme.resolve().parent)).as_posix() for path in tables]
            parts = [(path.read_text(), link) for path, link in zip(tables[1:], links[1:])]
            brief = steady_brief(tables[0].read_text(), links[0], parts)
            readme.write_text(splice(readme.read_text(), "steady-table", brief))
            print(f"plot.py: published: {readme} (steady-table)")


if __name__ == "__main__":
    main()
