"""benchmarks/gpu_check.py, the GPU check of issue 50, on the CPU: its statistics against independent references, its
dry run through the capture stand-in (tests/gpu_standin.py) passing, and a stand-in whose replays freeze the draws
failing it; its list of twins holds the flags and bars of their CPU learning checks."""

import ast
import json
import math
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_check  # noqa: E402

# ---------------------------------------------------------------- the statistics


def kolmogorov_q(lam):
    """P(K > lam) of the Kolmogorov distribution by its other series, sqrt(2 pi)/lam sum exp(-(2k-1)^2 pi^2/(8 lam^2))
    (the one gpu_check uses is 2 sum (-1)^(k-1) exp(-2 k^2 lam^2))."""
    return 1 - math.sqrt(2 * math.pi) / lam * sum(
        math.exp(-((2 * k - 1) ** 2) * math.pi**2 / (8 * lam**2)) for k in range(1, 50)
    )


@pytest.mark.parametrize("n,m,shift", [(200, 200, 0.1), (200, 150, 0.25), (60, 60, 0.5), (500, 400, 0.05)])
def test_ks_p_is_the_kolmogorov_tail_of_the_largest_gap_between_the_two_cdfs(n, m, shift):
    rng = np.random.default_rng(n + m)
    a, b = rng.normal(size=n), rng.normal(size=m) + shift
    # the statistic by brute force: the largest gap between the empirical CDFs at every sample point
    d = max(abs(np.mean(a <= x) - np.mean(b <= x)) for x in np.concatenate([a, b]))
    en = math.sqrt(n * m / (n + m))
    want = kolmogorov_q((en + 0.12 + 0.11 / en) * d)
    assert gpu_check.ks_p(a, b) == pytest.approx(min(1.0, want), abs=1e-9)


def test_ks_p_small_for_a_constant_against_a_spread_and_one_for_the_same_sample():
    rng = np.random.default_rng(0)
    a = rng.normal(size=200)
    assert gpu_check.ks_p(a, np.full(200, a[0])) < 1e-20
    assert gpu_check.ks_p(a, a.copy()) == 1.0


def test_chi2_p_is_the_chi_square_tail_of_the_homogeneity_statistic():
    # two samples over 3 values: counts (30, 50, 20) and (50, 30, 20); statistic by hand, df 2: tail exp(-x / 2)
    a = np.repeat([0, 1, 2], [30, 50, 20])
    b = np.repeat([0, 1, 2], [50, 30, 20])
    observed = np.array([[30, 50, 20], [50, 30, 20]], dtype=float)
    expected = np.array([[40, 40, 20], [40, 40, 20]], dtype=float)
    stat = ((observed - expected) ** 2 / expected).sum()
    assert stat == pytest.approx(10.0)
    assert gpu_check.chi2_p(a, b) == pytest.approx(math.exp(-stat / 2), rel=1e-9)
    # values seen under 5 times expected are pooled, with the rarest other value if still rare: (97, 3) against
    # (99, 1) is one cell, nothing to test; (60, 36, 3, 1) against (50, 44, 1, 5): (60, 40) against (50, 50), df 1
    assert gpu_check.chi2_p(np.repeat([0, 1], [97, 3]), np.repeat([0, 1], [99, 1])) == 1.0
    stat = 2 * (5**2 / 55 + 5**2 / 45)
    got = gpu_check.chi2_p(np.repeat([0, 1, 2, 3], [60, 36, 3, 1]), np.repeat([0, 1, 2, 3], [50, 44, 1, 5]))
    assert got == pytest.approx(math.erfc(math.sqrt(stat / 2)), rel=1e-9)  # df 1: P(chi2 > x) = erfc(sqrt(x / 2))


def samples(rng, calls, frozen=False, shift=0.0):
    """sample()'s shape for a policy step with an action (2 envs, 4 actions) and a float output per call."""
    actions = rng.integers(0, 4, size=(calls, 2)).astype(float)
    values = rng.normal(size=(calls, 1)) + shift
    if frozen:
        actions, values = np.repeat(actions[:1], calls, 0), np.repeat(values[:1], calls, 0)
    return {"out0": (actions, True), "out1": (values, False), "wrote0": (np.ones((calls, 1)), False)}


def test_judge_passes_fresh_draws_and_fails_frozen_or_other_draws():
    rng = np.random.default_rng(1)
    fresh = gpu_check.judge(samples(rng, 200), samples(rng, 200))
    assert fresh["ok"] and fresh["draws"] and fresh["tests"] == 3, fresh  # 2 action columns, 1 value; wrote0 constant
    frozen = gpu_check.judge(samples(rng, 200), samples(rng, 200, frozen=True))
    assert not frozen["ok"] and frozen["repeats_graph"] == 1.0 and "repeat" in frozen["why"], frozen
    shifted = gpu_check.judge(samples(rng, 200), samples(rng, 200, shift=1.0))
    assert not shifted["ok"] and shifted["min_p_at"] == "out1[0]" and shifted["repeats_graph"] == 0.0, shifted
    # a float that moves by one quantum (1e-4 of its scale) only, as a nondeterministic kernel's last bits move it
    # across a rounding edge, is no draw
    noise = {"out0": (1 + rng.choice([0.0, 1e-4], size=(50, 3)), False), "out1": (np.zeros((50, 1)), True)}
    assert not gpu_check.judge(noise, noise)["draws"]
    nothing = {"out0": (np.zeros((50, 3)), False)}
    assert gpu_check.judge(nothing, nothing) == dict(
        draws=False, ok=False, why="no output varies from one eager call to the next"
    )


# ---------------------------------------------------------------- the list of twins


def test_each_learning_entry_holds_its_cpu_learning_checks_flags_and_bars():
    """The entries' budgets and bars are their CPU tests': each flag value and each bar is written in the test that
    the entry names (the test exists), so a test's new budget or bar shows here."""
    for twin in gpu_check.TWINS:
        if not twin.learn:
            assert twin.short and not twin.bars, twin.script
            continue
        path, name = twin.check.split("::")
        text = (ROOT / path).read_text()
        [test] = [f for f in ast.walk(ast.parse(text)) if isinstance(f, ast.FunctionDef) and f.name == name]
        body = ast.get_source_segment(text, test)
        # the flags may be a shared module's (tests/<name>_checks.py, whose bodies the test calls)
        shared = [(ROOT / "tests" / f"{m}.py").read_text() for m in ("ppo_checks", "off_policy_checks") if m in text]
        for word in twin.learn:  # a flag or its value, written as a string or (a budget) as a number
            assert any(f'"{word}"' in t or f" {word}," in t for t in [text, *shared]), (twin.script, word)
        for _, bar in twin.bars:
            assert f">= {bar}" in body, (twin.script, bar)


# ---------------------------------------------------------------- the dry run, and a stand-in that freezes the draws


def dry_run(tmp_path, *flags):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--dry-run", *flags, str(tmp_path / "out")],
        capture_output=True, text=True, timeout=1800, cwd=ROOT,
    )  # fmt: skip
    lines = (tmp_path / "out" / "gpu_check.jsonl").read_text().splitlines()
    return proc, {r["name"]: r for r in map(json.loads, lines)}


# SAC (action noise, replay indices, the update's noise), DQN (exploration coins, replay indices), PQN's device env
# (the whole iteration: resets, coins, minibatch order); --dry-run without --only runs every entry (minutes)
CI = "sac_continuous_action_torchcompile,dqn_torchcompile,pqn_device_env"


def test_dry_run_passes_with_fresh_draws(tmp_path):
    """The check's CPU dry run of three entries passes: each named function's replays draw anew, as eager does.
    About 2 minutes, as the frozen run below, on a 2-core AMD EPYC shared with other jobs (load average 9-10)."""
    proc, reports = dry_run(tmp_path, "--only", CI)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in CI.split(","):
        twin, report = gpu_check.BY_NAME[name], reports[name]
        assert report["ok"] and report["learning"]["status"] == "ok", report
        for fn in twin.draws:
            verdict = report["draws"][fn]
            assert verdict["draws"] and verdict["ok"] and verdict["min_p"] >= gpu_check.P_MIN, (name, fn, verdict)


def test_a_stand_in_that_freezes_the_draws_fails_the_check(tmp_path):
    """The planted fault: replays give each random op the values it drew at the capture (a graph whose seed is
    frozen). Every named function that draws from aten's generator fails: its replays repeat the call before every
    time. A counter-based RNG (pqn_device_env.py's) draws anew all the same: its counter moves on in the graph."""
    proc, reports = dry_run(tmp_path, "--freeze-draws", "--replays", "30", "--only", CI)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in CI.split(","):
        report = reports[name]
        if gpu_check.BY_NAME[name].counter:
            assert report["ok"] and all(v["draws"] and v["ok"] for v in report["draws"].values()), report
            continue
        assert not report["ok"], report
        for fn in gpu_check.BY_NAME[name].draws:
            verdict = report["draws"][fn]
            assert verdict["draws"] and not verdict["ok"] and verdict["repeats_graph"] == 1.0, (name, fn, verdict)


@pytest.mark.slow
def test_dry_run_of_every_entry_passes(tmp_path):
    """The whole dry run (every entry of the list whose script exists), as the GPU command runs it but on the CPU
    through the stand-in. Took 10 min (177 s of CPU) with two entries at a time on a 2-core AMD EPYC shared with other
    jobs (load average 9-10)."""
    proc, reports = dry_run(tmp_path, "--jobs", "2", "--deadline-s", "1700")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for twin in gpu_check.TWINS:
        if (ROOT / "leanrl" / f"{twin.script}.py").exists():
            assert reports[twin.script]["ok"], reports[twin.script]
            assert all(reports[twin.script]["draws"][fn]["draws"] for fn in twin.draws), reports[twin.script]


@pytest.mark.parametrize(
    "flags,words",
    [
        (["--freeze-draws"], "--freeze-draws"),  # a fault of the CPU stand-in: never on a GPU
        (["--dry-run", "--only", "sac_continuous_action"], "--only: unknown"),  # an entry is a script's file name
    ],
)
def test_bad_input_exits_2_with_one_line(flags, words, tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), *flags, str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 2 and words in proc.stderr.splitlines()[-1], proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_folder_that_holds_files_is_refused(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "gpu_check.md").write_text("an earlier check\n")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--dry-run", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 2 and "is not empty" in proc.stderr.splitlines()[-1], proc.stderr
    assert (tmp_path / "out" / "gpu_check.md").read_text() == "an earlier check\n"


def test_an_entry_still_running_at_the_deadline_is_stopped_and_fails(tmp_path):
    proc, reports = dry_run(tmp_path, "--deadline-s", "3", "--only", "dqn_torchcompile")
    assert proc.returncode == 1 and "0 of 1 entries pass" in proc.stdout, proc.stdout
    assert reports["dqn_torchcompile"]["why"] == "stopped at the deadline (3 s)"
    assert "stopped at the deadline" in (tmp_path / "out" / "gpu_check.md").read_text()


def test_learning_is_judged_on_the_last_returns_of_the_curve(tmp_path):
    """(b) on a curve written as the scripts write returns.csv (step, wall_s, return): PPO continuous's two bars, the
    mean of the last 100 episodes >= 100 and of the last 10 >= 200."""
    twin = gpu_check.BY_NAME["ppo_continuous_action_torchcompile"]
    returns = [50.0] * 90 + [300.0] * 10  # last 100: 75; last 10: 300
    rows = "".join(f"{i * 10},{i * 0.1:.1f},{r}\n" for i, r in enumerate(returns))
    (tmp_path / "returns.csv").write_text("step,wall_s,return\n" + rows)
    got = gpu_check.judge_bars(twin, {"status": "ok", "steps": 20480}, tmp_path)
    assert got["means"] == {"last 100": 75.0, "last 10": 300.0} and got["episodes"] == 100 and not got["ok"]
    returns[:50] = [130.0] * 50  # last 100: 115
    rows = "".join(f"{i * 10},{i * 0.1:.1f},{r}\n" for i, r in enumerate(returns))
    (tmp_path / "returns.csv").write_text("step,wall_s,return\n" + rows)
    assert gpu_check.judge_bars(twin, {"status": "ok"}, tmp_path)["ok"]
    assert not gpu_check.judge_bars(twin, {"status": "diverged"}, tmp_path)["ok"]
    table = gpu_check.render(
        {twin.script: dict(ok=True, draws={}, learning=gpu_check.judge_bars(twin, {"status": "ok"}, tmp_path))}
    )
    assert "last 100 115.0 / 100, last 10 300.0 / 200 | yes |" in table
