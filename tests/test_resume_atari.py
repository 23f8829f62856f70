"""A stopped run goes on (issue 41), for the envpool DQN and PQN pairs. Envpool's games cannot be saved: a resumed run
starts new games from its own reset, so it is compared with another resume of the same state, not with the run never
stopped. Each script stopped by SIGTERM at an iteration's end writes a state that a fresh process loads as it was
written (networks, optimizers, step, last losses, RNGs, DQN's replay memory with its count, the new games' reset stored
as their start, their scores from 0); two resumes of one state give the same numbers; a twin resumed under the capture
stand-in equals it resumed uncaptured; DQN's --no-save-replay resumes from an empty memory."""

import copy
import io
import os
import subprocess
import sys
from contextlib import redirect_stdout
from unittest import mock

import numpy as np
import pytest
import torch
from conftest import ROOT, load_script
from gpu_standin import run_main
from test_resume import assert_same, copy_of, results, resumed_captured_and_not, run_folder, sigterm_at, snapshot

from leanrl import bookkeeping as bk

DQN, DQN_TWIN = "dqn_atari_envpool", "dqn_atari_envpool_torchcompile"
PQN, PQN_TWIN = "pqn_atari_envpool", "pqn_atari_envpool_torchcompile"
SCRIPTS = (DQN, DQN_TWIN, PQN, PQN_TWIN)
MODULES = {name: load_script(name) for name in SCRIPTS}
# DQN: 360 steps of 2 envs, learning from step 100, a gradient step every 4, target copies every 100 steps, log points
# every 100; the memory (50 transitions an env) wraps before the stop at step 320. PQN: 11 iterations of 2 envs x 32
# steps, 2 epochs of 2 minibatches, stopped after the 5th: the 6 resumed ones capture every graph and replay it. Seed
# 3 ends two games on each side of the stop (Breakout's first ones take 120 to 150 steps of an env)
DQN_FLAGS = ["--num-envs", "2", "--buffer-size", "100", "--learning-starts", "100", "--batch-size", "8"]
DQN_FLAGS += ["--target-network-frequency", "100", "--total-timesteps", "720"]
PQN_FLAGS = ["--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "2"]
PQN_FLAGS += ["--total-timesteps", "704"]
FLAGS = {name: [*(DQN_FLAGS if "dqn" in name else PQN_FLAGS), "--measure-burnin", "1", "--seed", "3", "--save-model"]
         for name in SCRIPTS}  # fmt: skip
K = {name: 320 for name in SCRIPTS}  # the step SIGTERM stops at
TOTAL = {name: int(flags[flags.index("--total-timesteps") + 1]) for name, flags in FLAGS.items()}
NAMES = {  # what each script's training state holds
    DQN: {"q_network", "target_network", "optimizer", "out", "global_step", "envs", "replay"},
    PQN: {"q_network", "optimizer", "global_step", "envs"},
}
NAMES[DQN_TWIN], NAMES[PQN_TWIN] = NAMES[DQN], NAMES[PQN]
NEW_GAMES = f"envs not saved, {bk.ENVPOOL_NOT_SAVED}: a resumed run starts new episodes"


def main(name, flags, folder, cudagraphs=False):
    """main() of the script in this process on the CPU (a twin's --cudagraphs through the capture stand-in); returns
    the results lines in folder."""
    return run_main(
        MODULES[name], flags, folder, cudagraphs=cudagraphs, force_capturable=bool(cudagraphs), read=results
    )


def stopped_run(name, folder, flags=()):
    """The script's run stopped by SIGTERM at step K, in folder: its run folder."""
    with sigterm_at(K[name]), pytest.raises(SystemExit) as stopped:
        main(name, [*FLAGS[name], *flags], folder)
    assert stopped.value.code == 143  # 128 + SIGTERM
    [line] = results(folder)
    assert line["status"] == "interrupted" and line["steps"] == K[name] and line["resumed"] == 0, line
    return run_folder(folder)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """Each script's run stopped at step K: {name: (its run folder, its state when written, what the run printed)}."""
    runs, write = {}, bk.Run.write_state
    for name in SCRIPTS:
        taken = []

        def write_and_take(run, taken=taken):
            taken.append(snapshot(run))
            write(run)

        with mock.patch.object(bk.Run, "write_state", write_and_take), redirect_stdout(io.StringIO()) as out:
            run_dir = stopped_run(name, tmp_path_factory.mktemp(name))
        runs[name] = run_dir, *taken, out.getvalue()
    return runs


# ---------------------------------------------------------------- what is saved is what loads

# resumes each run in one new process and takes, where its loop would start, what its state is then (test_resume's
# snapshot) and what belongs to the new games (envs' last parts: DQN's last obs, the running game scores)
FRESH = """
import sys, torch
from unittest import mock
from conftest import load_script, main_args
from test_resume import snapshot
from leanrl import bookkeeping as bk
out, *jobs = sys.argv[1:]
taken = {}
def at_the_loop(run, iterable):
    taken[name] = dict(snapshot(run), games=[bk.pack(part) for part in run.state()["envs"][1:]])
    raise SystemExit(0)
with mock.patch.object(bk.Run, "progress", at_the_loop):
    for name, run_dir in zip(jobs[::2], jobs[1::2]):
        module = load_script(name)
        try:
            module.main(main_args(module, ["--resume", run_dir], run_dir + ".results"))
        except SystemExit as stop:
            if stop.code:  # not at_the_loop's: the resume failed
                raise
torch.save(taken, out)
"""


@pytest.fixture(scope="module")
def fresh(stopped, tmp_path_factory):
    """{name: what the script's state was at its loop's start, resumed in a new process}: one process for all four."""
    tmp = tmp_path_factory.mktemp("fresh")
    jobs = [str(part) for name in SCRIPTS for part in (name, copy_of(stopped[name][0], tmp / name))]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT)]), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", FRESH, str(tmp / "taken.pt"), *jobs], capture_output=True, text=True,
                          env=env, cwd=tmp, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(tmp / "taken.pt", weights_only=False)


def with_new_games(replay, reset_obs):
    """The replay memory as the resumed run makes it before its loop: the new games' first frames appended, each the
    start of a game, the step data before them zero (no transition reads them)."""
    replay = copy.deepcopy(replay)
    n, slots = int(replay["count"]), replay["frames"].shape[1]
    replay["frames"][:, n % slots] = torch.as_tensor(reset_obs)[:, -1]
    replay["first"][:, n % slots] = True
    for key in ("actions", "rewards", "terminations"):
        replay[key][:, (n - 1) % slots] = 0
    replay["count"] += 1
    return replay


@pytest.mark.parametrize("name", SCRIPTS)
def test_the_state_loads_in_a_fresh_process_as_it_was_written(name, stopped, fresh):
    """The state the stopped run wrote, resumed in a new process, at the loop's start: every tensor of the networks
    (DQN's target network too), of the optimizer (Adam's or RAdam's moments and steps), the global step (the epsilon and
    lr schedules' position), DQN's last losses, Python's, numpy's and torch's RNG states, the run's episodes and counts,
    exactly as written; DQN's replay memory and its count as written, the new games' reset frames appended as games'
    starts. The envs are not saved (said when written): the last obs is this process's reset, the game scores 0."""
    run_dir, at_write, printed = stopped[name]
    restored = fresh[name]
    parts = at_write["parts"]
    assert set(parts) == NAMES[name] and parts["envs"] == {bk.NOT_SAVED: bk.ENVPOOL_NOT_SAVED}
    assert parts["global_step"] == K[name] and at_write["run"]["steps"] == K[name] and parts["optimizer"]["state"]
    assert NEW_GAMES in printed
    *reset_obs, scores = restored["games"]
    assert not scores.any(), "the new games' scores go on from the old games'"
    if "dqn" in name:
        slots = parts["replay"]["frames"].shape[1]
        assert parts["out"] is not None and int(parts["replay"]["count"]) == K[name] // 2 + 1 > slots  # wrapped
        want = MODULES[name].make_env("Breakout-v5", 2, 3).reset()[0]  # the resumed run's own reset, seeded
        assert np.array_equal(reset_obs[0].numpy(), want)
        at_write = copy.deepcopy(at_write)
        at_write["parts"]["replay"] = with_new_games(parts["replay"], want)
    assert_same(at_write, {key: restored[key] for key in at_write})


def test_a_twins_tensor_lr_stays_its_own_tensor_when_its_optimizer_is_restored():
    """The PQN Atari twin's RAdam reads its lr from a tensor on the device that its graphs read too: the resume copies
    the saved lr into that tensor (load_state_dict alone would put a CPU copy of the saved one in its place, which a
    CUDA graph would read as a constant). Moments and steps restored as saved."""
    params = [torch.nn.Parameter(torch.randn(3))]
    saved_optimizer = torch.optim.RAdam(params, lr=torch.tensor(0.25))
    params[0].grad = torch.randn(3)
    saved_optimizer.step()
    saved = copy.deepcopy(bk.pack(saved_optimizer))
    lr = torch.tensor(1.0)
    live = torch.optim.RAdam([torch.nn.Parameter(torch.zeros(3))], lr=lr)
    assert bk.unpack(live, saved) is live
    assert live.param_groups[0]["lr"] is lr and lr.item() == 0.25
    assert_same(bk.pack(live)["state"], saved["state"], "RAdam's state")


# ---------------------------------------------------------------- resumed twice: the same numbers


def curve(run_dir):
    """returns.csv's step and return columns."""
    return [row.split(",")[::2] for row in (run_dir / "returns.csv").read_text().splitlines()[1:]]


def assert_same_runs(name, lines, dirs):
    """Two resumed runs of one state: the same results, return curve, model and last state."""
    for key in ("steps", "episodes", "mean_return", "losses"):
        assert lines[0][key] == lines[1][key], key
    assert lines[0]["losses"] and curve(dirs[0]) == curve(dirs[1])
    models = [torch.load(d / f"{name}.pt", weights_only=True)["model"] for d in dirs]
    assert_same(*models, where="the saved model")
    states = [torch.load(d / bk.STATE_FILE, weights_only=True) for d in dirs]
    assert_same(states[0]["state"], states[1]["state"], "the last state")
    assert_same(states[0]["rng"], states[1]["rng"], "the RNGs")
    for key in ("iterations", "steps", "ticks", "returns"):
        assert states[0]["run"][key] == states[1]["run"][key], key


@pytest.mark.parametrize("name", SCRIPTS)
def test_two_resumes_of_one_state_give_the_same_numbers(name, stopped, tmp_path, capsys):
    """One state resumed twice with only --resume, the second also writing its state every 0.3 s as it goes: the same
    losses, episodes, return curve, model and last state (networks, optimizer, DQN's memory, RNGs). Each goes on to the
    total, keeps the curve of the stopped part and says it starts new games."""
    run_dir, at_write, _ = stopped[name]
    lines, dirs = [], []
    for i, flags in enumerate([[], ["--checkpoint-every-min", "0.005"]]):
        folder = tmp_path / str(i)
        dirs.append(copy_of(run_dir, folder))
        capsys.readouterr()
        [line] = main(name, ["--resume", str(dirs[-1]), *flags], folder)
        lines.append(line)
        assert line["status"] == "ok" and line["resumed"] == 1 and line["run_name"] == run_dir.name, line
        assert line["steps"] == TOTAL[name] and line["episodes"] > len(at_write["run"]["returns"]) > 0
        out = capsys.readouterr().out
        assert f"resumed without its envs ({bk.ENVPOOL_NOT_SAVED}): it starts new episodes" in out
    assert curve(dirs[0])[: len(at_write["run"]["returns"])] == curve(run_dir)
    assert_same_runs(name, lines, dirs)


@pytest.mark.parametrize("name", [DQN_TWIN, PQN_TWIN])
def test_a_resumed_twin_under_the_capture_stand_in_equals_the_resumed_twin_uncaptured(name, stopped, tmp_path):
    """One state resumed with --cudagraphs under the CPU capture stand-in (every graph captured after the resume and
    replayed; the optimizer capturable whatever the stopped run's was) and with the same code path uncaptured: the
    same losses, episodes, return curve, model and last state."""
    run_dir = stopped[name][0]
    lines, dirs = resumed_captured_and_not(main, name, run_dir, tmp_path, min_graphs=3)
    assert_same_runs(name, lines, dirs)


# ---------------------------------------------------------------- --no-save-replay


@pytest.mark.parametrize("name", [DQN, DQN_TWIN])
def test_no_save_replay_leaves_the_memory_out_and_the_resumed_run_starts_with_it_empty(name, stopped, tmp_path, capsys):
    """The stopped run resumed with --no-save-replay and stopped again one iteration later: its state holds no replay
    memory (said when written). Resumed from it, the run starts from an empty memory (only the new games' first frames,
    count 1) with the networks as saved, and learns from what it gathers (its log point at step 400 reads new losses;
    SIGTERM stops it at 402, a state without the memory written again)."""
    run_dir = copy_of(stopped[name][0], tmp_path)
    with sigterm_at(K[name] + 2), pytest.raises(SystemExit):
        main(name, ["--resume", str(run_dir), "--no-save-replay"], tmp_path)
    blob = torch.load(run_dir / bk.STATE_FILE, weights_only=True)
    assert blob["state"]["replay"] == {bk.NOT_SAVED: "--no-save-replay"} and blob["state"]["global_step"] == K[name] + 2
    out = capsys.readouterr().out
    assert "replay not saved, --no-save-replay: a resumed run starts with an empty replay memory" in out
    taken, progress = {}, bk.Run.progress

    def at_the_loop(run, iterable):
        taken.update(copy.deepcopy({key: bk.pack(run.state()[key]) for key in ("q_network", "replay")}))
        return progress(run, iterable)

    with mock.patch.object(bk.Run, "progress", at_the_loop), sigterm_at(402), pytest.raises(SystemExit):
        main(name, ["--resume", str(run_dir)], tmp_path)
    assert "resumed without its replay (--no-save-replay): it starts with an empty replay memory" in (
        capsys.readouterr().out
    )
    replay = taken["replay"]
    assert int(replay["count"]) == 1 and replay["first"][:, 0].all() and replay["frames"][:, 0].any()
    assert not (replay["first"][:, 1:].any() or replay["frames"][:, 1:].any()), "frames of the old games"
    assert not any(replay[key].any() for key in ("actions", "rewards", "terminations")), "steps of the old games"
    assert_same(taken["q_network"], blob["state"]["q_network"], "the Q-network")
    lines = results(tmp_path)
    assert [line["status"] for line in lines] == ["interrupted", "interrupted"] and lines[-1]["resumed"] == 2
    assert lines[-1]["steps"] == 402 and lines[-1]["losses"]["td_loss"] >= 0
    assert lines[-1]["losses"] != blob["run"]["losses"], "no log point after the resume"
    assert torch.load(run_dir / bk.STATE_FILE, weights_only=True)["state"]["replay"] == blob["state"]["replay"]
