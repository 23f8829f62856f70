"""benchmarks/time_to_score.py and .sh: the CPU dry run's record against the run's own returns.csv, recomputed here
(the game at which the last-100 mean first reached the target, its step and wall stamp, the mean at the end, the
best), the deadline path, and plots/plot.py --time-to-score's table, figure and --publish against known records and
the published end points' csv.

The runs use the PPO Atari twin: the PQN twin's FAST_FLAGS hold --no-anneal-lr, which bookkeeping.check_flags rejects
today (it reads a flag ending in _lr as a learning rate), and the harness runs FAST_FLAGS as they are.
"""

import csv
import json
import os
import shlex
import statistics
import subprocess
import sys
import tarfile

import pytest
from conftest import ROOT, load_script, strict_json

tts = load_script("benchmarks/time_to_score.py")
plot = load_script("plots/plot.py")
SCRIPT = "leanrl/ppo_atari_envpool_torchcompile.py"


def returns_of(path):
    """[(step, return)] of a script's returns.csv (step,wall_s,return), read here, not by the harness."""
    with open(path) as f:
        return [(int(row["step"]), float(row["return"])) for row in csv.DictReader(f)]


def expected(games, target, min_games):
    """What the record must say, from the run's own games: the first game at which the mean of the last up to 100
    reached the target (with at least min_games), the best such mean, the mean at the end."""
    means = [statistics.fmean(r for _, r in games[max(0, i - 99) : i + 1]) for i in range(len(games))]
    counted = list(range(min_games - 1, len(games)))
    first = next((i for i in counted if means[i] >= target), None)
    return dict(
        means=means,
        first=first,
        best=max((means[i] for i in counted), default=None),
        end=means[-1] if means else None,
    )


def check_record(record, games, curve_rows):
    """The record and the harness's curve against the run's returns.csv."""
    want = expected(games, record["target"], record["min_games"])
    assert record["games"] == len(games)
    assert record["last100_at_end"] == pytest.approx(want["end"])
    assert record["best_last100"] == pytest.approx(want["best"])
    assert record["reached"] is (want["first"] is not None)
    # the harness's curve: one row per game of returns.csv, in order, the wall stamps since launch never going back
    assert [(int(r["step"]), float(r["return"])) for r in curve_rows] == games
    assert [float(r["last100_mean"]) for r in curve_rows] == pytest.approx(want["means"], rel=1e-5)
    walls = [float(r["wall_s"]) for r in curve_rows]
    assert walls == sorted(walls) and all(0 < w <= record["wall_s_at_end"] + 1e-3 for w in walls)
    if record["reached"]:
        i = want["first"]
        assert record["steps_at_score"] == games[i][0] and record["games_at_score"] == i + 1
        assert record["mean_at_score"] == pytest.approx(want["means"][i]) and want["means"][i] >= record["target"]
        assert record["seconds_to_score"] == pytest.approx(walls[i], abs=1e-3)
        assert 0 < record["seconds_to_score"] <= record["wall_s_at_end"]
    else:
        assert record["seconds_to_score"] is record["steps_at_score"] is record["mean_at_score"] is None
    assert record["machine"]["cores"] == len(os.sched_getaffinity(0)) and record["machine"]["device"] == "cpu"
    assert record["machine"]["torch"] and record["machine"]["cpu"]


def test_dry_run_stops_at_the_target_and_its_record_matches_the_runs_own_curve(tmp_path):
    """benchmarks/time_to_score.sh --dry-run OUT ppo: the whole command, the run packed, the table and figure made."""
    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "time_to_score.sh"), "--dry-run", str(out), "ppo"],
                          capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [raw] = (out / "time_to_score.jsonl").read_text().splitlines()
    record = strict_json(raw)
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and all(p.is_file() for p in out.iterdir()), files
    tag = record["curve"].removesuffix(".curve.csv")
    assert set(files) == {"time_to_score.jsonl", "time_to_score.md", record["curve"], record["log"], f"{tag}.tar.gz",
                          f"time_to_score_{plot.slug(plot.machine_of(record))}.png"}  # fmt: skip
    # the flags: the twin's own FAST_FLAGS, then the dry run's sizes; on the CPU and not compiled
    fast = load_script(SCRIPT).FAST_FLAGS
    assert record["fast_flags"] == fast and f" {fast} --no-cuda {tts.DRY_FLAGS}" in record["flags"]
    assert "--compile" not in record["flags"] and record["dry_run"] is True and record["cold_cache"] is True
    assert (record["target"], record["min_games"], record["script"]) == (0.0, 1, "ppo_atari_envpool_torchcompile.py")
    with tarfile.open(out / f"{tag}.tar.gz") as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    run_dir = tmp_path / "unpacked" / "runs" / record["run_name"]
    games = returns_of(run_dir / "returns.csv")
    with open(out / record["curve"]) as f:
        check_record(record, games, list(csv.DictReader(f)))
    # any finished game reaches 0: stopped by SIGTERM at the first one, the script's results line written
    assert record["reached"] and record["games_at_score"] == 1 and record["stopped_by"] == "target"
    [line] = [strict_json(t) for t in (tmp_path / "unpacked" / "runs" / "results.jsonl").read_text().splitlines()]
    assert line["run_name"] == record["run_name"] and line["status"] == "interrupted" and record["exit_code"] == 143
    assert record["results"]["status"] == "interrupted" and record["results"]["sps"] == line["sps"]
    assert record["steps_at_end"] == line["steps"] >= record["steps_at_score"]
    table = (out / "time_to_score.md").read_text()
    assert f"**{record['seconds_to_score'] / 60:.1f}** (target 0)" in table


def test_a_target_out_of_reach_stops_the_run_at_the_deadline(tmp_path, capsys):
    deadline = 20.0  # an iteration at least on a loaded 2-core machine (start-up, imports and one iteration)
    argv = ["--dry-run", "--script", SCRIPT, "--target", "1e6", "--deadline-s", str(deadline), "--out", str(tmp_path)]
    assert tts.main([*argv, "--", "--total-timesteps", "1000000"]) == 0, capsys.readouterr().out[-3000:]
    [raw] = (tmp_path / "time_to_score.jsonl").read_text().splitlines()
    record = strict_json(raw)
    assert record["flags"].endswith("--total-timesteps 1000000") and record["target"] == 1e6
    assert record["reached"] is False and record["seconds_to_score"] is None and record["stopped_by"] == "deadline"
    # stopped near the deadline: SIGTERM at it, the script's results line written within the grace
    assert deadline <= record["wall_s_at_end"] <= deadline + tts.GRACE_S
    assert record["results"]["status"] == "interrupted" and record["exit_code"] == 143
    [line] = [json.loads(t) for t in (tmp_path / "runs" / "results.jsonl").read_text().splitlines()]
    assert line["run_name"] == record["run_name"] and record["steps_at_end"] == line["steps"] > 0
    games = returns_of(tmp_path / "runs" / record["run_name"] / "returns.csv")
    with open(tmp_path / record["curve"]) as f:
        check_record(record, games, list(csv.DictReader(f)))


def test_the_wrapper_refuses_bad_usage_before_it_runs_anything(tmp_path):
    sh = str(ROOT / "benchmarks" / "time_to_score.sh")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    for args in ([], [str(tmp_path / "a"), "dqn"], [str(tmp_path / "full")], ["a", "pqn", "more"]):
        proc = subprocess.run(["bash", sh, *args], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 2 and proc.stderr.strip(), (args, proc.stderr)
    assert not (tmp_path / "a").exists()


def record(script, reached, seconds=None, last=None, wall=530.0, sps=21_000.0, dry=False, commit="abc1234"):
    """A time_to_score record as the harness writes it, with a curve of three games."""
    return dict(
        kind="time_to_score", script=script, env_id="Breakout-v5", target=385.0, min_games=100, reached=reached,
        seconds_to_score=seconds, steps_at_score=9_000_000 if reached else None,
        mean_at_score=390.0 if reached else None,
        last100_at_end=last, steps_at_end=9_500_000, wall_s_at_end=wall, results=dict(status="interrupted", sps=sps),
        curve=f"{script}.curve.csv", dry_run=dry,
        machine=dict(device="NVIDIA H100 80GB HBM3", cpu="Intel(R) Xeon(R)", cores=16, cpu_count=16,
                     torch="2.11.0+cu130", commit=commit),
    )  # fmt: skip


def write_records(folder, records):
    folder.mkdir(parents=True, exist_ok=True)
    for rec in records:
        (folder / rec["curve"]).write_text("wall_s,step,return,last100_mean\n10.0,5000,2,2\n200.5,4000000,300,150\n"
                                           "437.25,9000000,420,390\n")  # fmt: skip
    path = folder / "time_to_score.jsonl"
    path.write_text("".join(json.dumps(rec) + "\n" for rec in records))
    return path


def test_the_table_gives_minutes_from_the_record_and_the_published_minutes_from_the_csv(tmp_path):
    with open(ROOT / "plots" / "published_time_to_score.csv") as f:
        anchors = list(csv.DictReader(line for line in f if not line.startswith("#")))
    assert {a["pair"] for a in anchors} == {"pqn_atari_envpool", "ppo_atari_envpool"}
    pqn = record("pqn_atari_envpool_torchcompile.py", True, seconds=437.25)
    ppo = record("ppo_atari_envpool_torchcompile.py", False, last=212.345, wall=530.0, sps=None)
    records = write_records(tmp_path / "runs", [pqn, ppo])
    readme = tmp_path / "README.md"
    readme.write_text("a\n<!-- time-to-score:start -->\nold\n<!-- time-to-score:end -->\nb\n")
    plot.main(["--time-to-score", str(records), "--out", str(tmp_path / "out"), "--publish", "--readme", str(readme),
               "--plots-dir", str(tmp_path / "plots")])  # fmt: skip
    text = readme.read_text()
    assert text.startswith("a\n") and text.endswith("b\n") and "old" not in text
    rows = {row.split(" | ")[0].strip("| `"): row.split(" | ") for row in text.splitlines() if row.startswith("| `")}
    # minutes to the score: seconds_to_score / 60; steps then; the run's steps/s
    assert rows["pqn_atari_envpool_torchcompile.py"][2] == f"**{437.25 / 60:.1f}** (target 385)"
    assert rows["pqn_atari_envpool_torchcompile.py"][3:5] == ["9,000,000", "21,000"]
    # not reached: the last-100 mean when the deadline stopped it, and when; no steps/s where the script gave none
    assert rows["ppo_atari_envpool_torchcompile.py"][2] == f"not reached: 212.3 at {530 / 60:.1f} min (target 385)"
    assert rows["ppo_atari_envpool_torchcompile.py"][3:5] == ["9,500,000", "—"]
    for name, row in rows.items():  # each row's published minutes: the csv's rows of its pair, and only those
        pair = name.removesuffix("_torchcompile.py")
        mine = [f"{a['label']}: {float(a['minutes']):g}" for a in anchors if a["pair"] == pair]
        assert row[5].removesuffix(" |").split("; ") == mine
    png = f"time_to_score_{plot.slug(plot.machine_of(pqn))}.png"
    assert (tmp_path / "plots" / png).stat().st_size > 10_000 and f"](plots/{png})" in text
    assert "NVIDIA H100 80GB HBM3, 16 cores, torch 2.11.0+cu130, `abc1234`" in text


@pytest.mark.parametrize("bad", [dict(dry=True), dict(commit="abc1234 + uncommitted changes")])
def test_publish_refuses_a_dry_run_and_uncommitted_code(tmp_path, bad):
    records = write_records(tmp_path, [record("pqn_atari_envpool_torchcompile.py", True, seconds=437.25, **bad)])
    readme = tmp_path / "README.md"
    readme.write_text("<!-- time-to-score:start -->\nold\n<!-- time-to-score:end -->\n")
    with pytest.raises(SystemExit) as exit_info:
        plot.main(["--time-to-score", str(records), "--publish", "--readme", str(readme),
                   "--plots-dir", str(tmp_path / "plots")])  # fmt: skip
    assert exit_info.value.code == 2 and "old" in readme.read_text()


def test_the_readmes_time_to_score_table_is_the_archived_runs_rendered():
    # no number typed in: the README's cut is what plot.py --publish renders from the runs archived in docs/gpu-runs
    text = (ROOT / "README.md").read_text()
    cut = text.split("<!-- time-to-score:start -->\n")[1].split("<!-- time-to-score:end -->")[0]
    records = plot.read_time_to_score(sorted((ROOT / "docs" / "gpu-runs").glob("*time-to-score*.jsonl")))
    assert records and all(rec["_curve"] for rec in records)  # each archived record has its curve beside it
    assert cut == plot.time_to_score_markdown(records, plot.read_anchors(), images="plots/")


def test_the_published_end_points_are_the_ones_the_issue_cites():
    rows = {a["label"]: a for a in plot.read_anchors()}
    assert rows["CleanRL pqn_atari_envpool"]["minutes"] == 42.8 and rows["CleanRL pqn_atari_envpool"]["mean"] == 384.85
    jax = rows["CleanRL ppo_atari_envpool_xla_jax_scan (JAX)"]
    assert (jax["minutes"], jax["mean"], jax["std"]) == (39.8, 423.90, 5.49)
    assert rows["openai/baselines PPO2"]["minutes"] == 122.8 and rows["openai/baselines PPO2"]["mean"] is None
    assert tts.TARGETS == {
        "pqn_atari_envpool": 385.0,
        "ppo_atari_envpool": 400.0,
        "pqn_device_env": 475.0,
        "ppo_device_env": 475.0,
    }
    assert shlex.split(load_script(SCRIPT).FAST_FLAGS)  # the twin has a fast configuration to run


def test_a_run_that_wrote_no_results_line_reads_as_failed_not_as_a_score(tmp_path):
    failed = record("pqn_atari_envpool_torchcompile.py", False, wall=5.2)
    failed.update(results=None, exit_code=2, steps_at_end=0)
    records = write_records(tmp_path, [failed])
    plot.main(["--time-to-score", str(records), "--out", str(tmp_path / "out")])
    [row] = [r for r in (tmp_path / "out" / "time_to_score.md").read_text().splitlines() if r.startswith("| `")]
    assert row.split(" | ")[2:5] == ["failed (exit 2, no results line)", "0", "—"]


def test_the_device_env_is_timed_on_cartpole_to_a_score_it_learns(tmp_path):
    """pqn_device_env.py (issue 44): run on CartPole-v1 by default with CartPole's target (475), and timed to a score
    only learning reaches on this CPU budget (150, where a random policy's last-100 mean is about 22): the record says
    it was reached, when, and with the games and steps of the run's own curve."""
    args = ["--script", "leanrl/pqn_device_env.py", "--out", str(tmp_path), "--deadline-s", "240"]
    assert tts.parse(args)[0].target == 475.0 and tts.parse(args)[0].env_id == "CartPole-v1"
    assert tts.main([*args, "--target", "150"]) == 0
    [record] = [strict_json(line) for line in (tmp_path / "time_to_score.jsonl").read_text().splitlines()]
    assert record["env_id"] == "CartPole-v1" and "--env-id CartPole-v1" in record["flags"] and record["reached"]
    assert record["stopped_by"] == "target" and 0 < record["seconds_to_score"] < 240 and record["mean_at_score"] >= 150
    with open(tmp_path / record["curve"]) as f:
        rows = list(csv.DictReader(f))
    at = record["games_at_score"] - 1  # the game at which the mean first reached the target, by the curve
    assert int(rows[at]["step"]) == record["steps_at_score"] and float(rows[at]["last100_mean"]) >= 150
    assert at >= 99 and all(float(row["last100_mean"]) < 150 for row in rows[99:at])


def test_many_seeds_are_timed_to_a_fraction_of_them_at_the_target(tmp_path):
    """--num-seeds 3 (pqn_device_env.py): the record's time is the first game after which 2 of the 3 seeds (the
    fraction 0.6, rounded up) each have a last-100 mean at the target (20 games at least), recomputed here from the
    run's own returns.csv; the curve gives each game's seed and the fraction then. A target only learning reaches
    here (60: a random policy's mean is about 22)."""
    args = ["--script", "leanrl/pqn_device_env.py", "--out", str(tmp_path), "--deadline-s", "240", "--num-seeds", "3",
            "--solved-fraction", "0.6", "--target", "60", "--min-games", "20"]  # fmt: skip
    assert tts.main(args) == 0
    [record] = [strict_json(line) for line in (tmp_path / "time_to_score.jsonl").read_text().splitlines()]
    assert "--num-seeds 3" in record["flags"] and record["num_seeds"] == 3 and record["reached"]
    with open(tmp_path / record["curve"]) as f:
        rows = list(csv.DictReader(f))
    run_dirs = [d for d in (tmp_path / "runs").iterdir() if d.is_dir()]
    with open(run_dirs[0] / "returns.csv") as f:
        games = [(int(r["step"]), float(r["return"]), int(r["seed"])) for r in csv.DictReader(f)]
    assert [(int(r["step"]), float(r["return"]), int(r["seed"])) for r in rows] == games
    by_seed, fractions = {}, []
    for _, ret, seed in games:
        by_seed.setdefault(seed, []).append(ret)
        at = [s for s, rs in by_seed.items() if len(rs) >= 20 and statistics.fmean(rs[-100:]) >= 60]
        fractions.append(len(at) / 3)
    assert [float(r["solved_fraction"]) for r in rows] == pytest.approx(fractions)
    first = next(i for i, fraction in enumerate(fractions) if fraction >= 0.6)
    assert record["games_at_score"] == first + 1 and record["steps_at_score"] == games[first][0]
    assert record["solved_at_score"] == pytest.approx(fractions[first]) and record["stopped_by"] == "target"
    assert sorted(by_seed) == [1, 2, 3]
    png = tmp_path / "seeds.png"
    plot.plot_seeds(run_dirs[0], png, 60.0)  # the plot of every seed's curve draws
    assert png.stat().st_size > 10000
    curves = plot.read_seed_curves(run_dirs[0])
    assert {seed: len(steps) for seed, (steps, _) in curves.items()} == {s: len(r) for s, r in by_seed.items()}
    assert curves[2][1][-1] == pytest.approx(statistics.fmean(by_seed[2][-100:]))
    last = max(step for step, _, _ in games)
    assert plot.mean_over_seeds(curves, [last]) == [pytest.approx(statistics.fmean(curves[s][1][-1] for s in curves))]


def cpu_record(script, env_id, target, reached, seconds=None, last=None, wall=300.0, sb3=None):
    rec = record(script, reached, seconds=seconds, last=last, wall=wall)
    rec.update(env_id=env_id, target=target, sb3_algo=sb3, curve=f"{sb3 or ''}{script}.curve.csv")
    rec["machine"].update(device="cpu", cpu="AMD EPYC", cores=1, torch="2.13.0+cpu")
    return rec


def test_the_cpu_runs_beside_sb3_are_a_row_a_task_and_their_whole_table_is_beside_the_readme(tmp_path):
    """The CPU cut: a row per (algorithm, env, target) with our eager script's, our twin's and SB3's minutes (bold when
    reached, else the mean at the stop), SB3's runs named as SB3's, not as the script whose algorithm they share; a GPU
    run in the same files goes to the GPU table only."""
    records = [
        cpu_record("dqn.py", "CartPole-v1", 475.0, True, seconds=55.2),
        cpu_record("dqn_torchcompile.py", "CartPole-v1", 475.0, True, seconds=90.0),
        cpu_record("dqn.py", "CartPole-v1", 475.0, False, last=301.25, wall=300.0, sb3="dqn"),
        cpu_record("sac_continuous_action_torchcompile.py", "HalfCheetah-v4", 3000.0, False, last=2512.0, wall=1500),
        cpu_record("sac_continuous_action.py", "HalfCheetah-v4", 3000.0, True, seconds=1200.0, sb3="sac"),
        record("pqn_atari_envpool_torchcompile.py", True, seconds=437.25),
    ]
    path = write_records(tmp_path / "runs", records)
    readme = tmp_path / "README.md"
    readme.write_text("<!-- time-to-score:start -->\nold\n<!-- time-to-score:end -->\n"
                      "<!-- time-to-score-cpu:start -->\nold\n<!-- time-to-score-cpu:end -->\n")  # fmt: skip
    plots_dir = tmp_path / "plots"
    plot.main(["--time-to-score", str(path), "--out", str(tmp_path / "out"), "--publish", "--readme", str(readme),
               "--plots-dir", str(plots_dir)])  # fmt: skip
    gpu, cpu = readme.read_text().split("<!-- time-to-score-cpu:start -->")
    assert "pqn_atari_envpool_torchcompile.py" in gpu and "dqn.py" not in gpu and "SB3" not in gpu
    rows = [row for row in cpu.splitlines() if row.startswith("| ") and not row.startswith("| algorithm")]
    assert rows == [
        f"| DQN | CartPole-v1, 475 | **{55.2 / 60:.1f}** | **{90 / 60:.1f}** | 301.2 at {300 / 60:.1f} |",
        f"| SAC | HalfCheetah-v4, 3,000 | — | 2,512 at {1500 / 60:.1f} | **{1200 / 60:.1f}** |",
    ]
    assert "on cpu · AMD EPYC (1 cores) · torch 2.13.0+cpu, `abc1234`:" in cpu
    assert "](plots/time_to_score_cpu.md)" in cpu
    whole = (plots_dir / "time_to_score_cpu.md").read_text()
    assert "| SB3 DQN (zoo) | cpu, 1 cores" in whole and "| `dqn.py` | cpu, 1 cores" in whole
    assert "pqn_atari" not in whole and "![last-100 mean against wall-clock minutes](time_to_score_cpu-" in whole


def test_the_readmes_cpu_cut_is_the_committed_cpu_runs_rendered():
    # no number typed in: the README's CPU cut and plots/time_to_score_cpu.md are plot.py --publish's rendering of the
    # runs committed in plots/time-to-score-cpu (records and curves)
    text = (ROOT / "README.md").read_text()
    cut = text.split("<!-- time-to-score-cpu:start -->\n")[1].split("<!-- time-to-score-cpu:end -->")[0]
    records = plot.read_time_to_score(sorted((ROOT / "plots" / "time-to-score-cpu").glob("*.jsonl")))
    assert records and all(rec["_curve"] and rec["machine"]["device"] == "cpu" for rec in records)
    assert cut == plot.time_to_score_brief(records, "plots/time_to_score_cpu.md")
    whole = (ROOT / "plots" / "time_to_score_cpu.md").read_text()
    assert whole == plot.time_to_score_markdown(records, plot.read_anchors())
    assert {rec.get("sb3_algo") for rec in records} >= {"dqn", "ppo", "sac"}  # SB3 beside ours
