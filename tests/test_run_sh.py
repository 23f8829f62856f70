"""run.sh and plots/plot.py: bad input creates nothing, a run leaves the repository as it was (only --publish
splices the README and replaces plots/), the speed-up chart and the binned return curves, the returns table beside
CleanRL's published figures, and the published figures copied into the repository with their source."""

import csv
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, load_script

plot = load_script("plots/plot.py")

PAIRS = [
    "ppo",
    "ppo_atari_envpool",
    "ppo_continuous_action",
    "dqn",
    "dqn_atari_envpool",
    "sac_continuous_action",
    "td3_continuous_action",
    "r2d2_atari_envpool",
    "pqn",
    "pqn_atari_envpool",
]
HW = {"device": "cpu", "cpu": "Test CPU", "cpu_count": 2, "torch": "2.13.0", "commit": "abc1234"}
ANCHORS = ROOT.parent / "shared" / "anchors"
PUBLISHED_PARTS = sorted((ROOT / "benchmarks" / "results").glob("steady_cpu_*.md"))  # re-measures of some pairs


def run_sh(*args, timeout=60, root=ROOT, python=sys.executable):
    # the scripts import leanrl: the one beside them (the installed one is the checkout's, not a copy's)
    path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHON=str(python), PYTHONPATH=path)
    return subprocess.run(
        ["bash", str(root / "run.sh"), *args], cwd=root, env=env, capture_output=True, text=True, timeout=timeout
    )


# ---------------------------------------------------------------- run.sh


def test_only_with_a_typo_names_the_valid_pairs_and_creates_nothing(tmp_path):
    out = tmp_path / "results"
    proc = run_sh("--only", "dqnn", "--results-dir", str(out))
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert "'dqnn'" in line and all(pair in line for pair in PAIRS) and "ppo_atari_envpool_distributed" in line
    assert not out.exists()


@pytest.mark.parametrize(
    "args,message",
    [
        (["--timesteps", "1e5"], "--timesteps must be a positive integer"),
        (["--seeds", "one"], "--seeds takes integers"),
        (["--only"], "--only needs a value"),
        (["--no-plot", "--publish"], "--publish needs the plots"),
        (["--quick", "--learning"], "--quick and --learning"),
        (["--learning", "--only", "ppo_atari_envpool_distributed"], "valid pairs"),
        (["--fast"], "unknown option '--fast'"),
        (["--rounds", "2"], "--rounds, --base and --peer go with --steady"),
        (["--peer", "/nonexistent"], "--rounds, --base and --peer go with --steady"),
        (["--steady", "--peer", "/nonexistent"], "--peer /nonexistent has no leanrl/ folder"),
        (["--steady", "--peer"], "--peer needs a value"),
        (["--steady", "--rounds", "0"], "--rounds must be a positive integer"),
        (["--steady", "--base", "/nonexistent"], "not a leanrl checkout"),
        (["--steady", "--learning"], "--steady and --learning"),
        (["--steady", "--only", "ppo_atari_envpool_distributed"], "valid pairs"),
    ],
)
def test_bad_options_get_one_line_and_exit_2_before_anything_is_created(args, message, tmp_path):
    out = tmp_path / "results"
    proc = run_sh(*args) if args[-1] in ("--only", "--peer") else run_sh(*args, "--results-dir", str(out))
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and message in proc.stderr, proc.stderr
    assert not out.exists()


def test_help_documents_publish_and_the_learning_budgets():
    proc = run_sh("--help")
    assert proc.returncode == 0 and proc.stderr == ""
    text = proc.stdout
    assert "--publish" in text and "README.md" in text and "plots/" in text
    assert "--learning" in text and "HalfCheetah-v4" in text and "1M" in text and "CartPole-v1 500k" in text
    assert "an hour" in text  # the budgets that are not CleanRL's full ones, and why
    for pair in PAIRS:
        assert pair in text


def git(*args, cwd):
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


def fingerprint(root):
    """git status, and the bytes of what a run must never change: the README and the committed plots."""
    files = [root / "README.md", *sorted((root / "plots").iterdir())]
    status = git("status", "--porcelain", "--untracked-files=all", cwd=root)
    return status, {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files if p.is_file()}


# a results line as a script writes it (the fields plot.py reads)
STRAY = dict(
    script="dqn.py", env_id="CartPole-v1", seed=1, compile=False, cudagraphs=False, device="cpu", cpu="CPU",
    cpu_count=2, torch="2.13.0", run_name="x", mode="train", total_timesteps=600, steps=600, sps=100.0, wall_s=6.0,
    mean_return=20.0, episodes=10, status="ok", losses={}, message=None,
)  # fmt: skip


@pytest.fixture
def checkout(tmp_path):
    """A copy of this checkout (its .git, tracked and untracked files, none that git ignores): run.sh runs there, so
    the comparison of git status before and after sees run.sh's doing only, not the edits of someone working in the
    checkout meanwhile."""
    if not (ROOT / ".git").is_dir():
        pytest.skip("not a git checkout with its own .git folder")
    copy = tmp_path / "checkout"
    shutil.copytree(ROOT / ".git", copy / ".git")
    for name in filter(None, git("ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=ROOT).split("\0")):
        if (ROOT / name).is_file():  # a tracked file deleted in the working tree is listed too
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    return copy


def test_a_run_writes_its_tables_and_plots_into_its_results_dir_and_leaves_the_repository_alone(checkout, tmp_path):
    """The eager DQN, its twin and the twin --compile for 600 steps, then --learning's eager and twin --compile
    (40 s in all on an idle 2-core CPU, 2 min beside other jobs; most of it compiling). The first goes into the
    new folder run.sh makes by default: a script run by hand earlier (its line in runs/results.jsonl, where the
    scripts write by default) stays out of its tables."""
    before = fingerprint(checkout)
    stray = dict(STRAY, script="ppo_continuous_action.py", env_id="HalfCheetah-v4", status="interrupted")
    (checkout / "runs").mkdir()
    (checkout / "runs" / "results.jsonl").write_text(json.dumps(stray) + "\n")
    tiny = ["--only", "dqn", "--timesteps", "600", "--seeds", "1"]
    extra = ["--extra", "--learning-starts 100 --measure-burnin 10"]  # DQN's learning starts at 10k by default
    proc = run_sh(*tiny, *extra, timeout=600, root=checkout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert fingerprint(checkout) == before, "run.sh without --publish changed the repository"
    (out,) = [path for path in (checkout / "runs").iterdir() if path.is_dir()]
    assert re.fullmatch(r"speed-\d{8}-\d{6}", out.name), out.name
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(line["script"], line["compile"], line["status"]) for line in lines] == [
        ("dqn.py", False, "ok"),
        ("dqn_torchcompile.py", False, "ok"),
        ("dqn_torchcompile.py", True, "ok"),
    ]
    assert all(line["total_timesteps"] == 600 for line in lines)
    speed = (out / "speed.md").read_text()
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert [name.split("_")[0] for name in pngs] == ["returns", "speed"]
    for name in pngs:  # the table links its charts beside it
        assert f"]({name})" in speed and (out / name).stat().st_size > 10_000
    assert "`dqn`" in speed and "./run.sh --only dqn --timesteps 600 --seeds 1 --extra --learning-starts\\ 100" in speed
    assert "ppo_continuous" not in speed and "interrupted" not in speed  # the stray line stayed out

    # --learning: the eager script and the fastest twin, and the returns table beside CleanRL's
    out = tmp_path / "learning"
    proc = run_sh("--learning", *tiny, *extra, "--results-dir", str(out), timeout=600, root=checkout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert fingerprint(checkout) == before, "run.sh --learning without --publish changed the repository"
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(line["script"], line["compile"], line["status"]) for line in lines] == [
        ("dqn.py", False, "ok"),
        ("dqn_torchcompile.py", True, "ok"),
    ]
    returns = (out / "returns.md").read_text()
    assert "| `dqn` | CartPole-v1 | 600 |" in returns and "| — (488.7 ± 16.1 at 500k) |" in returns
    assert [p.name.split("_")[0] for p in out.glob("*.png")] == ["learning"] and "](learning_" in returns


FAKE_PYTHON = """#!{python}
import json, os, sys
if sys.argv[1:2] == ["benchmarks/steady.py"]:  # note what run.sh asks the harness for, write a table as it would
    args = sys.argv[2:]
    json.dump(args, open(os.environ["STEADY_ARGS"], "w"))
    with open(os.path.join(args[args.index("--out") + 1], "steady.md"), "w") as f:
        f.write("the steady table\\n")
else:
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
"""


def test_steady_runs_the_harness_on_each_pairs_eager_script_and_compiled_twin_at_quick_budgets(tmp_path, monkeypatch):
    """run.sh --steady with a stand-in python that records the harness's arguments (test_steady.py runs the harness)."""
    clone = tmp_path / "clone"  # run.sh and plot.py: --publish copies the table into this clone's benchmarks/results
    (clone / "benchmarks" / "results").mkdir(parents=True)
    (clone / "plots").mkdir()
    shutil.copy2(ROOT / "run.sh", clone / "run.sh")
    shutil.copy2(ROOT / "plots" / "plot.py", clone / "plots" / "plot.py")
    (clone / "README.md").write_text("<!-- steady-table:start -->\nold\n<!-- steady-table:end -->\n")
    base, peer = tmp_path / "base", tmp_path / "peer"
    (base / "leanrl").mkdir(parents=True)
    (peer / "leanrl").mkdir(parents=True)
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON.format(python=sys.executable))
    python.chmod(0o755)
    monkeypatch.setenv("STEADY_ARGS", str(tmp_path / "args.json"))
    out = tmp_path / "out"
    flags = ["--steady", "--only", "dqn", "--timesteps", "5000", "--extra", "--learning-starts 100", "--rounds", "2"]
    others = ["--base", str(base), "--peer", str(peer)]
    proc = run_sh(*flags, *others, "--results-dir", str(out), "--publish", root=clone, python=python)
    assert proc.returncode == 0, proc.stderr
    args = json.loads((tmp_path / "args.json").read_text())
    options = {
        args[i]: args[i + 1] for i in range(len(args) - 1) if args[i] in ("--rounds", "--cpu", "--out", "--peer")
    }
    core = str(max(os.sched_getaffinity(0)))
    assert options == {"--rounds": "2", "--cpu": core, "--out": str(out), "--peer": str(peer)}
    sides = [args[i + 1] for i, a in enumerate(args) if a == "--side"]
    assert sides == [f"base={base}", f"new={clone}"] and "--cold" in args
    runs = [" ".join(args[i + 1].split()) for i, a in enumerate(args) if a == "--run"]
    quick = "--total-timesteps 5000 --measure-burnin 1000 --learning-starts 100"  # dqn's --quick budget, changed
    assert runs == [f"leanrl/dqn.py {quick}", f"leanrl/dqn_torchcompile.py {quick} --compile"]
    assert args[args.index("--command") + 1].startswith("./run.sh --steady --only dqn")
    assert (clone / "benchmarks" / "results" / "steady_cpu.md").read_text() == "the steady table\n"
    assert "\nthe steady table\n" in (clone / "README.md").read_text()  # no peer side: the cut is the table
    # PPO's steady budgets are longer than its --quick ones (3 iterations): 11 and 19 steady iterations
    proc = run_sh("--steady", "--only", "ppo_atari_envpool ppo_continuous_action", "--results-dir", str(out),
                  root=clone, python=python)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    args = json.loads((tmp_path / "args.json").read_text())
    runs = [" ".join(args[i + 1].split()) for i, a in enumerate(args) if a == "--run"]
    atari, continuous = "--total-timesteps 12288 --measure-burnin 1", "--total-timesteps 40960 --measure-burnin 1"
    assert runs == [
        f"leanrl/ppo_atari_envpool.py {atari}", f"leanrl/ppo_atari_envpool_torchcompile.py {atari} --compile",
        f"leanrl/ppo_continuous_action.py {continuous}",
        f"leanrl/ppo_continuous_action_torchcompile.py {continuous} --compile",
    ]  # fmt: skip


# ---------------------------------------------------------------- plot.py: synthetic results


def line(script, sps, seed=1, compile=False, env_id="CartPole-v1", total=1000, mean_return=2.0, **extra):
    run_name = f"{script}-{seed}-{compile}-{total}"
    return {
        "script": script,
        "env_id": env_id,
        "seed": seed,
        "compile": compile,
        "cudagraphs": False,
        **HW,
        "run_name": run_name,
        "mode": "train",
        "total_timesteps": total,
        "steps": total,
        "sps": sps,
        "wall_s": 120.0,
        "mean_return": mean_return,
        "episodes": 10,
        "status": "ok",
        **extra,
    }


def write_results(folder, lines, command, curves=True):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (folder / "command.txt").write_text(command + "\n")
    for n, x in enumerate(lines):
        if curves:
            (folder / x["run_name"]).mkdir(exist_ok=True)
            steps = [x["total_timesteps"] * k / 20 for k in range(1, 21) if not 8 <= k <= 12]  # a gap in the middle
            rows = [f"{s:.0f},{s / x['sps']:.2f},{10 + s / 100 + n}" for s in steps]
            (folder / x["run_name"] / "returns.csv").write_text("step,wall_s,return\n" + "\n".join(rows) + "\n")
    return folder / "results.jsonl"


def cells_of(sps_by_variant):
    return {variant: plot.Cell(sps=list(sps)) for variant, sps in sps_by_variant.items()}


def test_speedups_are_over_each_pairs_eager_script():
    ratios = plot.speedups(cells_of({"twin --compile": [300.0, 500.0], "eager": [100.0, 300.0], "twin": [200.0]}))
    assert list(ratios) == ["eager", "twin", "twin --compile"]  # in the order of the variants
    assert ratios["eager"] == (1.0, 200.0, pytest.approx(141.42, abs=0.01))
    assert ratios["twin"] == (1.0, 200.0, 0.0)
    assert ratios["twin --compile"][:2] == (2.0, 400.0)
    assert plot.speedups(cells_of({"twin --compile": [70.0]})) == {"twin --compile": (None, 70.0, 0.0)}


def test_return_curves_are_binned_by_steps_and_gaps_stay_gaps():
    import numpy as np

    edges = np.array([0.0, 10, 20, 30, 40])
    seed1 = ([1, 5, 12, 35], [1.0, 3.0, 10.0, 30.0])  # nothing ends in [20, 30) in either seed
    seed2 = ([3, 38, 40], [5.0, 20.0, 40.0])  # 40, the last edge, is in the last bin
    np.testing.assert_allclose(plot.bin_mean(*seed1, edges), [2.0, 10.0, np.nan, 30.0])
    np.testing.assert_allclose(plot.bin_mean(*seed2, edges), [5.0, np.nan, np.nan, 30.0])
    x, mean, lo, hi = plot.mean_band([seed1, seed2], edges)
    np.testing.assert_allclose(x, [5, 15, 25, 35])
    np.testing.assert_allclose(mean, [3.5, 10.0, np.nan, 30.0])  # bin 1: the one seed that ended an episode there
    np.testing.assert_allclose(lo, [2.0, 10.0, np.nan, 30.0])
    np.testing.assert_allclose(hi, [5.0, 10.0, np.nan, 30.0])
    edges = plot.bin_edges([seed1, seed2])
    # 5 bins at least, from the first x to the shortest curve's end (seed1's 35: no bin averages fewer seeds there)
    assert edges[0] == 1 and edges[-1] == 35 and len(edges) == 6


def readme_with_markers(path):
    path.write_text(
        "# x\n<!-- speed-table:start -->\nold speed\n<!-- speed-table:end -->\n"
        "<!-- returns-table:start -->\nold returns\n<!-- returns-table:end -->\n"
    )
    return path.read_text()


def test_publish_is_the_only_way_the_readme_and_plots_change(tmp_path):
    lines = [line("dqn.py", 100.0), line("dqn_torchcompile.py", 150.0, compile=True)]
    results = write_results(tmp_path / "runs", lines, "./run.sh --quick")
    readme, plots_dir = tmp_path / "README.md", tmp_path / "plots"
    original = readme_with_markers(readme)
    where = ["--readme", str(readme), "--plots-dir", str(plots_dir)]
    plot.main(["--results", str(results), *where])
    assert readme.read_text() == original and not plots_dir.exists()
    table = (tmp_path / "runs" / "speed.md").read_text()  # default --out: beside the results
    assert "1.50x (--compile)" in table and "](speed_cpu-test-cpu-2-cores-torch-2-13-0.png)" in table
    assert {p.name for p in (tmp_path / "runs").glob("*.png")} == {
        "speed_cpu-test-cpu-2-cores-torch-2-13-0.png",
        "returns_cpu-test-cpu-2-cores-torch-2-13-0.png",
    }

    plot.main(["--results", str(results), "--publish", *where])
    text = readme.read_text()
    assert "old speed" not in text and "old returns" in text and "1.50x (--compile)" in text
    assert "](plots/speed_cpu-test-cpu-2-cores-torch-2-13-0.png)" in text  # links from the README to plots/
    published = {p.name for p in plots_dir.iterdir()}
    assert published == {"speed.md", *(p.name for p in (tmp_path / "runs").glob("*.png"))}
    assert (plots_dir / "speed.md").read_text() == table

    learning = [
        line("ppo_continuous_action.py", 1300.0, seed=s, env_id="HalfCheetah-v4", total=1_000_000, mean_return=r)
        for s, r in ((1, 1400.0), (2, 1500.0))
    ]
    results = write_results(tmp_path / "learning", learning, "./run.sh --learning")
    plot.main(["--results", str(results), "--learning", "--publish", *where])
    text = readme.read_text()
    assert "old returns" not in text and "1,450 ± 71 (n=2, 2 min) | 1442 ± 46 |" in text
    assert "1.50x (--compile)" in text  # the speed table stays
    assert "](plots/learning_cpu-test-cpu-2-cores-torch-2-13-0.png)" in text
    assert {"returns.md", "learning_cpu-test-cpu-2-cores-torch-2-13-0.png"} <= {p.name for p in plots_dir.iterdir()}


def test_a_part_of_the_returns_section_is_published_beside_the_main_table(tmp_path):
    """--part publishes a second set of --learning runs into its own markers and files: the main returns table, its
    curves and its returns.md stay as they were."""
    readme, plots_dir = tmp_path / "README.md", tmp_path / "plots"
    readme.write_text(
        readme_with_markers(readme) + "<!-- returns-table-atari:start -->\n<!-- returns-table-atari:end -->\n"
    )
    where = ["--readme", str(readme), "--plots-dir", str(plots_dir)]
    main = [line("dqn.py", 3000.0, seed=s, env_id="CartPole-v1", total=500_000, mean_return=480.0) for s in (1, 2)]
    plot.main(["--results", str(write_results(tmp_path / "main", main, "./run.sh --learning")), "--learning",
               "--publish", *where])  # fmt: skip
    before = readme.read_text()
    atari = [
        line("dqn_atari_envpool.py", 90.0, seed=s, env_id="Breakout-v5", total=50_000, mean_return=r)
        for s, r in ((1, 2.0), (2, 4.0))
    ]
    results = write_results(tmp_path / "atari", atari, "./run.sh --learning --only dqn_atari_envpool")
    plot.main(["--results", str(results), "--learning", "--part", "atari", "--publish", *where])
    text = readme.read_text()
    main_block = text.split("<!-- returns-table:start -->")[1].split("<!-- returns-table:end -->")[0]
    assert main_block == before.split("<!-- returns-table:start -->")[1].split("<!-- returns-table:end -->")[0]
    assert "480.0" in main_block and "dqn_atari" not in main_block
    part = text.split("<!-- returns-table-atari:start -->")[1].split("<!-- returns-table-atari:end -->")[0]
    assert "| `dqn_atari_envpool` | Breakout-v5 | 50,000 | 3.0 ± 1.4 (n=2, 2 min) | — |" in part
    assert "the cells as in the README's first returns table" in part and "docs.cleanrl.dev" not in part  # said once
    assert (
        "--only dqn_atari_envpool" in part and "](plots/learning_atari_cpu-test-cpu-2-cores-torch-2-13-0.png)" in part
    )
    names = {p.name for p in plots_dir.iterdir()}
    assert {"returns.md", "returns_atari.md", "learning_cpu-test-cpu-2-cores-torch-2-13-0.png"} <= names
    assert "learning_atari_cpu-test-cpu-2-cores-torch-2-13-0.png" in names
    assert "480.0" in (plots_dir / "returns.md").read_text()
    with pytest.raises(SystemExit) as error:  # a part is a plain word, and only for --learning
        plot.main(["--results", str(results), "--part", "atari", *where])
    assert error.value.code == 2


def test_a_part_the_readme_only_links_is_published_as_its_file(tmp_path):
    """A part without markers in the README (Atari's: the README links plots/returns_atari.md) is written to its file
    and PNGs; the README is left as it was."""
    readme, plots_dir = tmp_path / "README.md", tmp_path / "plots"
    readme.write_text(readme_with_markers(readme))
    before = readme.read_text()
    atari = [line("dqn_atari_envpool.py", 90.0, seed=1, env_id="Breakout-v5", total=50_000, mean_return=2.5)]
    results = write_results(tmp_path / "atari", atari, "./run.sh --learning --only dqn_atari_envpool")
    plot.main(["--results", str(results), "--learning", "--part", "atari", "--publish", "--readme", str(readme),
               "--plots-dir", str(plots_dir)])  # fmt: skip
    assert readme.read_text() == before
    published = (plots_dir / "returns_atari.md").read_text()
    assert "| `dqn_atari_envpool` | Breakout-v5 | 50,000 | 2.5 (n=1, 2 min) |" in published
    assert "learning_atari_cpu-test-cpu-2-cores-torch-2-13-0.png" in {p.name for p in plots_dir.iterdir()}


def test_publish_without_markers_fails_before_writing_anything(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # plot.py resolves paths against the working folder
    results = write_results(tmp_path / "runs", [line("dqn.py", 100.0)], "./run.sh --quick", curves=False)
    readme = tmp_path / "README.md"
    readme.write_text("no markers\n")
    with pytest.raises(SystemExit, match="returns-table"):
        flags = ["--learning", "--publish", "--readme", str(readme), "--plots-dir", str(tmp_path / "x")]
        plot.main(["--results", str(results), *flags])
    assert readme.read_text() == "no markers\n"


def test_returns_table_stands_beside_cleanrls_figure_for_the_same_env_and_budget(tmp_path):
    cheetah = {"env_id": "HalfCheetah-v4", "total": 1_000_000}
    lines = [
        line("ppo_continuous_action.py", 1300.0, seed=1, mean_return=1400.0, **cheetah),
        line("ppo_continuous_action.py", 1300.0, seed=2, mean_return=1500.0, **cheetah),
        line("ppo_continuous_action_torchcompile.py", 2000.0, seed=1, compile=True, mean_return=1420.0, **cheetah),
        line("sac_continuous_action.py", 69.0, env_id="HalfCheetah-v4", total=45_000, mean_return=3000.0),
        line("sac_continuous_action.py", 69.0, env_id="HalfCheetah-v4", total=8_000, mean_return=-200.0),
        line("dqn_atari_envpool.py", 76.0, env_id="Breakout-v5", total=50_000, mean_return=None),
        line("dqn.py", 3000.0, env_id="CartPole-v1", total=500_000, mean_return=480.0, status="diverged"),
    ]
    tables = plot.group_runs(plot.read_results(write_results(tmp_path, lines, "./run.sh --learning")), by_budget=True)
    (rows,) = tables.values()
    assert set(rows) == {
        ("ppo_continuous_action", "HalfCheetah-v4", 1_000_000),
        ("sac_continuous_action", "HalfCheetah-v4", 45_000),  # runs of two budgets never share a row
        ("sac_continuous_action", "HalfCheetah-v4", 8_000),
        ("dqn_atari_envpool", "Breakout-v5", 50_000),
    }
    failures = plot.failed_runs(plot.read_results(tmp_path / "results.jsonl"))
    table = plot.returns_markdown(tables, failures, plot.read_published())
    rows = {row.split(" | ")[0].strip("| `"): row for row in table.splitlines() if row.startswith("| `")}
    assert "Measured on **cpu · Test CPU (2 cores) · torch 2.13.0** by `./run.sh --learning`" in table
    assert table.splitlines()[2] == "| script | env | steps | eager | twin --compile | CleanRL |"
    assert rows["ppo_continuous_action"] == (
        "| `ppo_continuous_action` | HalfCheetah-v4 | 1,000,000 | 1,450 ± 71 (n=2, 2 min) | 1,420 (n=1, 2 min) "
        "| 1442 ± 46 |"
    )
    sac = [row for row in table.splitlines() if row.startswith("| `sac_continuous_action`")]
    assert [row.split(" | ")[2] for row in sac] == ["8,000", "45,000"]
    assert all(row.endswith("| — (9635 ± 1424 at 1M) |") for row in sac)  # CleanRL has none at this budget
    assert rows["dqn_atari_envpool"].endswith("| — (n=0, 2 min) | — | — |")  # no episode ended; no figure
    assert "`dqn.py` eager seed 1: diverged" in table
    # a run stops at a whole number of iterations (PPO: 488 of 2048 steps for 1M): within 2% is the same budget
    published = plot.read_published()
    assert plot.published_cell(published, "ppo_continuous_action", "HalfCheetah-v4", 999_424) == "1442 ± 46"
    assert plot.published_cell(published, "ppo_continuous_action", "HalfCheetah-v4", 960_000).startswith("— (")


def test_published_returns_are_in_the_repository_with_their_source():
    """CleanRL's figures the returns table compares against live in the repository (a clone has no ../shared)."""
    text = plot.PUBLISHED.read_text()
    assert plot.PUBLISHED.parent == ROOT / "plots"
    assert "Source: CleanRL" in text and "docs.cleanrl.dev" in text
    published = plot.read_published()
    assert published[("ppo_continuous_action", "HalfCheetah-v4")] == [(1_000_000, "1442", "46")]
    assert published[("dqn", "CartPole-v1")] == [(500_000, "488.7", "16.1")]
    assert published[("ppo", "CartPole-v1")] == [(500_000, "488.75", "18.40")]  # the anchors' ppo.py section
    assert published[("pqn", "CartPole-v1")] == [(500_000, "495.13", "6.89")]  # CleanRL's PQN page
    assert published[("pqn_atari_envpool", "Breakout-v5")] == [(10_000_000, "384.85", "12.39")]  # the same page
    assert {script for script, _ in published} <= set(PAIRS)


def test_published_returns_match_the_anchors_file():
    """Each copied row is the anchors' row unchanged (checked where ../shared sits beside the checkout)."""
    path = ANCHORS / "published_returns.md"
    if not path.exists():
        pytest.skip("anchors not beside the checkout (the repository's copy is checked above)")
    anchors = {}
    for match in re.finditer(r"^\| (\w+) \| ([\w-]+) \| (\d+)([Mk]) \| ([\d.]+) ± ([\d.]+)", path.read_text(), re.M):
        script, env, n, unit, mean, std = match.groups()
        anchors[(script, env, int(n) * (10**6 if unit == "M" else 10**3))] = (mean, std)
    copied = [(key, steps, mean, std) for key, rows in plot.read_published().items() for steps, mean, std in rows]
    assert len(copied) == 9
    # CleanRL's ppo.py has a section of its own there: a row per env, ppo.py's figure first
    section = path.read_text().split("## CleanRL `ppo.py`")[1].split("\n## ")[0]
    for match in re.finditer(r"^\| ([\w-]+) \| ([\d.-]+) ± ([\d.]+) \|", section, re.M):
        anchors[("ppo", match[1], 500_000)] = (match[2], match[3])
    assert anchors[("ppo", "CartPole-v1", 500_000)] == ("488.75", "18.40")
    for (script, env), steps, mean, std in copied:
        if script.startswith("pqn"):  # from CleanRL's PQN page, which the anchors file lacks (the csv says so)
            continue
        assert anchors[(script, env, steps)] == (mean, std), (script, env)


def test_readme_returns_section_is_a_placeholder_or_a_published_learning_table():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- returns-table:start -->")[1].split("<!-- returns-table:end -->")[0].strip()
    assert "## Returns" in readme
    if block.startswith("Not measured yet"):
        assert "./run.sh --learning --publish" in block
    else:  # a table from --learning runs, stamped with its machine, beside CleanRL's figures and with its curves
        assert block.startswith("Measured on **") and "./run.sh --learning" in block
        assert "| CleanRL |" in block and "](plots/learning_" in block
    parts = re.findall(r"<!-- returns-table-(\w+):start -->(.*?)<!-- returns-table-\1:end -->", readme, re.S)
    for part, block in parts:  # a part of the section (plot.py --part), its table as published in plots/
        assert block.strip().startswith("Measured on **") and "./run.sh --learning" in block, part
        assert "| CleanRL |" in block and f"](plots/learning_{part}_" in block, part
        # as published in plots/, but for the provenance: the README names the first command and links the file that
        # lists them all
        published = (ROOT / "plots" / f"returns_{part}.md").read_text().strip().split("\n", 1)
        first, rest = block.strip().replace("](plots/", "](").split("\n", 1)
        assert rest == published[1], part
        if " more (all in [" not in first:  # one command: the provenance line as published
            assert first == published[0], part
            continue
        assert f"(all in [returns_{part}.md](returns_{part}.md))" in first, part
        command = first.split(" by `")[1].split("`")[0]
        assert f"`{command}`, then `" in published[0], part


# ---------------------------------------------------------------- the replay study, copied in


def test_replay_study_is_read_from_the_repository_with_its_source():
    from benchmarks import replay

    assert replay.STUDY == ROOT / "benchmarks" / "replay_storage_rates.csv"
    text = replay.STUDY.read_text()
    assert text.startswith("#") and "Source:" in text and "replay_storage_rates.csv" in text
    study = replay.study_rates()
    assert study["DQN"]["add_items_per_s"] == 400 and math.isclose(study["IMPALA"]["sample_bytes_per_s"], 759e6)
    anchors = ANCHORS / "replay_storage_rates.csv"
    if anchors.exists():  # the copy is the anchors file unchanged
        data = [row for row in csv.reader(line for line in text.splitlines() if not line.startswith("#"))]
        assert data == list(csv.reader(anchors.read_text().splitlines()))


def test_readme_steady_table_is_the_committed_harness_table():
    """./run.sh --steady --publish copies the harness's table to benchmarks/results and splices it into the README:
    its brief cut (plot.steady_brief), one row a script of ours, our median and our ratio to each peer as the whole
    table has them."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- steady-table:start -->")[1].split("<!-- steady-table:end -->")[0].strip()
    whole = (ROOT / "benchmarks" / "results" / "steady_cpu.md").read_text()
    parts = [(path.read_text(), f"benchmarks/results/{path.name}") for path in PUBLISHED_PARTS]
    assert block == plot.steady_brief(whole, "benchmarks/results/steady_cpu.md", parts).strip()
    assert block.startswith("Measured on ") and "./run.sh --steady" in block and "warm-up s" in block
    lines = whole.splitlines()
    columns = plot.cells_of(next(line for line in lines if line.startswith("| run | side |")))
    rows = {(cells[0], cells[1]): cells for cells in (plot.cells_of(line) for line in lines if line.startswith("| `"))}
    brief_columns = plot.cells_of(next(line for line in block.splitlines() if line.startswith("| pair | run |")))
    peers = {name: side for side, name in plot.PEER_NAMES.items() if f"ours / {name}" in brief_columns}
    assert peers, "the committed table has no peer"
    median = plot.median_of
    shown, pair, brief = [], None, block.splitlines()
    for line in brief[next(i for i, text in enumerate(brief) if text.startswith("| pair |")) + 2 :]:
        cells = dict(zip(brief_columns, plot.cells_of(line)))
        pair = cells["pair"].strip("`") or pair  # a pair is named on its first row only
        flags = cells["run"].removeprefix("twin")
        label = f"`{pair}.py`" if cells["run"] == "eager" else f"`{pair}_torchcompile.py{flags}`"
        remeasured = [text for text, _ in parts if f"| {label} | new |" in text]  # its row replaces ours
        if remeasured:
            part = remeasured[-1].splitlines()
            columns = plot.cells_of(next(line for line in part if line.startswith("| run | side |")))
            ours = next(plot.cells_of(line) for line in part if line.startswith(f"| {label} | new |"))
        else:
            columns = plot.cells_of(next(line for line in lines if line.startswith("| run | side |")))
            ours = rows[label, "new"]
        shown.append(label)
        assert cells["ours"] == median(ours[3]) and cells["warm-up s"] == median(ours[5])
        for name, side in peers.items():  # the range without its x's: "1.2x (1.1–1.3)"
            want = ours[columns.index(f"new/{side}, CPU-s")] or "—"
            assert cells[f"ours / {name}"] == re.sub(r"x([–)])", r"\1", want)
    # every script of ours, in the table's order, then the scripts only a re-measure has
    scripts = [label for label, side in rows if side == "new"]
    for text, _ in sorted(parts, key=lambda part: plot.steady_measured(part[0])[0]):
        scripts += [cells[0] for cells in plot.steady_rows(text)[0] if cells[1] == "new" and cells[0] not in scripts]
    assert shown == scripts


STEADY_HEAD = "Measured on cpu; CPU X; torch 2; 2026-11-2{day} 05:40 UTC; 3 interleaved round(s); by `cmd`.\n"
STEADY_COLUMNS = (
    "| run | side | rounds ok | steps/CPU-s | steps/s | warm-up s | CPU-s in warm-up | ms/iteration | "
    "new/sb3, CPU-s | new/sb3, wall |\n|---|---|---|---|---|---|---|---|---|---|\n"
)


def steady_table(day, commit, *rows):
    """A stand-in of steady.py's table (one peer, SB3): rows (script, ours, ratio to SB3)."""
    lines = [f"| `{s}` | new | 3/3 | {ours} (1–9) | {ours} | 4.1 (4–5) | 4 | 9 | {ratio} (0.5x–2x) | {ratio} |\n"
             f"| `{s}` | sb3 | 3/3 | 5 (1–9) | 5 | 3.0 (3–3) | 3 | 9 |  |  |" for s, ours, ratio in rows]  # fmt: skip
    head = STEADY_HEAD.format(day=day) + f"Sides: new = {commit}, sb3 = stable-baselines3 2.9.2.\n\n"
    return head + STEADY_COLUMNS + "\n".join(lines) + "\n"


def test_a_remeasure_of_some_scripts_replaces_their_rows_in_the_cut_and_says_when():
    """A re-measure of one pair (run.sh --steady --only) beside the whole table: its rows replace that pair's rows in
    place, the other pairs' stay, the later of two re-measures of a script wins, and the head names each part's date,
    commit, rounds and link; a cut that kept the old rows or took the earlier part fails."""
    whole = steady_table(7, "aaa1111", ("a.py", "100", "0.9x"), ("a_torchcompile.py --compile", "150", "1.3x"),
                         ("b.py", "70", "1.1x"))  # fmt: skip
    early = steady_table(8, "bbb2222", ("a.py", "104", "0.95x"))
    late = steady_table(9, "ccc3333", ("a.py", "110", "1.05x"), ("a_torchcompile.py --compile", "160", "1.4x"))
    brief = plot.steady_brief(whole, "w.md", [(late, "late.md"), (early, "early.md")])  # given out of date order
    rows = brief.splitlines()[-3:]
    assert rows == [
        "| `a` | eager | 110 | 1.05x (0.5–2) | 4.1 |",
        "|  | twin --compile | 160 | 1.4x (0.5–2) | 4.1 |",
        "| `b` | eager | 70 | 1.1x (0.5–2) | 4.1 |",
    ]
    assert (
        "\nRe-measured: a on 2026-11-28 at bbb2222, 3 rounds ([table](early.md)); a on 2026-11-29 at ccc3333, 3 rounds "
        "([table](late.md)).\n" in brief
    )
    assert brief.index("early.md") < brief.index("late.md") and "[theirs](w.md)" in brief


def test_publishing_a_remeasure_puts_it_beside_the_whole_table_and_a_whole_one_replaces_both(tmp_path):
    """run.sh --steady --publish (plot.publish_steady): a table of fewer scripts than the published one goes beside it
    as steady_cpu_<pairs>.md (a second re-measure of the same pairs replaces the first); one with every script
    replaces steady_cpu.md and drops the re-measures."""
    results = tmp_path / "results"
    results.mkdir()
    whole = tmp_path / "whole.md"
    whole.write_text(steady_table(7, "aaa", ("a.py", "1", "1x"), ("a_torchcompile.py --compile", "2", "1x"),
                                  ("b.py", "3", "1x")))  # fmt: skip
    assert plot.publish_steady(whole, results) == [str(results / "steady_cpu.md")]
    part = tmp_path / "part.md"
    part.write_text(steady_table(8, "bbb", ("a.py", "4", "1x"), ("a_torchcompile.py --compile", "5", "1x")))
    published = plot.publish_steady(part, results)
    assert published == [str(results / "steady_cpu.md"), str(results / "steady_cpu_a.md")]
    assert (results / "steady_cpu.md").read_text() == whole.read_text()
    part.write_text(steady_table(9, "ccc", ("a.py", "6", "1x")))
    assert plot.publish_steady(part, results)[1:] == [str(results / "steady_cpu_a.md")]
    assert "ccc" in (results / "steady_cpu_a.md").read_text()
    assert plot.publish_steady(whole, results) == [str(results / "steady_cpu.md")]
    assert not list(results.glob("steady_cpu_*.md"))


def test_the_steady_cut_head_is_shorter_and_keeps_what_was_measured():
    """The README's cut of a steady table's head: the day without the hour, no load average, the command without its
    --results-dir, the rounds left to the table's line, each side as the README names it, and a peer's torch named
    only where it differs from the measurement's; a cut that kept the folder, lost the day, a side's version or our
    commit, or dropped a different torch, fails."""
    head = [
        "Measured on cpu; CPU X (2 cores, pinned to core 1, load average 3.48 at start); torch 2.13.0+cpu; "
        "2026-11-29 05:40 UTC; an empty compile cache for each run; 3 interleaved round(s); "
        "by `./run.sh --steady --rounds 3 --results-dir <dir>`.",
        "Sides: new = abc, peer = LeanRL (patched, see docs), sb3 = stable-baselines3 2.9.2 (torch 2.13.0+cpu), "
        "torchrl = torchrl 0.14 tensordict 0.14.3 (torch 2.12.0).",
    ]
    assert plot.brief_head(head) == [
        "Measured on X (2 cores, pinned to core 1); torch 2.13.0+cpu; 2026-11-29; cold compile caches; "
        "by `./run.sh --steady --rounds 3`.",
        "Sides: ours at abc; LeanRL (patched); SB3 2.9.2; TorchRL 0.14 tensordict 0.14.3 (torch 2.12.0).",
    ]


def test_steady_brief_gives_medians_and_says_how_many_rounds():
    """Three rounds: the README's cut shows our median (not the min-max the whole table has beside it), our ratio to
    each peer with its range (SB3's in a twin's row: to its eager run, as the whole table has it), one row a script of
    ours, and says it is three rounds; a table without a peer stays as is."""
    head = "Measured on cpu; CPU X; 3 interleaved round(s); by `cmd`.\nSides: new = abc, peer = LeanRL."
    columns = ("| run | side | rounds ok | steps/CPU-s | steps/s | warm-up s | CPU-s in warm-up | ms/iteration | "
               "new/peer, CPU-s | new/peer, wall | new/sb3, CPU-s | new/sb3, wall |")  # fmt: skip
    whole = "\n".join([
        head, "", columns, "|" + "---|" * 12,
        "| `a.py` | new | 3/3 | 262 (259–264) | 261 | 7.68 (7.59–7.77) | 7 | 3,924 "
        "| 1.22x (1.21x–1.23x) | 1.2x | 0.9x (0.8x–1.0x) | 0.9x |",
        "| `a.py` | peer | 3/3 | 214 (213–216) | 214 | 9.12 (9.08–9.16) | 9 | 4,760 |  |  |  |  |",
        "| `a.py` | sb3 | 3/3 | 290 (280–300) | 290 | 3.1 (3.0–3.2) | 3 | 10 |  |  |  |  |",
        "| `a_torchcompile.py --compile` | new | 3/3 | 400 (390–410) | 400 | 30.5 (30–31) | 30 | 9 "
        "| 2.0x (1.9x–2.1x) | 2x | 1.4x (1.3x–1.5x) | 1.4x |",
        "| `a_torchcompile.py --compile` | peer | 3/3 | 200 (190–210) | 200 | 40.2 (40–41) | 40 | 9 |  |  |  |  |",
        "| `a_torchcompile.py --compile` | sb3 | its `a.py` run | — | — | — | — | — |  |  |  |  |",
        "| `b.py` | new | 3/3 | 10,299 (10,100–10,400) | 10,290 | 2.68 (2.60–2.70) | 2 | 9 |  |  |  |  |",
    ])  # fmt: skip
    brief = plot.steady_brief(whole, "x.md")
    assert "3 rounds: medians" in brief and "(259–264)" not in brief and "ratio to each peer," in brief
    assert "| pair | run | ours | ours / LeanRL | ours / SB3 | warm-up s |" in brief
    assert "| `a` | eager | 262 | 1.22x (1.21–1.23) | 0.9x (0.8–1.0) | 7.68 |" in brief
    assert "|  | twin --compile | 400 | 2.0x (1.9–2.1) | 1.4x (1.3–1.5) | 30.5 |" in brief
    assert "| `b` | eager | 10,299 | — | — | 2.68 |" in brief and brief.count("\n| ") == 4  # one row a script of ours
    no_peer = whole.replace("| peer |", "| base |").replace("| sb3 |", "| base |")
    assert plot.steady_brief(no_peer, "x.md") == no_peer
