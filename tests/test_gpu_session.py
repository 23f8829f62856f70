"""benchmarks/gpu_session.py: the window arithmetic on known stamps, the loop's phases, the recompile count, the lanes'
cores, the GPU table on committed GPU results, and the whole command as a dry run on the CPU (the smoke test that
keeps it from rotting between GPU runs)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, load_script

session = load_script("benchmarks/gpu_session.py")
plot = load_script("plots/plot.py")


def test_a_window_of_one_second_iterations_of_100_steps_is_100_steps_per_second():
    # process started at t=0; iterations start at 2 (a 10 s compile in the first), 12, 13, 14, ...
    stamps = [2.0, 12.0] + [12.0 + k for k in range(1, 11)]
    figures = session.window_figures(stamps, 100, start=0.0, window_from=3, window_to=11)
    assert figures["sps"] == pytest.approx(100.0) and figures["window_s"] == pytest.approx(8.0)
    assert figures["window_iterations"] == 8 and figures["to_window_s"] == pytest.approx(14.0)
    assert figures["warmup_excess_s"] == pytest.approx(9.0)  # the 10 s first iteration, less one steady second
    assert session.window_figures(stamps, 100, 0.0, window_from=3, window_to=None) is None  # never reached


def test_the_loop_runs_warm_up_window_sync_count_and_profile_then_ends():
    config = dict(k0=2, steady_s=3.0, min_iters=2, sync_iters=2, profile=False, script="x.py")
    state = dict(config=config, stamps=[], syncs={}, phase="warmup")
    clock = [0.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0]
    went_on = [session.advance(state, t) for t in clock]
    # the window opens at iteration 2 (t=6) and closes at the first start 3 s later (iteration 5, t=9); two
    # iterations of sync count (5 and 6) follow, and the loop ends at iteration 7's start
    assert state["window_from"] == 2 and state["window_to"] == 5 and state["syncs_to"] == 7
    assert went_on == [True] * 7 + [False, False] and state["phase"] == "done"
    figures = session.window_figures(state["stamps"], 10, 0.0, state["window_from"], state["window_to"])
    assert figures["sps"] == pytest.approx(10.0)


def test_a_window_needs_its_minimum_of_iterations_as_well_as_its_seconds():
    config = dict(k0=0, steady_s=1.0, min_iters=4, sync_iters=0, profile=False, script="x.py")
    state = dict(config=config, stamps=[], syncs={}, phase="warmup")
    went_on = [session.advance(state, t) for t in (0.0, 10.0, 20.0, 30.0, 40.0, 50.0)]
    assert state["window_to"] == 4 and went_on == [True] * 4 + [False, False]


def test_recompiles_are_counted_before_and_after_the_window_starts():
    line = "V1126 12:00:00.000 1 torch/_dynamo/guards.py:1] [0/1] [__recompiles] Recompiling function policy in x.py"
    log = "\n".join([line, "other", line, f"{session.MARK} 4", "tqdm", line])
    assert session.count_recompiles(log) == (2, 1)
    assert session.count_recompiles("no mark\n" + line) == (1, 0)


@pytest.mark.parametrize(
    "cores, sizes",
    [(list(range(16)), [4, 4, 3, 3, 2]), (list(range(32)), [7, 7, 6, 6, 6]), (list(range(8)), [2, 2, 2, 1, 1])],
)
def test_lanes_get_disjoint_cores_and_the_two_ppo_atari_lanes_the_same_number(cores, sizes):
    shares = session.split_cores(cores, 5)
    assert [len(s) for s in shares] == sizes
    flat = [c for s in shares for c in s]
    assert len(flat) == len(set(flat)) and set(flat) <= set(cores)


def test_the_plan_measures_every_pair_and_the_peers_on_the_same_sizes():
    lanes = session.plan("/peer", dry_run=False, cores=list(range(16)))
    runs = [job for _, _, jobs in lanes for job in jobs if job.get("kind") != "ceiling"]
    ours = {(j["pair"], j["variant"]) for j in runs if j["side"] == "leanrl"}
    full = "twin --compile --cudagraphs"
    for pair in ("ppo_atari_envpool", "ppo_continuous_action", "sac_continuous_action", "td3_continuous_action"):
        assert {(pair, "eager"), (pair, full)} <= ours
    for pair in ("dqn", "dqn_atari_envpool", "r2d2_atari_envpool", "pqn", "pqn_atari_envpool"):
        assert {(pair, "eager"), (pair, full)} <= ours
    assert {("ppo_atari_envpool", "twin"), ("ppo_atari_envpool", "twin --compile")} <= ours
    for peer in (j for j in runs if j["side"] == "leanrl-peer"):
        mine = [
            j for j in runs if j["side"] == "leanrl" and (j["pair"], j["variant"]) == (peer["pair"], peer["variant"])
        ]
        assert peer["script"].startswith("/peer/leanrl/") and mine
        assert any(j["flags"] == peer["flags"] and j["num_envs"] == peer["num_envs"] for j in mine)
    ceilings = {(j["env_id"], j["num_envs"]) for _, _, jobs in lanes for j in jobs if j.get("kind") == "ceiling"}
    assert ceilings == {("Breakout-v5", 8), ("Breakout-v5", 64), ("HalfCheetah-v4", 1), ("CartPole-v1", 1)}


def test_a_session_cut_to_some_pairs_keeps_their_runs_and_ceilings_and_moves_the_profile():
    lanes = session.plan("/peer", dry_run=False, cores=list(range(16)))
    pairs = ["ppo_continuous_action", "r2d2_atari_envpool"]
    cut = session.select(lanes, pairs=pairs, profiled=["ppo_continuous_action"])
    jobs = [j for _, _, lane in cut for j in lane]
    runs = {(j["side"], j["pair"], j["variant"]) for j in jobs if "pair" in j}
    full = "twin --compile --cudagraphs"
    sides = [("leanrl", pair) for pair in pairs] + [("leanrl-peer", "ppo_continuous_action")]  # no LeanRL R2D2
    assert runs == {(side, pair, variant) for side, pair in sides for variant in ("eager", full)}
    assert {(j["env_id"], j["num_envs"]) for j in jobs if "pair" not in j} == {("HalfCheetah-v4", 1)}
    assert {(j["side"], j["pair"]) for j in jobs if j.get("profile")} == {
        ("leanrl", "ppo_continuous_action"), ("leanrl-peer", "ppo_continuous_action")}  # fmt: skip
    assert [name for name, _, _ in cut] == ["leanrl-ppo-dqn", "mujoco", "dqn-r2d2"]  # lanes left empty are dropped
    shares = dict((name, share) for name, share, _ in lanes)
    assert all(share == shares[name] for name, share, _ in cut)  # each lane keeps the cores it has in the full plan
    no_peer = session.select(lanes, names=["mujoco"], peer=False)
    assert [j["side"] for _, _, lane in no_peer for j in lane if "pair" in j] == ["leanrl"] * 5


def test_the_gpu_table_of_the_committed_h100_run_gives_its_speed_ups():
    path = ROOT / "docs" / "gpu-runs" / "h100-2026-11-24.jsonl"
    lines = [json.loads(raw) for raw in path.read_text().splitlines()]
    sps = {
        (line["script"], line["compile"], line["cudagraphs"]): line["sps"] for line in lines if line["status"] == "ok"
    }
    table = plot.gpu_markdown(lines)
    assert table.startswith("### NVIDIA H100 80GB HBM3")
    row = next(r for r in table.splitlines() if r.startswith("| `td3_continuous_action`"))
    expected = (
        sps[("td3_continuous_action_torchcompile.py", True, True)] / sps[("td3_continuous_action.py", False, False)]
    )
    assert row.split(" | ")[-1].rstrip(" |") == f"{expected:.2f}x"
    assert "`sac_continuous_action` twin --compile --cudagraphs (HalfCheetah-v4): error: InductorError" in table


def test_the_gpu_table_puts_leanrl_beside_ours_with_the_ratios():
    machine = dict(kind="machine", device="GPU X", cpu="CPU Y", cpu_count=16, torch="2.11.0", time="2026-11-26T00")
    run = lambda side, variant, sps: dict(
        kind="run", side=side, pair="sac_continuous_action", variant=variant, env_id="HalfCheetah-v4", num_envs=1,
        sps=sps, to_window_s=30.0,
    )  # fmt: skip
    full = "twin --compile --cudagraphs"
    records = [machine, dict(kind="ceiling", family="gymnasium", env_id="HalfCheetah-v4", num_envs=1, sps=4000.0)]
    records += [run("leanrl", "eager", 200.0), run("leanrl", full, 1200.0)]
    records += [run("leanrl-peer", "eager", 250.0), run("leanrl-peer", full, 1000.0)]
    row = next(r for r in plot.gpu_markdown(records).splitlines() if r.startswith("| `sac"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[5:8] == ["1,200 (30 s)", "6.00x", "250 (30 s)"]  # ours, twin / eager, LeanRL's eager
    assert cells[8:11] == ["1,000 (30 s) --compile --cudagraphs", "0.80x", "1.20x"]  # its twin, the two ratios
    assert cells[11:] == ["30%"]  # the best twin over the env's ceiling


def test_a_published_gpu_table_names_its_commit_and_a_dirty_one_is_refused(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("x\n<!-- gpu-table:start -->\nold\n<!-- gpu-table:end -->\n")
    results = tmp_path / "results.jsonl"
    machine = dict(kind="machine", device="GPU X", cpu="CPU Y", cpu_count=16, torch="2.11.0", time="2026-11-26T00")
    run = dict(kind="run", side="leanrl", pair="dqn", variant="eager", env_id="CartPole-v1", num_envs=1, sps=900.0)
    for commit, code in (("abc1234 + uncommitted changes", 2), ("abc1234", None)):
        results.write_text("\n".join(json.dumps(r) for r in (dict(machine, commit=commit), run)) + "\n")
        if code:
            with pytest.raises(SystemExit) as exit:
                plot.main(["--gpu", str(results), "--publish", "--readme", str(readme)])
            assert exit.value.code == 2 and "uncommitted changes" in capsys.readouterr().err
            assert "old" in readme.read_text()  # the README untouched
        else:
            plot.main(["--gpu", str(results), "--publish", "--readme", str(readme)])
            assert "at commit `abc1234`: steps/s" in readme.read_text() and "old" not in readme.read_text()


def test_the_rounds_pair_each_twin_with_leanrls_on_equal_halves_and_alone_is_ppo_atari_beside_its_ceiling():
    lanes = session.plan("/peer", dry_run=False, cores=list(range(16)))
    slots = session.rounds_plan(lanes, list(range(16)))
    assert [(name, a, b) for name, a, b, _ in slots] == [
        ("ppo-atari-dqn", [0, 1, 2, 3], [4, 5, 6, 7]),  # envpool's threads: the cores left over go to PPO Atari
        ("ppo-continuous", [8, 9], [10, 11]),
        ("sac-td3", [12, 13], [14, 15]),
    ]
    pairs = [(ours, theirs) for _, _, _, jobs in slots for ours, theirs in jobs]
    ppo, off_policy = (
        ["ppo_atari_envpool", "dqn", "ppo_continuous_action"],
        ["sac_continuous_action", "td3_continuous_action"],
    )
    assert [ours["pair"] for ours, _ in pairs] == ppo + off_policy
    for ours, theirs in pairs:  # the same run on each side: LeanRL's script, our flags
        assert (ours["side"], theirs["side"]) == ("leanrl", "leanrl-peer")
        assert ours["variant"] == theirs["variant"] == "twin --compile --cudagraphs" and not ours["profile"]
        assert (ours["flags"], ours["num_envs"]) == (theirs["flags"], theirs["num_envs"])
    assert pairs[0][0]["num_envs"] == 8
    assert [name for name, *_ in session.rounds_plan(lanes, list(range(16)), pairs=["td3_continuous_action"])] == [
        "sac-td3"]  # fmt: skip
    assert session.split_halves([0, 1], 3) == [([0], [1])] * 3  # fewer cores than halves: the two cores, swapped
    ceiling, twin = session.alone_plan(lanes)
    assert (ceiling["kind"], ceiling["env_id"], ceiling["num_envs"]) == ("ceiling", "Breakout-v5", 8)
    assert (twin["side"], twin["pair"], twin["variant"], twin["num_envs"]) == (
        "leanrl", "ppo_atari_envpool", "twin --compile --cudagraphs", 8)  # fmt: skip


def test_the_rounds_table_gives_the_median_ratio_both_readings_and_marks_readings_apart():
    machine = dict(kind="machine", device="GPU X", cpu="CPU Y", cpu_count=16, torch="2.11.0", time="2026-11-29T00")
    run = lambda side, pair, r, sps: dict(
        kind="run", side=side, pair=pair, variant="twin --compile --cudagraphs", env_id="HalfCheetah-v4", num_envs=1,
        sps=sps, round=r, lane=f"x-{side}",
    )  # fmt: skip
    records = [machine]
    # sac: 1.30x then 1.20x: they hold (8% apart), median 1.25x (the ratio of the median speeds would be 1.27x)
    records += [run("leanrl", "sac", 1, 1300.0), run("leanrl-peer", "sac", 1, 1000.0)]
    records += [run("leanrl", "sac", 2, 600.0), run("leanrl-peer", "sac", 2, 500.0)]
    # td3: 1.50x then 1.00x: 50% apart, marked; ppo: LeanRL's second round got no window: one reading
    records += [run("leanrl", "td3", 1, 900.0), run("leanrl-peer", "td3", 1, 600.0)]
    records += [run("leanrl", "td3", 2, 700.0), run("leanrl-peer", "td3", 2, 700.0)]
    records += [run("leanrl", "ppo", 1, 2000.0), run("leanrl-peer", "ppo", 1, 1000.0)]
    records += [run("leanrl", "ppo", 2, 2100.0), dict(run("leanrl-peer", "ppo", 2, None), status="no window")]
    rows = {row["pair"]: row for row in plot.ratio_rounds(records[1:])}
    assert rows["sac"]["median"] == pytest.approx(1.25) and rows["sac"]["differ"] == pytest.approx(1.3 / 1.2 - 1)
    assert rows["sac"]["held"] and not rows["td3"]["held"] and rows["td3"]["differ"] == pytest.approx(0.5)
    assert rows["ppo"]["ratios"] == {1: 2.0} and not rows["ppo"]["held"]
    for table in (plot.gpu_markdown(records), plot.gpu_markdown(records, brief=True)):
        cells = {
            row.split(" | ")[0].strip("| `"): [c.strip() for c in row.strip("|").split("|")][2:]
            for row in table.splitlines()
            if row.startswith("| `")
        }
        assert cells == {
            "ppo": ["2,000 / 2,100", "1,000 / —", "2.00x (2.00x, —)", "**one reading**"],
            "sac": ["1,300 / 600", "1,000 / 500", "1.25x (1.30x, 1.20x)", "hold (8% apart)"],
            "td3": ["900 / 700", "600 / 700", "1.25x (1.50x, 1.00x)", "**differ by 50%**"],
        }
        assert "| pair | env | eager |" not in table  # a session of rounds only: no lanes table


def test_the_alone_line_puts_the_twin_beside_the_ceiling_on_the_same_cores_and_leanrls_figure():
    machine = dict(kind="machine", device="GPU X", cpu="CPU Y", cpu_count=16, torch="2.11.0", time="2026-11-29T00")
    ceiling = dict(kind="ceiling", family="envpool", env_id="Breakout-v5", num_envs=8, sps=20000.0, alone=True)
    twin = dict(kind="run", side="leanrl", pair="ppo_atari_envpool", variant="twin --compile --cudagraphs",
                env_id="Breakout-v5", num_envs=8, sps=15000.0, cores=16, alone=True)  # fmt: skip
    table = plot.gpu_markdown([machine, ceiling, twin])
    assert (
        "Alone on the machine (16 cores, nothing else on the GPU): `ppo_atari_envpool` twin --compile --cudagraphs, "
        "Breakout-v5 at 8 envs: 15,000 steps/s; the env's ceiling on the same cores: 20,000 steps/s (75% of it); "
        "LeanRL's published H100 figure: 6,809 steps/s." in table
    )
    assert "| env ceiling" not in table  # the alone ceiling is in its line, not the lanes' table


def test_fast_is_pqn_atari_in_the_fast_configuration_time_to_score_runs_profiled_beside_its_ceiling(tmp_path):
    """--fast plans PQN Atari's twin with the script's own FAST_FLAGS and both flags, labelled with its env count and
    steps an iteration, profiled, after envpool's ceiling at that count; the dry run (8 envs x 8 steps, about a
    minute) gets a steady window, the profile of a rollout with send and recv, and the alone line."""
    fast_flags = load_script("leanrl/pqn_atari_envpool_torchcompile.py").FAST_FLAGS.split()
    ceiling, twin = session.fast_plan(session.plan("/peer", dry_run=False, cores=list(range(16))), dry_run=False)
    assert (ceiling["kind"], ceiling["env_id"], ceiling["num_envs"]) == ("ceiling", "Breakout-v5", 128)
    assert twin["flags"] == [*fast_flags, "--compile", "--cudagraphs"] and twin["script"].endswith(
        "pqn_atari_envpool_torchcompile.py")  # fmt: skip
    assert (twin["num_envs"], twin["steps_per_iter"], twin["profile"], twin["fast"]) == (128, 128 * 32, True, True)
    out = tmp_path / "out"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_session.py"), "--dry-run", "--no-peer", "--fast", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ceiling, run = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()][1:]
    assert (ceiling["kind"], ceiling["num_envs"], run["num_envs"], run["steps_per_iter"]) == ("ceiling", 8, 8, 64)
    assert run["sps"] > 0 and run["results_line"]["status"] == "ok" and "--async-envs" in run["flags"]
    profile = (out / "profile.md").read_text()
    assert "pqn_atari_envpool_torchcompile.py" in profile and "`env.recv`" in profile and "`env.send`" in profile
    assert "in its fast configuration, Breakout-v5 at 8 envs:" in (out / "summary.md").read_text()


def test_the_dry_run_rounds_swap_the_cores_and_start_both_sides_together(tmp_path):
    """The rounds on the CPU, our scripts standing in for LeanRL's (CI has no copy of them), DQN only (about 40 s):
    each round runs both at once on disjoint cores, as the measured processes saw them, and round 2 swaps them."""
    out = tmp_path / "out"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_session.py"), "--dry-run", "--rounds", "--pairs", "dqn"]
    proc = subprocess.run([*cmd, "--peer", str(ROOT), str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()][1:]
    assert sorted((r["round"], r["side"]) for r in runs) == [
        (1, "leanrl"), (1, "leanrl-peer"), (2, "leanrl"), (2, "leanrl-peer")]  # fmt: skip
    seen = {(r["round"], r["side"]): r for r in runs}
    assert all(r["sps"] > 0 and r["affinity"] == r["core_ids"] for r in runs), runs
    ours, theirs = seen[(1, "leanrl")], seen[(1, "leanrl-peer")]
    assert not set(ours["affinity"]) & set(theirs["affinity"]) and len(ours["affinity"]) == len(theirs["affinity"])
    assert seen[(2, "leanrl")]["affinity"] == theirs["affinity"] and seen[(2, "leanrl-peer")]["affinity"] == (
        ours["affinity"])  # fmt: skip
    for r in (1, 2):
        assert abs(seen[(r, "leanrl")]["started"] - seen[(r, "leanrl-peer")]["started"]) < 1.0
    assert seen[(2, "leanrl")]["started"] > max(seen[(1, side)]["started"] + seen[(1, side)]["wall_s"]
                                                for side in ("leanrl", "leanrl-peer")) - 0.5  # fmt: skip
    assert "| `dqn` | CartPole-v1 |" in (out / "summary.md").read_text()


@pytest.mark.parametrize("dry_run", [False, True], ids=["gpu", "dry-run"])
def test_every_planned_run_of_ours_gets_flags_its_script_takes_and_the_env_it_is_labelled_with(dry_run):
    """Each of our jobs' command line parsed by its script's own Args (a flag a script lacks would cost a GPU call a
    row): the env and the number of envs the tables label it with are what the script runs."""
    import tyro

    jobs = [j for _, _, lane in session.plan("peer", dry_run, list(range(16))) for j in lane if j.get("side")]
    ours = [j for j in jobs if j["side"] == "leanrl"]
    assert len(ours) >= 2 * 9  # every pair's eager script and twin
    for job in ours:
        args = tyro.cli(load_script(job["script"]).Args, args=["--seed", "1", *job["flags"]])
        num_envs = getattr(args, "num_envs", 1)
        assert (args.env_id, num_envs) == (job["env_id"], job["num_envs"]), job["script"]


LANES = {True: None, False: "ppo-atari"}  # slow: every lane; in CI the PPO Atari lane (ceilings, runs, profile)


@pytest.mark.parametrize("every_lane", [pytest.param(True, marks=pytest.mark.slow), False], ids=["all", "one"])
def test_the_dry_run_measures_its_lanes_on_the_cpu(every_lane, tmp_path):
    """Smoke test plus figures: the jobs of the plan run at tiny budgets (no --compile/--cudagraphs, the peer
    too) and get a steady window; the tables and the archive come back."""
    peer = ROOT.parent / "shared" / "peers" / "leanrl"  # beside a developer's checkout; in CI, ours alone
    has_peer = (peer / "leanrl").is_dir()
    env = dict(os.environ, PEER=str(peer) if has_peer else "none", PYTHON=sys.executable)
    out = tmp_path / "out"
    if every_lane:
        cmd = ["bash", str(ROOT / "benchmarks" / "gpu_session.sh"), "--dry-run", str(out)]
    else:
        cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_session.py"), "--dry-run", "--no-peer", str(out)]
        cmd += ["--lanes", LANES[False]]
        has_peer = False
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["logs.tar.gz", "profile.md", "results.jsonl", "summary.md"]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert records[0]["kind"] == "machine" and records[0]["device"] == "cpu"
    runs = [r for r in records if r["kind"] == "run"]
    lanes = session.plan(str(peer), True, [0, 1])
    planned = [j for name, _, jobs in lanes if every_lane or name == LANES[False] for j in jobs if j.get("side")]
    planned = len([j for j in planned if has_peer or j["side"] == "leanrl"])
    assert len(runs) == planned, [r.get("what") for r in records if r["kind"] == "skipped"]
    no_window = [(r["what"], r["status"], r.get("log_tail")) for r in runs if not r.get("sps")]
    assert not no_window
    ours = [r for r in runs if r["side"] == "leanrl" and r.get("results_line")]
    assert ours and all(r["results_line"]["status"] == "ok" for r in ours)
    assert all(r["sps"] > 0 for r in records if r["kind"] == "ceiling")
    assert "rollout step" in (out / "profile.md").read_text()
    assert "| `ppo_atari_envpool` |" in (out / "summary.md").read_text()


# ---------------------------------------------------------------- --peers: SB3 and TorchRL beside ours

PEER_LANES = ["sac-ours", "sac-torchrl", "td3-ours", "td3-torchrl", "ppo-continuous-ours", "ppo-continuous-torchrl",
              "dqn-ours", "dqn-torchrl"]  # fmt: skip


def test_the_peer_lanes_run_sb3_and_torchrl_at_our_work_per_env_step_beside_ours():
    """CI has no peers' venv: the plan alone. For each pair a lane of ours (the lanes' eager and twin jobs, no sync
    count) then SB3's and TorchRL's eager runs, and a lane of TorchRL compiled, with cudagraphs last; every peer gets
    our env, batch, buffer and learning starts, its window from our warm-up's env step, its bar the run's frames."""
    full = "twin --compile --cudagraphs"
    lanes = session.plan("/peer", dry_run=False, cores=list(range(16)))
    ours = {(j["pair"], j["variant"]): j for _, _, lane in lanes for j in lane if j.get("side") == "leanrl"}
    cut = session.peers_plan(lanes, "/peers", list(range(16)))
    assert [name for name, _, _ in cut] == PEER_LANES
    assert all(len(share) == 2 for _, share, _ in cut) and len({c for _, s, _ in cut for c in s}) == 16
    jobs = {name: lane for name, _, lane in cut}
    for pair, short in session.PEER_PAIRS.items():
        mine, theirs = jobs[f"{short}-ours"], jobs[f"{short}-torchrl"]
        assert [(j["side"], j["variant"]) for j in mine + theirs] == [
            ("leanrl", "eager"), ("leanrl", full), ("sb3", "eager"), ("torchrl", "eager"),
            ("torchrl", "twin --compile"), ("torchrl", full)]  # fmt: skip
        for j in mine[:2]:  # ours as in the lanes, without the sync count and the profile (the lanes measure them)
            same = ours[(pair, j["variant"])]
            assert [j[k] for k in ("flags", "k0", "steps_per_iter")] == [same[k] for k in ("flags", "k0",
                                                                                         "steps_per_iter")]  # fmt: skip
            assert (j["sync_iters"], j["profile"]) == (0, False)
        eager = ours[(pair, "eager")]
        for j in mine[2:] + theirs:
            assert j["k0_steps"] == eager["k0"] * eager["steps_per_iter"] and j["env_id"] == eager["env_id"]
            assert j["bar"] == (500_000 if pair == "dqn" else 1_000_000)  # our default budget: the bar to stamp
        sb3, trl = mine[2], mine[3]
        assert sb3["script"] == str(ROOT / "benchmarks" / "peers" / f"sb3_{pair.split('_')[0]}.py")
        assert sb3["flags"][:2] == ["--env-id", eager["env_id"]] and sb3["flags"][-2:] == ["--device", "auto"]
        assert trl["script"].startswith("/peers/torchrl-sota/")
        compile_options = [[w for w in j["flags"] if w.startswith("compile.")] for j in (trl, *theirs)]
        assert compile_options == [["compile.compile=False"], ["compile.compile=True"],
                                   ["compile.compile=True", "compile.cudagraphs=True"]]  # fmt: skip
    by = lambda short, side: next(j for j in jobs[f"{short}-ours"] if j["side"] == side)["flags"]
    assert by("sac", "sb3")[-4:-2] == ["--learning-starts", "5000"]
    assert by("dqn", "sb3")[-4:-2] == ["--learning-starts", "10000"]
    assert {"collector.init_random_frames=5000", "optim.batch_size=256", "network.hidden_sizes=[256,256]",
            "collector.env_per_collector=1", "env.name=HalfCheetah-v4"} <= set(by("sac", "torchrl"))  # fmt: skip
    assert {"collector.frames_per_batch=2048", "loss.mini_batch_size=64"} <= set(by("ppo-continuous", "torchrl"))
    assert {"collector.init_random_frames=10000", "buffer.batch_size=128"} <= set(by("dqn", "torchrl"))
    assert jobs["ppo-continuous-ours"][2]["k0_steps"] == 3 * 2048  # our three warm-up iterations of 2,048 steps
    # the dry run: no compile, so no TorchRL lanes, and our flagless twin left out; the tiny sizes followed
    dry = session.peers_plan(session.plan("/peer", dry_run=True, cores=[0, 1]), "/peers", [0, 1])
    assert [(name, [j["side"] for j in lane]) for name, _, lane in dry] == [
        (name, ["leanrl", "sb3", "torchrl"]) for name in PEER_LANES[::2]]  # fmt: skip
    ppo = {j["side"]: j["flags"] for j in dict((n, lane) for n, _, lane in dry)["ppo-continuous-ours"]}
    assert ppo["sb3"][-6:-2] == ["--num-minibatches", "2", "--num-steps", "64"]
    assert {"collector.frames_per_batch=64", "loss.mini_batch_size=32"} <= set(ppo["torchrl"])
    sac = {j["side"]: j["flags"] for j in dict((n, lane) for n, _, lane in dry)["sac-ours"]}
    assert "optim.batch_size=32" in sac["torchrl"] and "collector.init_random_frames=300" in sac["torchrl"]


def test_a_peers_bar_opens_its_window_at_our_warm_ups_env_step_and_counts_its_own_steps():
    """TorchRL's SAC: batches of 200 frames, 0.1 s each while the actions are random (5,000 frames), a 10 s compile
    in the first batch that learns, then 0.5 s a batch: the window opens at 5,200 frames (the first stamp past our
    warm-up's 5,100), after the compile, and gives 400 steps/s from the bar's counts."""
    config = dict(k0=None, k0_steps=5100, steady_s=2.9, min_iters=2, sync_iters=0, profile=False, script="sac.py")
    state = dict(config=config, stamps=[], counts=[], syncs={}, phase="warmup")
    now = 1.0
    for batch in range(1, 60):  # a stamp after each batch's collection: the 26th comes after the first update
        now += 0.1 if batch <= 25 else 10.0 if batch == 26 else 0.5
        state["counts"].append(200 * batch)
        if session.advance(state, now) is False:
            break
    assert state["counts"][state["window_from"]] == 5200 and state["counts"][state["window_from"] - 1] == 5000
    assert state["window_to"] - state["window_from"] == 6 and state["phase"] == "done"  # the first 2.9 s: 6 batches
    figures = session.window_figures(state["stamps"], None, 0.0, state["window_from"], state["window_to"],
                                     state["counts"])  # fmt: skip
    assert figures["sps"] == pytest.approx(400.0) and figures["window_s"] == pytest.approx(3.0)
    assert figures["warmup_excess_s"] == pytest.approx(9.5)  # the compile's 10 s less a steady batch
    assert figures["to_window_s"] == pytest.approx(1.0 + 2.5 + 10.0)


def test_a_bad_peers_folder_or_a_mixed_call_exits_2_with_one_line(tmp_path):
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_session.py"), "--dry-run"]
    proc = subprocess.run([*cmd, "--peers", str(tmp_path), str(tmp_path / "out")], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and not (tmp_path / "out").exists()
    assert proc.stderr.startswith(f"gpu_session: error: --peers {tmp_path}: not a venv made by benchmarks/peers/")
    (tmp_path / "torchrl-sota").mkdir()
    (tmp_path / "stable_baselines3").mkdir()
    (tmp_path / "torchrl").mkdir()
    proc = subprocess.run([*cmd, "--rounds", "--peers", str(tmp_path), str(tmp_path / "out")], capture_output=True,
                          text=True)  # fmt: skip
    mixed = f"gpu_session: error: --peers {tmp_path}: a call of its own: not with --rounds, --alone or --fast\n"
    assert proc.returncode == 2 and proc.stderr == mixed
    assert session.peers_python(tmp_path) == (sys.executable, str(tmp_path))  # the folder of install.sh --offline
    env = dict(os.environ, PEERS=str(tmp_path / "none"), PYTHON=sys.executable)
    sh = ["bash", str(ROOT / "benchmarks" / "gpu_session.sh"), "--dry-run", "--peers", str(tmp_path / "out")]
    proc = subprocess.run(sh, env=env, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and f"--peers {tmp_path / 'none'}:" in proc.stderr


def test_the_gpu_table_puts_sb3_and_torchrl_beside_ours_with_our_ratio_to_each():
    machine = dict(kind="machine", device="GPU X", cpu="CPU Y", cpu_count=16, torch="2.11.0", time="2026-11-29T00",
                   peers={"stable-baselines3": "2.9.2", "torchrl": "0.14.1", "tensordict": "0.14.3"})  # fmt: skip
    run = lambda side, variant, sps: dict(
        kind="run", side=side, pair="sac_continuous_action", variant=variant, env_id="HalfCheetah-v4", num_envs=1,
        sps=sps, to_window_s=30.0, peers=True, lane="sac-ours",
    )  # fmt: skip
    full = "twin --compile --cudagraphs"
    records = [machine, run("leanrl", "eager", 200.0), run("leanrl", full, 1200.0), run("sb3", "eager", 100.0)]
    records += [run("torchrl", "eager", 80.0), run("torchrl", "twin --compile", 400.0), run("torchrl", full, 600.0)]
    records += [dict(run("torchrl", full, None), pair="dqn", env_id="CartPole-v1", status="no window (exit 1)")]
    table = plot.gpu_markdown(records)
    assert "Beside SB3 2.9.2 and TorchRL 0.14.1 (tensordict 0.14.3)" in table
    assert "| pair | env | eager | twin | twin --compile" not in table  # ours are in the peers' table only
    cells = lambda text: [c.strip() for c in next(r for r in text.splitlines() if r.startswith("| `sac")).split("|")]
    # ours, SB3, TorchRL's three; ours / SB3 (eager, twin), ours / TorchRL (eager to eager, twin to its fastest)
    assert cells(table)[3:-1] == ["200 (30 s)", "1,200 (30 s)", "100 (30 s)", "80 (30 s)", "400 (30 s)", "600 (30 s)",
                                  "2.00x", "12.00x", "2.50x", "2.00x"]  # fmt: skip
    assert cells(plot.gpu_markdown(records, brief=True))[3:-1] == ["200", "1,200", "2.00x", "12.00x", "2.50x", "2.00x"]
    assert "- TorchRL `dqn` twin --compile --cudagraphs (CartPole-v1): no window (exit 1)" in table


def peers_folder():
    """The peers' venv (benchmarks/peers/install.sh ../peers-venv, as its README does) or $LEANRL_PEERS: None in CI."""
    folder = Path(os.environ.get("LEANRL_PEERS") or ROOT.parent / "peers-venv")
    return folder if session.peers_python(folder) else None


@pytest.mark.skipif(peers_folder() is None, reason="no peers' venv (benchmarks/peers/install.sh ../peers-venv)")
def test_the_dry_run_times_sb3_and_torchrl_beside_ours_from_their_bars(tmp_path):
    """--dry-run --peers on two pairs (about 40 s of one core): each run gets a window; a peer's steps/s is its bar's
    env steps over the window's time, from its stamps; SB3's PPO rollouts are our 64 steps, TorchRL's DQN batches its
    1,000 frames; the machine line names the peers' pinned versions; the table gives our ratios."""
    import tarfile

    out = tmp_path / "out"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_session.py"), "--dry-run", "--peers", str(peers_folder())]
    proc = subprocess.run([*cmd, "--pairs", "dqn,ppo_continuous_action", str(out)], capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    pins = dict(line.split("==") for line in (ROOT / "benchmarks" / "peers" / "requirements.txt").read_text().split()
                if "==" in line)  # fmt: skip
    assert {k: records[0]["peers"][k] for k in ("stable-baselines3", "torchrl")} == {
        k: pins[k] for k in ("stable-baselines3", "torchrl")}  # fmt: skip
    runs = {(r["pair"], r["side"]): r for r in records if r["kind"] == "run"}
    assert sorted(runs) == [(p, s) for p in ("dqn", "ppo_continuous_action") for s in ("leanrl", "sb3", "torchrl")]
    assert all(r["status"] == "ok" and r["sps"] > 0 for r in runs.values()), runs
    with tarfile.open(out / "logs.tar.gz") as tar:
        tar.extractall(tmp_path / "logs", filter="data")
    step = {}
    for (pair, side), r in runs.items():
        if side == "leanrl":
            continue
        data = json.loads((tmp_path / "logs" / r["logs"] / "stamps.json").read_text())
        first, last, counts, stamps = data["window_from"], data["window_to"], data["counts"], data["stamps"]
        assert r["sps"] == pytest.approx((counts[last] - counts[first]) / (stamps[last] - stamps[first]))
        assert counts[first] >= r["k0_steps"] > (counts[first - 1] if first else 0)
        step[(pair, side)] = {b - a for a, b in zip(counts, counts[1:])}
    assert step[("ppo_continuous_action", "sb3")] == {64} and step[("dqn", "torchrl")] == {1000}
    summary = (out / "summary.md").read_text()
    row = next(r for r in summary.splitlines() if r.startswith("| `dqn`"))
    ratio = runs[("dqn", "leanrl")]["sps"] / runs[("dqn", "sb3")]["sps"]
    assert f"| {ratio:.2f}x |" in row
