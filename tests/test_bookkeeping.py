"""leanrl/bookkeeping.py, the run bookkeeping every script shares: the results line and its status on every way a run
ends, the steps/s meter, flag checks, checkpoints. The scripts' own tests run it end to end; these pin its parts."""

import json
import math
import signal
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import SUMMARY, strict_json

from leanrl import bookkeeping as bk


@dataclass
class Args:
    exp_name: str = "test_script"
    seed: int = 3
    env_id: str = "CartPole-v1"
    total_timesteps: int = 100
    track: bool = False
    cuda: bool = False
    results_file: str = "results.jsonl"
    measure_burnin: int = 2
    eval_checkpoint: str | None = None
    eval_episodes: int = 10
    learning_rate: float = 1e-3
    num_envs: int = 4
    wandb_project_name: str = "leanrl"
    wandb_entity: str | None = None
    save_model: bool = False


def run_to_end(tmp_path, body, **run_kwargs):
    """Run `body(run)` inside a Run; returns (exit code or None, the results line)."""
    args = Args(results_file=str(tmp_path / "results.jsonl"))
    code = None
    try:
        with bk.Run("test_script.py", args, torch.device("cpu"), **run_kwargs) as run:
            body(run)
    except SystemExit as err:
        code = err.code
    (line,) = [strict_json(text) for text in (tmp_path / "results.jsonl").read_text().splitlines()]
    return code, line


def test_ok_run_writes_every_spec_key_the_curve_and_a_matching_summary(tmp_path, capsys):
    def body(run):
        for step in (10, 20, 30, 40):
            run.episode(step, float(step) / 10, 5)
            run.tick(step)
        run.check_finite(40, {"loss": torch.tensor(0.5), "value": torch.tensor(-2.0)})

    code, line = run_to_end(tmp_path, body)
    assert code is None and line["status"] == "ok" and line["message"] is None
    assert line["steps"] == 40 and line["episodes"] == 4 and line["mean_return"] == pytest.approx(2.5)
    assert line["losses"] == {"loss": 0.5, "value": -2.0}
    assert line["script"] == "test_script.py" and line["seed"] == 3 and line["device"] == "cpu"
    assert line["compile"] is False and line["cudagraphs"] is False and line["cpu_count"] >= 1
    rows = (tmp_path / line["run_name"] / "returns.csv").read_text().splitlines()
    assert rows[0] == "step,wall_s,return" and [r.split(",")[::2] for r in rows[1:]] == [
        ["10", "1.0"], ["20", "2.0"], ["30", "3.0"], ["40", "4.0"]
    ]  # fmt: skip
    summary = SUMMARY.match(capsys.readouterr().out.strip().splitlines()[-1]).groupdict()
    assert summary["status"] == "ok" and summary["steps"] == "40" and summary["mean_return"] == "2.5"


@pytest.mark.parametrize(
    "raised,status,code",
    [(bk.Diverged("loss diverged at step 7: loss=nan"), "diverged", 1), (KeyboardInterrupt(), "interrupted", 130)],
)
def test_diverged_and_interrupted_runs_still_write_their_line(tmp_path, raised, status, code, capsys):
    def body(run):
        run.tick(8)
        raise raised

    got_code, line = run_to_end(tmp_path, body)
    assert got_code == code and line["status"] == status and line["steps"] == 8
    if status == "diverged":
        assert "loss diverged at step 7" in line["message"] and "loss diverged" in capsys.readouterr().err


def test_an_error_writes_its_line_and_goes_on_up(tmp_path):
    with pytest.raises(ZeroDivisionError):
        run_to_end(tmp_path, lambda run: 1 / 0)
    line = json.loads((tmp_path / "results.jsonl").read_text())
    assert line["status"] == "error" and line["message"].startswith("ZeroDivisionError")


# ---------------------------------------------------------------- stop signals (Ctrl-C, a scheduler's SIGTERM)


@pytest.fixture(autouse=True)
def python_handles_ctrl_c():
    """Ctrl-C raises KeyboardInterrupt here as in a terminal, also when pytest was started as a `&` job of a shell
    without job control: such a job inherits SIGINT ignored, and Python leaves an inherited SIG_IGN alone."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def signalled(signum):
    """`signum` to this thread, its Python handler run before this returns (os.kill may reach another thread, which
    leaves the main thread a few more bytecodes before it runs the handler)."""
    signal.raise_signal(signum)


@pytest.mark.parametrize("signum,code,by", [(signal.SIGINT, 130, "the user"), (signal.SIGTERM, 143, "SIGTERM")])
def test_a_stop_signal_ends_the_run_interrupted_with_its_checkpoint_and_exit_code(tmp_path, signum, code, by):
    """SIGTERM stops a run as Ctrl-C does: status interrupted, the checkpoint saved, then the results line; exit code
    128 + the signal. The handlers the process had before the run are back after it."""
    saved, before = [], {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def body(run):
        run.save = lambda: saved.append(run.steps)
        run.episode(4, 1.0)
        run.tick(8)
        signalled(signum)
        run.tick(16)  # not reached

    got_code, line = run_to_end(tmp_path, body)
    assert got_code == code and line["status"] == "interrupted" and line["message"] == f"interrupted by {by}"
    assert line["steps"] == 8 and saved == [8]
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_a_second_signal_while_the_run_ends_cuts_nothing_short(tmp_path):
    """A scheduler may send SIGTERM twice, torchrun forwards the one its ranks already got, a user presses Ctrl-C
    again: while the run writes its checkpoint and its line, a signal is not raised there."""
    saved = []

    def save():
        signalled(signal.SIGTERM)
        signalled(signal.SIGINT)
        saved.append(True)  # the save went on to its end

    def body(run):
        run.save = save
        run.tick(8)
        signalled(signal.SIGTERM)

    try:
        got_code, line = run_to_end(tmp_path, body)
    except KeyboardInterrupt:  # (not left to end the whole pytest session)
        pytest.fail("the second signal was raised while the run ended")
    assert got_code == 143 and line["status"] == "interrupted" and saved == [True]


def test_a_stop_whose_keyboard_interrupt_was_swallowed_stops_at_the_next_tick(tmp_path, monkeypatch):
    """Raised inside a __del__ (or a callback from C), the KeyboardInterrupt is only printed: the run still stops, at
    its next tick."""
    swallowed = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: swallowed.append(unraisable.exc_type))

    class SignalledOnDeletion:
        def __del__(self):
            signalled(signal.SIGINT)

    def body(run):
        run.tick(8)
        SignalledOnDeletion()  # deleted at once: the handler raises in __del__, and Python swallows it
        run.tick(16)
        run.tick(24)  # not reached

    got_code, line = run_to_end(tmp_path, body)
    assert swallowed == [KeyboardInterrupt]
    assert got_code == 130 and line["status"] == "interrupted" and line["steps"] == 8


def test_an_ignored_signal_stays_ignored(tmp_path):
    """A job that a shell without job control starts with `&` ignores SIGINT: the run leaves it so."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        seen = []
        run_to_end(tmp_path, lambda run: seen.append(signal.getsignal(signal.SIGINT)))
        assert seen == [signal.SIG_IGN] and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_deferred_stop_waits_for_the_ranks_to_agree(tmp_path):
    """deferred_stop=agree (the ranks of a distributed run): the signal only marks the run; at each iteration's end Run
    asks agree(signal, state due) and stops with what the ranks agree on (the largest signal any of them got)."""
    asked, done = [], []

    def agree(signum, due):
        asked.append((signum, due))
        return (signal.SIGTERM if len(asked) == 2 else 0), False  # another rank got SIGTERM in iteration 1

    def body(run):
        for iteration in run.progress(range(5)):
            if iteration == 0:
                signalled(signal.SIGINT)  # no stop here: the ranks agree first
            run.tick(8 * (iteration + 1))
            done.append(iteration)

    got_code, line = run_to_end(tmp_path, body, deferred_stop=agree)
    assert asked == [(signal.SIGINT, False)] * 2 and done == [0, 1]
    assert got_code == 143 and line["message"] == "interrupted by SIGTERM" and line["steps"] == 16


@pytest.mark.parametrize("rank", [0, 1])
def test_the_ranks_write_their_state_at_the_iterations_they_agree_on_rank_0_alone_the_file(tmp_path, rank):
    """Every rank calls run.state() (which gathers from the ranks) where they agree the state is due, and at the
    loop's end of a run that wrote one; rank 0 (the run that records) alone writes the file, after the iteration."""
    states = []

    def agree(signum, due):
        return signum, len(states) == 0 and not due  # due after the first iteration only (here: by no clock)

    args = Args(results_file=str(tmp_path / "results.jsonl"))
    with bk.Run("test_script.py", args, torch.device("cpu"), record=rank == 0, deferred_stop=agree) as run:
        iteration = None
        run.state = lambda: states.append(iteration) or dict(iteration=iteration)
        for iteration in run.progress(range(3)):
            run.tick(8 * (iteration + 1))
    assert states == [0, 2]  # after iteration 0, and at the loop's end
    saved = list(tmp_path.glob(f"*/{bk.STATE_FILE}"))
    if rank == 0:
        [path] = saved
        blob = torch.load(path, weights_only=True)
        assert blob["state"] == {"iteration": 2} and blob["run"]["iterations"] == 3
    else:
        assert saved == []


def test_a_diverged_or_failed_run_saves_no_checkpoint(tmp_path):
    saved = []

    def body(run, raised):
        run.save = lambda: saved.append(True)
        raise raised

    code, line = run_to_end(tmp_path, lambda run: body(run, bk.Diverged("loss diverged at step 8: loss=nan")))
    assert code == 1 and line["status"] == "diverged"
    (tmp_path / "results.jsonl").unlink()
    with pytest.raises(ZeroDivisionError):
        run_to_end(tmp_path, lambda run: body(run, ZeroDivisionError()))
    assert json.loads((tmp_path / "results.jsonl").read_text())["status"] == "error" and saved == []


def test_a_checkpoint_that_fails_to_save_is_an_error_in_the_line(tmp_path):
    def body(run):
        run.save = lambda: 1 / 0

    with pytest.raises(ZeroDivisionError):
        run_to_end(tmp_path, body)
    line = json.loads((tmp_path / "results.jsonl").read_text())
    assert line["status"] == "error" and line["message"] == "saving the model: ZeroDivisionError: division by zero"


def test_check_finite_names_the_step_and_the_bad_loss_and_keeps_the_losses(tmp_path):
    def body(run):
        run.check_finite(12, {"policy": torch.tensor(1.0), "value": torch.tensor(float("inf"))})

    code, line = run_to_end(tmp_path, body)
    assert code == 1 and line["status"] == "diverged"
    assert line["message"] == "loss diverged at step 12: value=inf"
    assert line["losses"] == {"policy": 1.0, "value": None}  # strict JSON: inf is written as null


def test_finite_or_none_makes_nested_non_finite_floats_null():
    got = bk.finite_or_none({"a": math.nan, "b": [1.0, -math.inf, {"c": math.inf}], "d": 2, "e": "x"})
    assert got == {"a": None, "b": [1.0, None, {"c": None}], "d": 2, "e": "x"}


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.mark.parametrize("burnin", [0, 2])
def test_steps_per_second_leave_the_burnin_ticks_out(tmp_path, monkeypatch, burnin):
    """Ticks every second with 100 steps, except the first two which take 10 s each (a compile, say): the speed is
    measured from the burn-in's last tick to the last tick."""
    clock = Clock()
    monkeypatch.setattr(bk.time, "time", clock)
    speeds = []

    def body(run):
        assert run.sps is None  # nothing measured before the first tick
        for i in range(1, 7):
            clock.now += 10.0 if i <= 2 else 1.0
            run.tick(100 * i)
        speeds.append(run.sps)

    run_to_end(tmp_path, body, burnin=burnin)
    want = 600 / 24 if burnin == 0 else 400 / 4
    assert speeds[0] == pytest.approx(want)


def test_a_run_ending_inside_its_burnin_is_measured_from_its_start(tmp_path, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(bk.time, "time", clock)

    def body(run):
        clock.now += 4.0
        run.tick(100)

    _, line = run_to_end(tmp_path, body, burnin=5)
    assert line["sps"] == pytest.approx(25.0)


@pytest.mark.parametrize(
    "change,flag",
    [
        (dict(learning_rate=-1e-3), "--learning-rate"),
        (dict(num_envs=0), "--num-envs"),
        (dict(measure_burnin=-1), "--measure-burnin"),
        (dict(results_file="."), "--results-file"),
        (dict(eval_checkpoint="no/such/file.pt"), "--eval-checkpoint"),
    ],
)
def test_check_flags_refuses_bad_input_with_one_line_and_exit_2(change, flag, capsys):
    args = Args(**change)
    with pytest.raises(SystemExit) as exit_info:
        bk.check_flags("test_script.py", args, positive=("num_envs",))
    assert exit_info.value.code == 2
    (err,) = capsys.readouterr().err.splitlines()
    assert err.startswith("test_script.py: error: ") and flag in err


@dataclass
class LrArgs(Args):
    anneal_lr: bool = True
    policy_lr: float = 3e-4


def test_check_flags_takes_anneal_lr_for_a_switch_and_other_lr_flags_for_rates(capsys):
    """--no-anneal-lr (a boolean named like a rate) is no rate to check; --policy-lr 0 is refused."""
    bk.check_flags("test_script.py", LrArgs(anneal_lr=False), positive=("num_envs",))  # returns: no exit
    with pytest.raises(SystemExit) as exit_info:
        bk.check_flags("test_script.py", LrArgs(anneal_lr=False, policy_lr=0.0), positive=("num_envs",))
    assert exit_info.value.code == 2 and "--policy-lr must be positive" in capsys.readouterr().err


def test_results_file_under_a_file_is_refused_without_creating_anything(tmp_path, capsys):
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(SystemExit):
        bk.check_results_file("s.py", str(tmp_path / "a_file" / "sub" / "results.jsonl"))
    assert "a_file is a file" in capsys.readouterr().err
    bk.check_results_file("s.py", str(tmp_path / "new" / "results.jsonl"))  # a folder still to make is fine
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_checkpoint_is_written_atomically_and_loaded_back(tmp_path, capsys):
    path = tmp_path / "model.pt"
    bk.save_checkpoint(path, Args(), model={"w": torch.arange(3.0)})
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]  # no temporary file left
    checkpoint = bk.load_checkpoint("s.py", path, "model")
    assert checkpoint["args"]["seed"] == 3 and torch.equal(checkpoint["model"]["w"], torch.arange(3.0))
    with pytest.raises(SystemExit) as exit_info:
        bk.load_checkpoint("s.py", path, "model", "obs_rms")
    assert exit_info.value.code == 2 and "no obs_rms" in capsys.readouterr().err


def test_game_returns_sum_raw_rewards_until_game_over():
    import numpy as np

    running = np.zeros(3)
    assert bk.game_returns(running, np.array([1.0, 2.0, 0.0]), np.array([False, False, False])) == []
    assert bk.game_returns(running, np.array([1.0, 0.0, 5.0]), np.array([True, False, True])) == [2.0, 5.0]
    assert running.tolist() == [0.0, 2.0, 0.0]


def test_two_runs_started_in_the_same_second_get_their_own_folders(tmp_path, monkeypatch):
    monkeypatch.setattr(bk.time, "time", lambda: 1234.5)
    lines = []
    for i in range(3):
        (tmp_path / "results.jsonl").unlink(missing_ok=True)
        lines.append(run_to_end(tmp_path, lambda run, i=i: run.episode(1, float(i)))[1])
    names = [line["run_name"] for line in lines]
    assert names == ["CartPole-v1__test_script__3__1234", "CartPole-v1__test_script__3__1234-2",
                     "CartPole-v1__test_script__3__1234-3"]  # fmt: skip
    for i, name in enumerate(names):  # each curve is its own run's
        assert (tmp_path / name / "returns.csv").read_text().splitlines()[1].endswith(f",{float(i)}")


def test_track_logs_episodes_and_report_points_to_wandb(tmp_path, fake_wandb):
    args = Args(results_file=str(tmp_path / "results.jsonl"), track=True)
    with bk.Run("test_script.py", args, torch.device("cpu"), burnin=0) as run:
        run.episode(4, 1.5, 7)
        run.tick(8)
        run.report(8, {"losses/td_loss": 0.25})
    assert fake_wandb.config["name"] == run.name and fake_wandb.config["project"] == args.wandb_project_name
    assert fake_wandb.logs[0] == (4, {"charts/episodic_return": 1.5, "charts/episodic_length": 7})
    step, data = fake_wandb.logs[1]
    assert step == 8 and data["losses/td_loss"] == 0.25 and data["charts/SPS"] > 0
    assert fake_wandb.finished


def test_the_commit_a_run_names_is_the_callers_else_gits(monkeypatch, tmp_path):
    """The results line's commit: git's short hash of the checkout the script is in (+ " + uncommitted changes" when
    its tracked files differ), $LEANRL_COMMIT first where the caller names it, None outside a checkout of its own."""
    monkeypatch.delenv("LEANRL_COMMIT", raising=False)
    root = Path(bk.__file__).parents[1]
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True)
    assert bk.source_commit(root) == head.strip() + (" + uncommitted changes" if dirty.stdout.strip() else "")
    clone = tmp_path / "a clone"  # a space in the path
    subprocess.run(["git", "clone", "-q", str(root), str(clone)], check=True)
    assert bk.source_commit(clone) == head.strip()  # a clean checkout
    script = clone / "leanrl" / "dqn.py"
    script.write_text(script.read_text() + "\n")
    assert bk.source_commit(clone) == head.strip() + " + uncommitted changes"
    assert bk.source_commit(clone / "leanrl") is None  # a copy inside another project's checkout is not that project
    monkeypatch.setenv("LEANRL_COMMIT", "feed123")  # named: it wins over a .git that may be stale (a GPU machine's)
    assert bk.source_commit(clone) == "feed123"
    monkeypatch.delenv("LEANRL_COMMIT")
    (tmp_path / "bare").mkdir()
    assert bk.source_commit(tmp_path / "bare") is None  # no checkout


# ---------------------------------------------------------------- a run of seeds (--num-seeds)


def test_the_aggregate_of_seeds_is_mean_std_iqm_and_fraction_solved():
    """Nine seeds, one without an episode: the mean, std (ddof 0) and interquartile mean (a quarter of the eight, two,
    cut from each end) of the eight, and the fraction of all nine at 475 or above (475 counts), worked by hand."""
    means = [10.0, 500.0, 480.0, None, 30.0, 475.0, 200.0, 100.0, 300.0]
    got = bk.aggregate(means, 475.0)
    have = [10.0, 30.0, 100.0, 200.0, 300.0, 475.0, 480.0, 500.0]
    mean = 2095.0 / 8
    assert got["num_seeds"] == 9 and got["mean"] == pytest.approx(mean)
    assert got["std"] == pytest.approx(math.sqrt(sum((m - mean) ** 2 for m in have) / 8))
    assert got["iqm"] == pytest.approx((100.0 + 200.0 + 300.0 + 475.0) / 4)
    assert got["solved_at"] == 475.0 and got["solved"] == pytest.approx(3 / 9)
    assert bk.aggregate([None, None], 475.0) == dict(num_seeds=2, mean=None, std=None, iqm=None, solved_at=475.0,
                                                      solved=0.0)  # fmt: skip


def test_a_run_of_seeds_writes_each_seeds_curve_and_means_over_seeds(tmp_path):
    """Seeds 5 and 6 (seed 5: 120 episodes, its last 100 of return 1..; seed 6: 2 episodes of 10): the curve has a
    seed column; mean_return is the mean of the two seeds' last-100 means, not of the last 100 episodes of both."""

    def body(run):
        for i in range(120):
            run.episode(10 * (i + 1), float(i % 7), seed=5)
        run.episode(1200, 10.0, seed=6)
        run.episode(1210, 10.0, seed=6)
        run.tick(1210)

    code, line = run_to_end(tmp_path, body, seeds=[5, 6], solved_at=9.5)
    seed5 = statistics.fmean([float(i % 7) for i in range(20, 120)])
    assert code is None and line["mean_return"] == pytest.approx((seed5 + 10.0) / 2) and line["episodes"] == 122
    assert line["seeds"] == dict(seed=[5, 6], mean_return=[pytest.approx(seed5), 10.0], episodes=[120, 2])
    assert line["aggregate"]["solved"] == 0.5 and line["aggregate"]["mean"] == pytest.approx(line["mean_return"])
    rows = (tmp_path / line["run_name"] / "returns.csv").read_text().splitlines()
    assert rows[0] == "step,wall_s,return,seed" and rows[-1].split(",")[2:] == ["10.0", "6"]
    assert [row.split(",")[3] for row in rows[1:]] == ["5"] * 120 + ["6"] * 2
