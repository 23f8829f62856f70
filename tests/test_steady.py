"""benchmarks/steady.py: the steady-state arithmetic on known ticks, the interleaved order, the table's paired ratios,
the tick recorder and the results-line fallback on stand-in checkouts, bad input, and one real DQN run."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ROOT, load_script

steady = load_script("benchmarks/steady.py")


def test_ticks_one_second_apart_after_a_five_second_warm_up_are_100_steps_per_second():
    # process started at t=100; the burn-in's one tick ends at t=105; then 100 steps a second, 0.5 CPU-s an iteration
    ticks = [(100, 105.0, 4.0)] + [(100 + 100 * k, 105.0 + k, 4.0 + 0.5 * k) for k in range(1, 11)]
    figures = steady.steady_state(ticks, start=100.0, burnin=1)
    assert figures["sps_wall"] == pytest.approx(100.0) and figures["sps_cpu"] == pytest.approx(200.0)
    assert figures["warmup_s"] == pytest.approx(5.0) and figures["warmup_cpu_s"] == 4.0
    assert figures["steady_iterations"] == 10 and figures["steady_steps"] == 1000
    assert figures["iter_s_median"] == pytest.approx(1.0) and figures["iter_s_p90"] == pytest.approx(1.0)


def test_the_burn_in_and_the_warm_up_floor_decide_where_the_steady_state_starts():
    gaps = [3.0, 1.0, 1.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 4.0]  # seconds of each iteration
    ticks, wall = [], 0.0
    for k, gap in enumerate(gaps, 1):
        wall += gap
        ticks.append((10 * k, wall, wall / 2))
    late = steady.steady_state(ticks, start=0.0, burnin=3)  # the warm-up ends at the third tick, t=5
    assert late["warmup_s"] == 5.0 and late["steady_steps"] == 80 and late["sps_wall"] == pytest.approx(80 / 12)
    assert late["iter_s_median"] == 1.0 and late["iter_s_p10"] == 1.0 and late["iter_s_p90"] == pytest.approx(2.6)
    floor = steady.steady_state(ticks, start=0.0, burnin=3, warmup_s=6.5)  # the first tick at t >= 6.5: t=7
    assert floor["warmup_s"] == 7.0 and floor["steady_steps"] == 70 and floor["sps_cpu"] == pytest.approx(14.0)
    assert steady.steady_state(ticks, start=0.0, burnin=0)["warmup_s"] == 3.0  # at least one tick
    assert steady.steady_state(ticks, start=0.0, burnin=11) is None  # the run ended in its burn-in


def test_rounds_run_every_script_on_every_side_in_turn():
    order = steady.schedule(["dqn.py", "dqn_torchcompile.py --compile"], ["base", "new"], rounds=2)
    assert order == [
        (1, "dqn.py", "base"),
        (1, "dqn.py", "new"),
        (1, "dqn_torchcompile.py --compile", "base"),
        (1, "dqn_torchcompile.py --compile", "new"),
        (2, "dqn.py", "base"),
        (2, "dqn.py", "new"),
        (2, "dqn_torchcompile.py --compile", "base"),
        (2, "dqn_torchcompile.py --compile", "new"),
    ]


def test_the_table_pairs_the_sides_by_round_and_leaves_failed_runs_out():
    def record(side, r, sps_cpu, status="ok"):
        figures = dict(sps_cpu=sps_cpu, sps_wall=sps_cpu / 2, warmup_s=10.0 * r, warmup_cpu_s=9.0 * r)
        iters = dict(iter_s_median=0.01 * r, iter_s_p10=0.005, iter_s_p90=0.02)
        return dict(label="dqn.py", side=side, round=r, status=status, **figures, **iters)

    records = [record("base", 1, 100.0), record("new", 1, 110.0), record("base", 2, 200.0), record("new", 2, 180.0)]
    records += [record("base", 3, 300.0, status="error"), record("new", 3, 900.0)]  # round 3's base failed
    rows = {row.split(" | ")[1]: row.split(" | ") for row in steady.table(records, ["base", "new"]).splitlines()[2:]}
    assert rows["base"][2:8] == [
        "2/3",
        "150 (100–200)",
        "75.0 (50.0–100)",
        "15.0 (10.0–20.0)",
        "13.5 (9.00–18.0)",
        "15.0 (5.00–20.0)",
    ]
    assert rows["new"][2:4] == ["3/3", "180 (110–900)"]
    # per round 1.10x and 0.90x; round 3 has no base to pair with (the ratio of medians would be 1.20x)
    assert rows["new"][8:10] == ["1.00x (0.90x–1.10x)", "1.00x (0.90x–1.10x) |"]


RUN = """
class Run:
    burnin = 2

    def tick(self, step):
        pass

    def __exit__(self, *exc):
        return False
"""
SCRIPT = """
import json, sys, time

if TICKS:
    from leanrl import bookkeeping as bk

    run = bk.Run()
    for k in range(1, 6):
        time.sleep(0.02)
        run.tick(10 * k)
    run.__exit__(None, None, None)
with open(sys.argv[sys.argv.index("--results-file") + 1], "w") as f:
    f.write(json.dumps({"status": "ok", "steps": 50, "sps": 480.0, "wall_s": 0.2}))
"""


PEER_ARGS = """
import dataclasses


@dataclasses.dataclass
class Args:
    total_timesteps: int = 500000
    \"\"\"the budget\"\"\"
    cuda: bool = True
    compile: bool = False
"""
PEER_SCRIPT = """
import os, sys, time
from types import SimpleNamespace

import tqdm

assert os.environ["WANDB_MODE"] == "disabled", "wandb.init would need a login"
assert sys.argv[1:] == ["--total-timesteps", "50"], sys.argv  # no --results-file, no flag its Args lacks
args = SimpleNamespace(num_envs=2, num_steps=5)
for iteration in tqdm.tqdm(range(1, 6)):
    time.sleep(0.02)
for episode in tqdm.tqdm(range(100)):  # an evaluation loop after training: not stamped
    pass
"""


def side(tmp_path, name, ticks):
    """A stand-in checkout whose leanrl/fake.py writes a results line; with `ticks` it first ticks its bookkeeping's
    Run 5 times, 10 steps each, 20 ms apart (burn-in: 2 ticks)."""
    root = tmp_path / name
    (root / "leanrl").mkdir(parents=True)
    (root / "leanrl" / "__init__.py").write_text("")
    (root / "leanrl" / "bookkeeping.py").write_text(RUN)
    (root / "leanrl" / "fake.py").write_text(SCRIPT.replace("TICKS", str(ticks)))
    return root


def test_the_recorder_wraps_run_tick_and_a_side_without_ticks_falls_back_to_the_results_line(tmp_path):
    env = steady.recording_env(tmp_path)
    record = steady.measure(["leanrl/fake.py"], side(tmp_path, "new", True), tmp_path / "new_run", env)
    assert record["source"] == "ticks" and record["burnin"] == 2, record
    assert record["steady_iterations"] == 3 and record["steady_steps"] == 30
    assert 0.015 < record["iter_s_median"] < 0.2 and record["results_sps"] == 480.0

    # a commit from before the shared bookkeeping: no ticks, the results line's figure only
    record = steady.measure(["leanrl/fake.py"], side(tmp_path, "old", False), tmp_path / "old_run", env)
    assert record["source"] == "results line" and record["sps_wall"] == 480.0 and "sps_cpu" not in record


def test_the_peers_stamps_count_env_steps_and_its_warm_up_ends_at_the_step_ours_ended_its_burn_in():
    # a PPO item is a whole rollout of num_envs * num_steps env steps; an off-policy item one step of its envs
    assert steady.steps_per_item(SimpleNamespace(num_envs=8, num_steps=128, batch_size=1024)) == 1024
    assert steady.steps_per_item(SimpleNamespace(num_envs=1, batch_size=256, learning_starts=10)) == 1
    assert steady.steps_per_item(None) == 1  # no module-level args: one step an item
    # ours: 3 ticks of burn-in, 250 env steps a tick: it ended at step 750
    ours = [(250 * k, float(k), k / 2) for k in range(1, 9)]
    assert steady.steps_burnin(ours, 3) == 750 and steady.steps_burnin(ours, 0) == 250
    assert steady.steps_burnin(ours, 9) is None
    # the peer, stamped every 100 steps from t=2, 0.1 s apart: its warm-up ends at the first stamp at or past 750
    peer = [(100 * n, 2.0 + 0.1 * n, 1.0 + 0.05 * n) for n in range(1, 21)]
    burnin = steady.peer_burnin(peer, 750)
    assert burnin == 8 and peer[burnin - 1][0] == 800 and steady.peer_burnin(peer, 800) == 8
    figures = steady.steady_state(peer, start=0.0, burnin=burnin)
    assert figures["steady_steps"] == 1200 and figures["steady_iterations"] == 12
    assert figures["sps_wall"] == pytest.approx(1000.0) and figures["sps_cpu"] == pytest.approx(2000.0)
    assert figures["warmup_s"] == pytest.approx(2.8) and figures["iter_s_median"] == pytest.approx(0.1)
    assert steady.peer_burnin(peer, 2001) == 21 and steady.steady_state(peer, 0.0, 21) is None  # never got there
    # an SB3 or TorchRL bar is stamped before its batch's update, our burn-in ends after one: one stamp more
    assert steady.peer_burnin(peer, 750, before_update=True) == 9 and steady.peer_burnin(peer, 800, True) == 9
    assert steady.peer_burnin(peer, 2000, before_update=True) == 21  # the last stamp: no steady state


def test_the_peer_runs_our_flags_less_those_its_args_lack(tmp_path):
    script = tmp_path / "dqn.py"
    script.write_text(PEER_ARGS)
    words = ["leanrl/dqn.py", "--total-timesteps", "30000", "--results-file=x", "--measure-burnin", "5", "--no-cuda"]
    words += ["--buffer-size", "1", "2", "--compile"]
    kept, left_out = steady.peer_argv(words, script)
    assert kept == ["leanrl/dqn.py", "--total-timesteps", "30000", "--no-cuda", "--compile"]
    assert left_out == ["--results-file=x", "--measure-burnin", "--buffer-size"]


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--side", "base"], "give NAME=PATH"),
        (["--side", "base=/nonexistent"], "not a leanrl checkout"),
        (["--rounds", "0"], "--rounds must be positive"),
        (["--cpu", "4096"], "--cpu 4096: not a core"),
        (["--run", "leanrl/nope.py"], "side new has no"),
        (["--rounds", "x"], "invalid int value"),
        (["--peer", "/nonexistent"], "give a folder with leanrl/<script>.py"),
        (["--peer-sb3", "/nonexistent"], "give a venv made by benchmarks/peers/install.sh"),
        (["--peer-torchrl", "/tmp"], "give a venv made by benchmarks/peers/install.sh"),
    ],
)
def test_bad_input_gets_one_line_and_exit_code_2(flags, message, tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit:
        steady.main(["--run", "leanrl/dqn.py", "--out", str(out), *flags])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and len(err.splitlines()) == 1 and message in err, err
    assert not out.exists()


def test_a_real_dqn_run_on_two_sides_reports_the_speed_its_results_line_does(tmp_path, capsys, monkeypatch):
    """Two runs of 3,000 CartPole steps (learning from step 500), one core (about 10 s); --out relative, as run.sh
    gives it (each run works in its own folder)."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    flags = "leanrl/dqn.py --no-cuda --total-timesteps 3000 --learning-starts 500 --measure-burnin 200"
    core = str(max(os.sched_getaffinity(0)))
    code = steady.main(["--run", flags, "--side", f"base={ROOT}", "--side", f"new={ROOT}", "--rounds", "1",
                        "--cpu", core, "--out", "out"])  # fmt: skip
    assert code == 0
    records = [json.loads(line) for line in (out / "steady.jsonl").read_text().splitlines()]
    assert [(r["side"], r["round"], r["status"], r["source"]) for r in records] == [
        ("base", 1, "ok", "ticks"),
        ("new", 1, "ok", "ticks"),
    ]
    for r in records:
        # one step a tick; the burn-in leaves out the 500 steps before learning starts, and --measure-burnin more
        assert r["burnin"] > 700 and r["steady_steps"] == 3000 - r["burnin"] and r["pinned"] == int(core)
        # the same window as the results line's steps/s, timed by the same clock a few microseconds later
        assert r["sps_wall"] == pytest.approx(r["results_sps"], rel=0.05)
        # one thread on one core: its CPU time is at most the wall time (how much less depends on what else the
        # core runs: the test files run side by side, so no upper bound holds)
        assert r["sps_cpu"] > r["sps_wall"] * 0.9
        assert 0.5 < r["warmup_s"] < r["results_wall_s"] + 30 and r["cpu_count"] == os.cpu_count()
        assert bool(r["commit"]) == (ROOT / ".git").exists()
    table = (out / "steady.md").read_text()
    assert table == capsys.readouterr().out
    assert (
        "| `dqn.py` | new | 1/1 |" in table
        and "Measured on cpu; CPU " in table
        and "pinned to core" in table
        and "new = " in table
        and f"= {ROOT}" not in table  # sides named by commit: no local path in a table meant to be committed
    )


def test_a_peer_side_is_timed_by_its_progress_loop_from_the_step_where_ours_ended_its_burn_in(tmp_path, capsys):
    """Ours: the stand-in checkout (5 ticks of 10 steps, burn-in 2 ticks: 20 steps); the peer: a folder of scripts
    with no bookkeeping and no results line, its one script iterating a tqdm loop of 5 items of 2 x 5 env steps."""
    ours = side(tmp_path, "new", True)
    (ours / "leanrl" / "other.py").write_text((ours / "leanrl" / "fake.py").read_text())  # a pair the peer lacks
    peer = tmp_path / "peer"
    (peer / "leanrl").mkdir(parents=True)
    (peer / "leanrl" / "fake.py").write_text(PEER_ARGS + PEER_SCRIPT)
    out = tmp_path / "out"
    flags = ["--side", f"new={ours}", "--peer", str(peer), "--rounds", "1", "--out", str(out)]
    runs = ["--run", "leanrl/fake.py --total-timesteps 50 --only-ours 3", "--run", "leanrl/other.py"]
    assert steady.main([*runs, *flags]) == 0
    records = [json.loads(line) for line in (out / "steady.jsonl").read_text().splitlines()]
    assert [(r["label"], r["side"], r["status"]) for r in records] == [
        ("fake.py", "new", "ok"),
        ("fake.py", "peer", "ok"),
        ("other.py", "new", "ok"),
    ]
    new, stamped = records[0], records[1]
    assert new["burnin_steps"] == 20 and stamped["burnin_steps"] == 20 and stamped["source"] == "tqdm"
    assert stamped["argv"] == ["leanrl/fake.py", "--total-timesteps", "50"] and stamped["steps_per_item"] == 10
    # its burn-in ends at its second item (20 steps), then 3 steady items of 10 steps, 20 ms each
    assert stamped["burnin"] == 2 and stamped["steady_iterations"] == 3 and stamped["steady_steps"] == 30
    assert stamped["steps"] == 50 and 0.015 < stamped["iter_s_median"] < 0.2 and stamped["sps_cpu"]
    table = (out / "steady.md").read_text()
    assert table == capsys.readouterr().out
    assert "| new/peer, CPU-s | new/peer, wall |" in table and "| `fake.py` | peer | 1/1 |" in table
    assert "| `other.py` | peer | no such script |" in table
    assert f"peer = {steady.PEER_STAMP}" in table and str(peer) not in table  # no local path
    assert "`python3 benchmarks/steady.py --run" in table and f"--peer {steady.PEER_FOLDER}" in table
    assert "Flags the peer lacks, left out of its `fake.py` runs: --only-ours" in table
    (row,) = [line for line in table.splitlines() if line.startswith("| `fake.py` | new |")]
    assert row.split(" | ")[8].endswith("x") and row.split(" | ")[9].endswith("x |")  # the ratio ours/peer


# ---------------------------------------------------------------- SB3 and TorchRL as peers (stand-ins: CI has no venv)


def test_a_twins_row_takes_its_ratio_to_sb3_from_the_eager_scripts_sb3_run_of_the_same_round():
    def record(label, side, r, sps_cpu):
        return dict(label=label, side=side, round=r, status="ok", sps_cpu=sps_cpu, sps_wall=sps_cpu / 2)

    eager, twin = "sac_continuous_action.py", "sac_continuous_action_torchcompile.py --compile"
    records = []
    for r, (ours, sb3, trl, ours_twin, trl_compiled) in enumerate([(70, 50, 40, 90, 45), (80, 40, 50, 100, 60)], 1):
        records += [record(eager, "new", r, ours), record(eager, "sb3", r, sb3), record(eager, "torchrl", r, trl)]
        records += [record(twin, "new", r, ours_twin), record(twin, "torchrl", r, trl_compiled)]
    sides = ["new", "sb3", "torchrl"]
    text = steady.table(records, sides, [("new", "sb3"), ("new", "torchrl")], shared={(twin, "sb3"): eager})
    lines = text.splitlines()
    assert lines[0].endswith("| new/sb3, CPU-s | new/sb3, wall | new/torchrl, CPU-s | new/torchrl, wall |")
    rows = {(row.split(" | ")[0][2:], row.split(" | ")[1]): row.split(" | ") for row in lines[2:]}
    # eager: 70/50 and 80/40 against SB3 (median 1.70x), 70/40 and 80/50 against TorchRL eager (median 1.68x)
    assert rows[f"`{eager}`", "new"][8:10] == ["1.70x (1.40x–2.00x)"] * 2
    assert rows[f"`{eager}`", "new"][10:12] == ["1.68x (1.60x–1.75x)", "1.68x (1.60x–1.75x) |"]
    # the twin: 90/50 and 100/40 against the eager script's SB3 run, 90/45 and 100/60 against TorchRL compiled
    assert rows[f"`{twin}`", "new"][8:10] == ["2.15x (1.80x–2.50x)"] * 2
    assert rows[f"`{twin}`", "new"][10:12] == ["1.83x (1.67x–2.00x)", "1.83x (1.67x–2.00x) |"]
    assert rows[f"`{twin}`", "sb3"][2] == f"its `{eager}` run"
    assert rows[f"`{twin}`", "torchrl"][2:4] == ["2/2", "52.5 (45.0–60.0)"]


def test_the_peers_get_our_work_per_env_step_and_name_the_flags_they_cannot_follow():
    def argv(peer, pair, *flags):
        script = ROOT / "leanrl" / f"{pair}.py"
        return steady.peer_argv_for(peer, [f"leanrl/{pair}.py", *flags], script)

    # our defaults (CleanRL's), read from each script's Args
    words, left_out = argv("torchrl", "sac_continuous_action", "--total-timesteps", "8000", "--measure-burnin", "200")
    assert words[0] == "sac/sac.py" and left_out == []
    for override in ["collector.total_frames=8000", "collector.init_random_frames=5000", "optim.batch_size=256",
                     "collector.env_per_collector=1", "optim.utd_ratio=1.0", "network.hidden_sizes=[256,256]",
                     "replay_buffer.size=1000000", "compile.compile=False", "logger.backend="]:  # fmt: skip
        assert override in words, override
    words, _ = argv("torchrl", "td3_continuous_action_torchcompile", "--learning-starts", "5000", "--compile")
    assert {"compile.compile=True", "collector.init_random_frames=5000", "optim.policy_update_delay=2"} <= set(words)
    words, _ = argv("torchrl", "ppo_continuous_action", "--num-steps", "1024")  # 32 minibatches of 1,024 steps
    assert {"collector.frames_per_batch=1024", "loss.mini_batch_size=32", "loss.ppo_epochs=10"} <= set(words)
    # DQN: batches of 1,000 frames, one update every train_frequency steps, the target every 500 steps in updates
    words, left_out = argv("torchrl", "dqn", "--total-timesteps=30000", "--train-frequency", "4", "--tau", "0.5")
    assert {"loss.num_updates=250", "loss.hard_update_freq=125", "collector.annealing_frames=15000"} <= set(words)
    assert {"buffer.batch_size=128", "buffer.buffer_size=10000", "collector.init_random_frames=10000"} <= set(words)
    assert left_out == ["tau"]
    words, left_out = argv("sb3", "dqn", "--total-timesteps", "30000", "--train-frequency", "4", "--no-cuda")
    assert words == ["benchmarks/peers/sb3_dqn.py", "--env-id", "CartPole-v1", "--total-timesteps", "30000", "--seed",
                     "1", "--learning-starts", "10000"]  # fmt: skip
    assert left_out == ["train_frequency"]  # the driver holds our default, 10
    assert argv("sb3", "ppo_continuous_action")[0][-2:] == ["--seed", "1"]  # no learning_starts
    # SB3's PPO driver follows our rollout and minibatch sizes where a run gives them; TorchRL our --cudagraphs (GPU)
    words, left_out = argv("sb3", "ppo_continuous_action", "--num-steps", "64", "--num-minibatches", "2")
    assert words[-4:] == ["--num-minibatches", "2", "--num-steps", "64"] and left_out == []
    words, _ = argv("torchrl", "sac_continuous_action_torchcompile", "--compile", "--cudagraphs")
    assert words[-2:] == ["compile.compile=True", "compile.cudagraphs=True"]
    assert steady.bar_total(words) == 1_000_000 and steady.bar_total(["x.py", "--total-timesteps", "300"]) == 300
    assert argv("sb3", "pqn") is None and argv("torchrl", "r2d2_atari_envpool") is None


SB3_STUB = """
import json, os, time


class BaseCallback:
    pass


class SAC:
    def __init__(self, policy, env, **settings):
        self.settings = settings
        with open(os.path.join(os.environ["STUB_OUT"], "sb3_settings.json"), "w") as f:
            json.dump({k: v for k, v in settings.items() if k != "action_noise"}, f)

    def learn(self, total_timesteps, callback):  # SB3's order: each step's on_step, each rollout's end, then train
        callback.locals, callback.num_timesteps = {"total_timesteps": total_timesteps}, 0
        callback._on_training_start()
        for step in range(1, total_timesteps + 1):
            callback.num_timesteps = step
            callback._on_step()
            if step % self.settings["train_freq"] == 0:
                callback._on_rollout_end()
                time.sleep(0.01)
        callback._on_training_end()
"""
TORCHRL_STUB = """
import sys, time

import tqdm

overrides = dict(word.split("=", 1) for word in sys.argv[1:])
assert overrides["logger.backend"] == "" and overrides["collector.env_per_collector"] == "1", overrides
total, frames = int(overrides["collector.total_frames"]), int(overrides["collector.frames_per_batch"])
if overrides["compile.compile"] == "True":  # a bar stepped before the training's (as with TorchRL's compile option)
    warm = tqdm.tqdm(total=7)
    for _ in range(7):
        warm.update(1)
pbar = tqdm.tqdm(total=total)
other = tqdm.tqdm(total=3)  # another bar, made after the first: not stamped
for batch in range(total // frames):
    time.sleep(0.02)
    pbar.update(frames)  # TorchRL's loop: the frames of each collected batch, by hand
    other.update(1)
"""

SAC_ARGS = """
import dataclasses


@dataclasses.dataclass
class Args:
    env_id: str = "HalfCheetah-v4"
    total_timesteps: int = 1000000
    learning_starts: int = 5000
    batch_size: int = 256
    buffer_size: int = int(1e6)
"""


def stand_in_peers_venv(tmp_path):
    """A folder laid out as install.sh's venv: bin/python runs this python with a stand-in stable_baselines3 (the
    real sb3_sac.py driver runs on it) and TorchRL's sac.py stands in as a script stepping its bar by frames."""
    venv, site = tmp_path / "venv", tmp_path / "venv" / "site"
    for package, version in [("stable_baselines3", "2.9.2"), ("torchrl", "0.14.1")]:
        (site / package / "common").mkdir(parents=True)
        dist = site / f"{package}-{version}.dist-info"
        dist.mkdir()
        name = package.replace("_", "-")
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (site / "stable_baselines3" / "__init__.py").write_text(SB3_STUB)
    (site / "stable_baselines3" / "common" / "callbacks.py").write_text("from stable_baselines3 import BaseCallback\n")
    (venv / "torchrl-sota" / "sac").mkdir(parents=True)
    (venv / "torchrl-sota" / "sac" / "sac.py").write_text(TORCHRL_STUB)
    (venv / "bin").mkdir()
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="$PYTHONPATH:{site}" exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    return venv


def test_sb3_and_torchrl_are_timed_by_their_progress_bars_torchrl_compiled_in_the_twins_row(
    tmp_path, capsys, monkeypatch
):
    """Ours: the stand-in checkout's eager and twin SAC files (5 ticks of 10 steps, burn-in 2 ticks: 20 steps); SB3:
    the real driver on a stand-in SB3 stamping every step; TorchRL: a stand-in script stepping its bar by batches
    of 10 frames. About 5 s."""
    ours = side(tmp_path, "new", True)
    for name in ("sac_continuous_action", "sac_continuous_action_torchcompile"):  # the peers read their Args
        (ours / "leanrl" / f"{name}.py").write_text(SAC_ARGS + SCRIPT.replace("TICKS", "True"))
    venv = stand_in_peers_venv(tmp_path)
    monkeypatch.setattr(steady, "TORCHRL_FRAMES", 10)
    monkeypatch.setenv("STUB_OUT", str(tmp_path))
    out = tmp_path / "out"
    budget = "--total-timesteps 50 --learning-starts 10"
    runs = ["--run", f"leanrl/sac_continuous_action.py {budget}"]
    runs += ["--run", f"leanrl/sac_continuous_action_torchcompile.py {budget} --compile"]
    flags = ["--side", f"new={ours}", "--peer-sb3", str(venv), "--peer-torchrl", str(venv), "--rounds", "1"]
    assert steady.main([*runs, *flags, "--out", str(out)]) == 0
    records = [json.loads(line) for line in (out / "steady.jsonl").read_text().splitlines()]
    eager, twin = "sac_continuous_action.py", "sac_continuous_action_torchcompile.py --compile"
    assert [(r["label"], r["side"], r["status"]) for r in records] == [
        (eager, "new", "ok"),
        (eager, "sb3", "ok"),
        (eager, "torchrl", "ok"),
        (twin, "new", "ok"),
        (twin, "torchrl", "ok"),  # SB3 has no compile option: run once a pair
    ]
    by = {(r["label"], r["side"]): r for r in records}
    # SB3's driver with our work per env step; its stamps every step (train_freq 1), timed from the one after step 20
    settings = json.loads((tmp_path / "sb3_settings.json").read_text())
    assert settings["batch_size"] == 256 and settings["learning_starts"] == 10 and settings["train_freq"] == 1
    assert settings["gradient_steps"] == 1 and settings["policy_kwargs"] == {"net_arch": [256, 256]}
    sb3 = by[eager, "sb3"]  # from the stamp after step 20's: its update comes after the stamp
    assert sb3["source"] == "bar" and sb3["burnin"] == 21 and sb3["steady_steps"] == 29 and sb3["steps"] == 50
    # TorchRL: stamped by batch (10 frames), the bar of the run's frames (not a bar stepped before it), compile.compile
    # as ours in each row
    for label, compiled in [(eager, "False"), (twin, "True")]:
        run = by[label, "torchrl"]
        assert f"compile.compile={compiled}" in run["argv"] and "collector.init_random_frames=10" in run["argv"]
        assert run["burnin"] == 3 and run["steady_iterations"] == 2 and run["steady_steps"] == 20, run
        assert 0.015 < run["iter_s_median"] < 0.2
    table = (out / "steady.md").read_text()
    assert table == capsys.readouterr().out
    assert "| new/sb3, CPU-s | new/sb3, wall | new/torchrl, CPU-s | new/torchrl, wall |" in table
    assert f"| `{twin}` | sb3 | its `{eager}` run |" in table
    assert "sb3 = stable-baselines3 2.9.2 (torch " in table and "torchrl = torchrl 0.14.1 tensordict " in table
    assert str(venv) not in table and f"--peer-sb3 {steady.VENV_FOLDER}" in table  # no local path
    (row,) = [line for line in table.splitlines() if line.startswith(f"| `{twin}` | new |")]
    cells = row.split(" | ")
    # the twin's ratio to SB3 is paired with the eager script's SB3 run: the ratio of their steps per CPU-second
    assert cells[8] == steady.ratio(by[twin, "new"]["sps_cpu"] / sb3["sps_cpu"])
    assert cells[10] == steady.ratio(by[twin, "new"]["sps_cpu"] / by[twin, "torchrl"]["sps_cpu"])


# ---------------------------------------------------------------- PPO and DQN on Atari beside SB3 and TorchRL

PPO_ATARI = ["leanrl/ppo_atari_envpool.py", "--total-timesteps", "12288", "--measure-burnin", "1"]  # run.sh --steady
DQN_ATARI = ["leanrl/dqn_atari_envpool.py", "--total-timesteps", "4000", "--learning-starts", "1000", "--buffer-size",
             "10000", "--measure-burnin", "1100"]  # fmt: skip


def test_torchrls_atari_scripts_get_our_work_per_env_step_in_emulator_frames():
    """TorchRL's Atari scripts divide their frame counts by 4 (frame skip): each override is our steps x 4."""
    words, left_out = steady.peer_argv_for("torchrl", PPO_ATARI, ROOT / PPO_ATARI[0])
    assert words[0] == "ppo/ppo_atari.py" and left_out == []
    # 8 envs x 128 steps a batch, 4 minibatches of 256 steps, 4 epochs; no evaluation (a positive interval evaluates
    # at batch 0, inside the timing)
    for override in ["env.env_name=ALE/Breakout-v5", "env.num_envs=8", "collector.total_frames=49152",
                     "collector.frames_per_batch=4096", "loss.mini_batch_size=1024", "loss.ppo_epochs=4",
                     "logger.test_interval=-4", "logger.backend=", "compile.compile=False"]:  # fmt: skip
        assert override in words, override
    assert steady.bar_total(words) == 12288  # its bar counts steps: the one of the run's 12,288
    twin = ["leanrl/ppo_atari_envpool_torchcompile.py", *PPO_ATARI[1:], "--num-envs", "4", "--compile"]
    words, left_out = steady.peer_argv_for("torchrl", twin, ROOT / twin[0])
    assert {"env.num_envs=4", "collector.frames_per_batch=2048", "loss.mini_batch_size=512"} <= set(words)
    assert "compile.compile=True" in words and left_out == []
    # DQN: batches of TORCHRL_FRAMES steps with one update every 4 of them, the target every 1,000 steps in updates
    words, left_out = steady.peer_argv_for("torchrl", DQN_ATARI, ROOT / DQN_ATARI[0])
    assert words[0] == "dqn/dqn_atari.py" and left_out == []
    for override in ["env.env_name=ALE/Breakout-v5", "collector.total_frames=16000",
                     "collector.init_random_frames=4000", f"collector.frames_per_batch={4 * steady.TORCHRL_FRAMES}",
                     f"loss.num_updates={steady.TORCHRL_FRAMES // 4}", "loss.hard_update_freq=250",
                     "buffer.batch_size=32", "buffer.buffer_size=10000",
                     "collector.annealing_frames=1600"]:  # fmt: skip
        assert override in words, override
    interval = next(int(w.split("=")[1]) for w in words if w.startswith("logger.test_interval="))
    assert interval > 4 * 4000 and steady.bar_total(words) == 4000  # no evaluation in the run
    words, left_out = steady.peer_argv_for("torchrl", [*DQN_ATARI, "--num-envs", "2"], ROOT / DQN_ATARI[0])
    assert left_out == ["num_envs"]  # its script steps one env


def test_sb3s_atari_drivers_get_our_sizes():
    words, left_out = steady.peer_argv_for("sb3", [*PPO_ATARI, "--num-steps", "64"], ROOT / PPO_ATARI[0])
    assert words == ["benchmarks/peers/sb3_ppo_atari.py", "--env-id", "ALE/Breakout-v5", "--total-timesteps", "12288",
                     "--seed", "1", "--num-steps", "64"] and left_out == []  # fmt: skip
    words, left_out = steady.peer_argv_for("sb3", [*DQN_ATARI, "--gamma", "0.9"], ROOT / DQN_ATARI[0])
    assert words == ["benchmarks/peers/sb3_dqn_atari.py", "--env-id", "ALE/Breakout-v5", "--total-timesteps", "4000",
                     "--seed", "1", "--learning-starts", "1000", "--buffer-size", "10000"]  # fmt: skip
    assert left_out == ["gamma"]


SB3_ATARI_STUB = """
import json, os, sys


class BaseCallback:
    pass


class Model:
    def __init__(self, policy, env, **settings):
        record = dict(settings, policy=policy, env=env, model=type(self).__name__)
        record["learning_rate"] = settings["learning_rate"](1.0) if callable(settings["learning_rate"]) else None
        record.pop("policy_kwargs", None)
        with open(os.path.join(os.environ["STUB_OUT"], type(self).__name__ + ".json"), "w") as f:
            json.dump(record, f)

    def learn(self, total_timesteps, callback):
        pass


class PPO(Model):
    pass


class DQN(Model):
    pass


def make_atari_env(env_id, n_envs, seed, env_kwargs):
    return dict(env_id=env_id, n_envs=n_envs, env_kwargs=env_kwargs)


def VecFrameStack(env, n_stack):
    return dict(env, n_stack=n_stack)
"""


def stand_in_sb3(tmp_path):
    """A stand-in stable_baselines3 (and ale_py) whose PPO and DQN write the settings a driver gives them."""
    site = tmp_path / "site"
    for module in ("callbacks", "env_util", "vec_env"):
        (site / "stable_baselines3" / "common").mkdir(parents=True, exist_ok=True)
        (site / "stable_baselines3" / "common" / f"{module}.py").write_text("from stable_baselines3 import *\n")
    (site / "stable_baselines3" / "__init__.py").write_text(SB3_ATARI_STUB)
    (site / "ale_py.py").write_text("")
    return site


@pytest.mark.parametrize("run", [PPO_ATARI, DQN_ATARI], ids=["ppo", "dqn"])
def test_sb3s_atari_drivers_build_the_model_with_our_values(tmp_path, run):
    """The driver of each Atari pair, run with the planned command on a stand-in SB3: its model's rollout, batch,
    epochs, replay, train frequency and target period are our script's (its Args defaults and the run's flags)."""
    ours = steady.script_values(run, ROOT / run[0])
    words, _ = steady.peer_argv_for("sb3", run, ROOT / run[0])
    path = os.pathsep.join([str(stand_in_sb3(tmp_path)), str(ROOT / "benchmarks" / "peers")])
    env = dict(os.environ, PYTHONPATH=path, STUB_OUT=str(tmp_path))
    subprocess.run([sys.executable, str(ROOT / words[0]), *words[1:]], env=env, check=True, timeout=120)
    model = "PPO" if "ppo" in run[0] else "DQN"
    s = json.loads((tmp_path / f"{model}.json").read_text())
    assert s["policy"] == "CnnPolicy" and s["env"]["env_id"] == "ALE/Breakout-v5" and s["env"]["n_stack"] == 4
    assert s["env"]["env_kwargs"] == {"frameskip": 1, "repeat_action_probability": 0.0}  # the wrapper skips 4
    assert s["env"]["n_envs"] == ours["num_envs"]
    if model == "PPO":
        assert (s["n_steps"], s["n_epochs"]) == (ours["num_steps"], ours["update_epochs"]) == (128, 4)
        assert s["batch_size"] == ours["num_envs"] * ours["num_steps"] // ours["num_minibatches"] == 256
        assert (s["clip_range"], s["clip_range_vf"], s["ent_coef"]) == (ours["clip_coef"],) * 2 + (ours["ent_coef"],)
        assert s["learning_rate"] == ours["learning_rate"]  # annealed from it
    else:
        assert (s["buffer_size"], s["learning_starts"], s["batch_size"]) == (10000, 1000, ours["batch_size"])
        assert (s["train_freq"], ours["train_frequency"], s["target_update_interval"]) == (4, 4, 1000)
        assert ours["target_network_frequency"] == 1000
        assert s["gradient_steps"] == 1 and s["learning_rate"] is None  # a constant rate: ours
        assert (s["exploration_fraction"], s["exploration_final_eps"]) == (ours["exploration_fraction"], ours["end_e"])


def peers_venv():
    """The peers' venv (benchmarks/peers/install.sh ../peers-venv, as its README does) or $LEANRL_PEERS, if it has
    SB3 and ale-py: None in CI."""
    python = Path(os.environ.get("LEANRL_PEERS") or ROOT.parent / "peers-venv") / "bin" / "python"
    if not python.is_file():
        return None
    found = subprocess.run([str(python), "-c", "import ale_py, cv2, stable_baselines3"], capture_output=True)
    return python if found.returncode == 0 else None


@pytest.mark.skipif(peers_venv() is None, reason="no peers' venv with SB3 and ale-py (benchmarks/peers/install.sh)")
def test_the_real_sb3_models_of_the_atari_drivers_have_our_sizes(tmp_path):
    """The drivers on the real SB3 and ALE, their models built and not trained (about 40 s of one core): SB3's own
    attributes hold our rollout, minibatch, epochs, replay, train frequency and target period, on 4-frame stacks."""
    code = """import json, runpy, sys
import sb3_common

def built(model, total):
    m, env = model, model.get_env()
    print(json.dumps(dict(model=type(m).__name__, n_envs=env.num_envs, obs=list(env.observation_space.shape),
        n_steps=getattr(m, "n_steps", None), batch_size=m.batch_size, n_epochs=getattr(m, "n_epochs", None),
        buffer_size=getattr(m, "buffer_size", None), learning_starts=getattr(m, "learning_starts", None),
        train_freq=getattr(getattr(m, "train_freq", None), "frequency", None),
        target=getattr(m, "target_update_interval", None))))

sb3_common.learn = built
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
    found = {}
    for run in (PPO_ATARI, DQN_ATARI):
        words, _ = steady.peer_argv_for("sb3", run, ROOT / run[0])
        cmd = [str(peers_venv()), "-c", code, str(ROOT / words[0]), *words[1:]]
        env = dict(os.environ, PYTHONPATH="")  # the peers' packages alone
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=300, cwd=ROOT / "benchmarks" / "peers", env=env
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        record = json.loads(proc.stdout.splitlines()[-1])
        found[record["model"]] = record
    assert found["PPO"]["n_envs"] == 8 and found["PPO"]["obs"] == [4, 84, 84]  # channels first (VecTransposeImage)
    assert (found["PPO"]["n_steps"], found["PPO"]["batch_size"], found["PPO"]["n_epochs"]) == (128, 256, 4)
    assert found["DQN"]["n_envs"] == 1 and found["DQN"]["obs"] == [4, 84, 84]
    dqn = found["DQN"]
    assert (dqn["buffer_size"], dqn["batch_size"], dqn["learning_starts"], dqn["train_freq"], dqn["target"]) == (
        10000, 32, 1000, 4, 1000)  # fmt: skip


def test_retime_starts_a_bar_peers_window_after_the_update_of_our_burn_in_batch(tmp_path):
    """--retime on a finished folder: a TorchRL run whose first update after our burn-in's env step compiled (100 s
    in the interval after that stamp) gets the window that leaves it out (steps/s from the later intervals: 2,000
    steps in 2 s), and its warm-up takes it in; our run keeps its figures; steady.md gets the note once however
    often it is re-timed, and its table the new figures. The old window read 3,000 steps in 103 s."""
    runs = tmp_path / "steady_runs" / "x"
    runs.mkdir(parents=True)
    ours_ticks, peer_ticks = runs / "ours.csv", runs / "peer.csv"
    # ours: a PPO iteration of 1,000 steps every second, burn-in 1 (ended at 1,000 steps, 1 s after the start)
    steady.write_ticks(ours_ticks, {"source": "loop"}, [(1000 * k, 10.0 + k, 1.0 * k) for k in range(1, 5)])
    # the peer's bar ticks after collecting, before training: 1,000 at 11 s, then its first update compiles (100 s)
    peer_rows = [(1000, 11.0, 1.0), (2000, 112.0, 102.0), (3000, 113.0, 103.0), (4000, 114.0, 104.0)]
    steady.write_ticks(peer_ticks, {"source": "bar", "steps_per_item": None}, peer_rows)
    ours = dict(round=1, label="a.py", side="new", status="ok", burnin=1, burnin_steps=1000, ticks=str(ours_ticks),
                **steady.steady_state(steady.read_ticks(ours_ticks)[1], 10.0, 1))  # fmt: skip
    old_burnin = steady.peer_burnin(peer_rows, 1000)  # the rule before: the first stamp at our burn-in's steps
    peer = dict(round=1, label="a.py", side="torchrl", status="ok", source="bar", burnin=old_burnin, burnin_steps=1000,
                ticks=str(peer_ticks), **steady.steady_state(peer_rows, 10.0, old_burnin))  # fmt: skip
    assert peer["sps_wall"] == pytest.approx(3000 / 103)  # what the first table said: the compile inside
    (tmp_path / "steady.jsonl").write_text(json.dumps(ours) + "\n" + json.dumps(peer) + "\n")
    head = "Measured on cpu; 2026-11-29 09:02 UTC; 1 interleaved round(s); by `cmd`.\nSides: new = abc.\n\nSteady.\n\n"
    (tmp_path / "steady.md").write_text(head + steady.table([ours, peer], ["new", "torchrl"]) + "\n")
    for _ in range(2):
        assert steady.main(["--retime", str(tmp_path)]) == 0
    records = [json.loads(line) for line in (tmp_path / "steady.jsonl").read_text().splitlines()]
    assert records[0] == ours and records[1]["retimed"] and records[1]["sps_wall"] == pytest.approx(1000)
    assert records[1]["warmup_s"] == pytest.approx(102.0)  # from the process start (10 s) to the 2,000-step stamp
    text = (tmp_path / "steady.md").read_text()
    assert text.count("re-timed from their stamps") == 1 and text.startswith(head.split("\n\n")[0])
    assert "| `a.py` | torchrl | 1/1 | " in text and "| 1,000 |" in text.split("| `a.py` | torchrl |")[1].split("\n")[0]
    with pytest.raises(SystemExit) as bad:  # not a finished folder: one line, exit code 2
        steady.main(["--retime", str(tmp_path / "none")])
    assert bad.value.code == 2
