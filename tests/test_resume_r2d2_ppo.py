"""A stopped run goes on (issue 41), for the R2D2 and PPO Atari pairs.

R2D2 on masked CartPole, its envs made savable (SavableCartPole: gymnasium's CartPole stepped as the script steps
envpool's, which cannot be saved): stopped by SIGTERM at an iteration's end and resumed, it gives exactly the numbers
of the run never stopped (losses, curve, model, the last state: networks, Adam, the replay memory with its priorities
and stored LSTM states, the envs with the LSTM state and running returns, the RNGs); the state loads in a fresh
process as it was written; the twin resumed under the capture stand-in equals the twin resumed uncaptured. With
envpool's own CartPole the envs are not saved: the resumed run starts new episodes, their first obs an episode's start
in the memory; --no-save-replay leaves the memory out, the resumed run fills a new one before it learns again.
"""

import os
import subprocess
import sys
from contextlib import contextmanager
from unittest import mock

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import ROOT, load_script
from gpu_standin import run_main
from test_resume import (
    assert_same,
    assert_same_ends,
    copy_of,
    results,
    resumed_captured_and_not,
    run_folder,
    sigterm_at,
    snapshot,
)

from leanrl import bookkeeping as bk

R2D2, R2D2_TWIN = "r2d2_atari_envpool", "r2d2_atari_envpool_torchcompile"
MODULES = {name: load_script(name) for name in (R2D2, R2D2_TWIN)}
# tests/test_r2d2_atari_envpool.py's TINY_CARTPOLE, masked: 150 iterations of 4 envs, learning from step 200 with a
# gradient step every 8 steps and a target copy every 10 of them; stopped at step 408, between target copies and log
# points, after 26 gradient steps (priorities written back, the running max moved) and with episodes under way
R2D2_FLAGS = ["--env-id", "CartPole-v1", "--mask-velocity", "--num-envs", "4", "--hidden-size", "16", "--burn-in", "1"]
R2D2_FLAGS += ["--seq-len", "3", "--overlap", "1", "--batch-size", "8", "--train-frequency", "8"]
R2D2_FLAGS += ["--buffer-size", "400", "--learning-starts", "200", "--target-network-frequency", "10"]
R2D2_FLAGS += ["--measure-burnin", "1", "--total-timesteps", "600", "--seed", "3", "--save-model"]
K = 408  # 102 iterations: not a log point (every 100 steps); the next iteration starts a sequence with the LSTM
# state restored
UPDATES_AT_K = 26  # the gradient steps at steps 200, 208, ..., 400


class SavableCartPole(gym.vector.VectorEnv):
    """gymnasium's CartPole-v1 as the script steps envpool's (an env resets at the step after its episode's end, and
    infos["elapsed_step"] is 0 at a reset obs), in a gymnasium vector env, which a state saves: the resumed run goes
    on with its episodes, so it can give the numbers of the run never stopped."""

    def __init__(self, num_envs, seed):
        self.envs, self.first_seed = [gym.make("CartPole-v1") for _ in range(num_envs)], seed
        self.action_space, self.observation_space = self.envs[0].action_space, self.envs[0].observation_space
        self.elapsed, self.ended = np.zeros(num_envs, np.int64), np.zeros(num_envs, bool)

    def reset(self, **kwargs):
        self.elapsed[:], self.ended[:] = 0, False
        return np.stack([env.reset(seed=self.first_seed + i)[0] for i, env in enumerate(self.envs)]), {}

    def step(self, actions):
        steps = [
            (env.reset()[0], 0.0, False, False) if ended else env.step(int(action))[:4]
            for env, action, ended in zip(self.envs, actions, self.ended)
        ]
        obs, rewards, terminations, truncations = (np.array(column) for column in zip(*steps))
        self.elapsed = np.where(self.ended, 0, self.elapsed + 1)
        self.ended = terminations | truncations
        return obs, rewards.astype(np.float32), terminations, truncations, {"elapsed_step": self.elapsed.copy()}

    def close(self):
        for env in self.envs:
            env.close()


def savable_envs(module):
    return mock.patch.object(module, "make_env", lambda env_id, num_envs, seed: SavableCartPole(num_envs, seed))


def main(name, flags, folder, cudagraphs=False, savable=True):
    """main() of the script in this process on the CPU (the twin's --cudagraphs through the capture stand-in), its envs
    SavableCartPole unless savable=False (envpool's); returns the results lines in folder."""
    with savable_envs(MODULES[name]) if savable else mock.MagicMock():
        return run_main(
            MODULES[name], flags, folder, cudagraphs=cudagraphs, force_capturable=bool(cudagraphs), read=results
        )


@contextmanager
def taking_states(taken):
    """Each state the run writes is also appended to `taken` as it is then (snapshot: the replay memory included)."""
    write = bk.Run.write_state

    def write_and_take(run):
        taken.append(snapshot(run))
        write(run)

    with mock.patch.object(bk.Run, "write_state", write_and_take):
        yield


def stopped_run(name, folder, flags=(), savable=True, taken=None):
    """R2D2_FLAGS stopped by SIGTERM at step K, in folder: its run folder; `taken`: a list that gets the state as it
    was when written (snapshot)."""
    with sigterm_at(K), taking_states([] if taken is None else taken), pytest.raises(SystemExit) as stopped:
        main(name, [*R2D2_FLAGS, *flags], folder, savable=savable)
    assert stopped.value.code == 143  # 128 + SIGTERM
    [line] = results(folder)
    assert line["status"] == "interrupted" and line["steps"] == K and line["resumed"] == 0, line
    return run_folder(folder)


def curve(run_dir):
    """returns.csv's step and return columns."""
    return [row.split(",")[::2] for row in (run_dir / "returns.csv").read_text().splitlines()[1:]]


SAME = ("steps", "episodes", "mean_return", "losses", "updates")


@pytest.mark.parametrize("name", [R2D2, R2D2_TWIN])
def test_r2d2_stopped_by_sigterm_and_resumed_gives_the_numbers_of_the_run_never_stopped(name, tmp_path):
    """R2D2_FLAGS with its seed: once through, and stopped by SIGTERM at step K then resumed with only --resume: the
    same losses, gradient steps, episodes, return curve, model and last state (target network, Adam, the memory's
    frames, priorities, sum tree, stored LSTM states and write count, the envs with the actor's LSTM state, previous
    action and reward and running returns, the RNGs)."""
    whole, folder = tmp_path / "whole", tmp_path / "stopped"
    [line] = main(name, R2D2_FLAGS, whole)
    run_dir = stopped_run(name, folder)
    state = torch.load(run_dir / bk.STATE_FILE, weights_only=True)["state"]
    store, begun = state["replay"]
    global_step, updates, logged, out = state["progress"]
    assert global_step == K and updates == UPDATES_AT_K and logged == 25 and begun == 0, "nothing to compare"
    assert int(store["count"]) == K // 4 + 1 and (store["tree"] > 0).sum() > 10 and store["h"].abs().sum() > 0
    assert set(state["envs"][0]) == {"env_data"} and state["envs"][2][0].abs().sum() > 0  # the actor's LSTM
    last = main(name, ["--resume", str(run_dir)], folder)[-1]
    assert last["status"] == "ok" and last["resumed"] == 1 and last["run_name"] == run_dir.name, last
    for key in SAME:
        assert last[key] == line[key], key
    whole_dir = run_folder(whole)
    assert curve(run_dir) == curve(whole_dir)
    assert int(curve(run_dir)[0][0]) <= K < int(curve(run_dir)[-1][0])  # episodes on both sides of K
    assert_same_ends(name, whole_dir, run_dir)


# loads the script in a fresh process, resumes the run and, where the loop would start, writes what its state is
FRESH = """
import sys, torch
from contextlib import contextmanager
from unittest import mock
from conftest import load_script, main_args
from test_resume import snapshot
from test_resume_r2d2_ppo import savable_envs
from leanrl import bookkeeping as bk
name, run_dir, out, savable = sys.argv[1:]
def taken(run, iterable):
    torch.save(snapshot(run), out)
    raise SystemExit(0)
module = load_script(name)
with mock.patch.object(bk.Run, "progress", taken), savable_envs(module) if savable == "1" else mock.MagicMock():
    module.main(main_args(module, ["--resume", run_dir], out + ".results"))
"""


def resumed_in_a_fresh_process(name, run_dir, folder, savable=True):
    """What the state is in a new process once --resume restored it (snapshot, where the loop starts)."""
    out = folder / "restored.pt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), str(ROOT)]), CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-c", FRESH, name, str(copy_of(run_dir, folder)), str(out), "1" if savable else "0"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=folder, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out, weights_only=False)


def test_r2d2_state_loads_in_a_fresh_process_as_it_was_written(tmp_path):
    """r2d2_atari_envpool.py stopped at step K: in a new process after --resume, every tensor of both networks, Adam's
    moments and steps, the memory (frames, flags, priorities, sum tree and its max, stored LSTM states, write count),
    the envs (sub-envs, last obs, the actor's LSTM state, previous action and reward, running returns), the counters
    and the RNG states are exactly what they were when the state was written."""
    taken = []
    run_dir = stopped_run(R2D2, tmp_path / "stopped", taken=taken)
    [at_write] = taken
    assert at_write["parts"]["progress"][0] == K and at_write["run"]["iterations"] == K // 4
    assert at_write["parts"]["optimizer"]["state"] and "env_data" in at_write["parts"]["envs"][0]
    assert (at_write["parts"]["replay"][0]["tree"] > 0).sum() > 10, "nothing to compare"
    assert_same(at_write, resumed_in_a_fresh_process(R2D2, run_dir, tmp_path))


def test_r2d2_twin_resumed_under_the_capture_stand_in_equals_the_twin_resumed_uncaptured(tmp_path):
    """One state (the twin stopped at step K) resumed twice, with --cudagraphs under the CPU capture stand-in (the
    policy step, the replay write and the update captured after the resume, Adam capturable) and with the same code
    path uncaptured: the same losses, gradient steps, episodes, return curve and model."""
    run_dir = stopped_run(R2D2_TWIN, tmp_path / "stopped")
    lines, dirs = resumed_captured_and_not(main, R2D2_TWIN, run_dir, tmp_path, min_graphs=3)
    for key in SAME:
        assert lines[0][key] == lines[1][key], key
    assert curve(dirs[0]) == curve(dirs[1]) and len(curve(dirs[0])) > 10
    models = [torch.load(d / f"{R2D2_TWIN}.pt", weights_only=True)["model"] for d in dirs]
    assert_same(*models, where="the saved model")


def test_r2d2_on_envpool_resumes_with_new_episodes_and_no_save_replay_fills_a_new_memory(tmp_path, capsys):
    """envpool's CartPole (it cannot be saved): the state holds no envs, the resumed run resets them and its first obs
    begins an episode in the memory (the step two back ends the last one: no n-step return reaches across); two resumes
    of one state give the same numbers. --no-save-replay: no memory in the state; the resumed run starts a new one at
    its own stream position 0 and learns again once it holds --learning-starts more steps (no draw from an empty sum
    tree, no sequence of frames never written)."""
    run_dir = stopped_run(R2D2, tmp_path / "stopped", savable=False)
    assert f"envs not saved, {bk.ENVPOOL_NOT_SAVED}: a resumed run starts new episodes" in (capsys.readouterr().out)
    restored = resumed_in_a_fresh_process(R2D2, run_dir, tmp_path, savable=False)
    store = restored["parts"]["replay"][0]
    at = K // 4 % store["frames"].shape[1]  # the slot of the obs' stream position
    reset = MODULES[R2D2].make_env("CartPole-v1", 4, 3).reset()[0][:, [0, 2]]
    assert (
        torch.equal(store["frames"][:, at], torch.as_tensor(reset, dtype=torch.float32)) and store["first"][:, at].all()
    )
    assert store["truncations"][:, at - 2].all() and not store["truncations"][:, at - 1].any()
    lines = []
    for i in range(2):
        folder = tmp_path / f"resumed{i}"
        lines.append(main(R2D2, ["--resume", str(copy_of(run_dir, folder))], folder, savable=False)[-1])
    assert lines[0]["status"] == "ok" and lines[0]["updates"] == (600 - 200) // 8
    assert {key: lines[0][key] for key in SAME} == {key: lines[1][key] for key in SAME}

    folder = tmp_path / "no_replay"
    run_dir = stopped_run(R2D2, folder, flags=["--no-save-replay"], savable=False)
    assert torch.load(run_dir / bk.STATE_FILE, weights_only=True)["state"]["replay"] == {
        bk.NOT_SAVED: "--no-save-replay"
    }
    with taking_states(taken := []):
        last = main(R2D2, ["--resume", str(run_dir), "--total-timesteps", "1000"], folder, savable=False)[-1]
    assert last["status"] == "ok" and last["steps"] == 1000, last
    assert last["updates"] == UPDATES_AT_K + 49  # learning again 200 steps after the resume: at 608, 616, ..., 992
    store, begun = taken[-1]["parts"]["replay"]  # the memory at the end
    # exactly the sequences whose frames the new memory holds can be drawn: those from its stream position 0 whose
    # 4 frames are written and not overwritten (100 frames per env; a sequence leaves 2 writes before its first goes)
    starts, count, leaves = store["starts"], int(store["count"]), store["tree"][store["tree"].shape[0] // 2 :]
    assert begun == K // 4 and count == (1000 - K) // 4 + 1
    drawable = (starts + 4 <= count) & (count < starts + 100 - 2)
    assert torch.equal(leaves[: len(starts)] > 0, drawable) and drawable.sum() > 10


# ---------------------------------------------------------------- PPO Atari: envpool's games, which cannot be saved

PPO, PPO_TWIN = "ppo_atari_envpool", "ppo_atari_envpool_torchcompile"
MODULES |= {name: load_script(name) for name in (PPO, PPO_TWIN)}
# 5 iterations of 2 envs x 16 steps on Breakout, 2 epochs of 2 minibatches each; stopped at the end of the 2nd
PPO_FLAGS = ["--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--update-epochs", "2"]
PPO_FLAGS += ["--total-timesteps", "160", "--measure-burnin", "1", "--seed", "3", "--save-model"]
PPO_K = 64


def ppo_stopped(name, folder, taken):
    """PPO_FLAGS stopped by SIGTERM at step PPO_K, in folder: its run folder; `taken` gets the state as written."""
    with sigterm_at(PPO_K), taking_states(taken), pytest.raises(SystemExit) as stopped:
        main(name, PPO_FLAGS, folder, savable=False)
    assert stopped.value.code == 143
    [line] = results(folder)
    assert line["status"] == "interrupted" and line["steps"] == PPO_K, line
    return run_folder(folder)


@pytest.mark.parametrize("name", [PPO, PPO_TWIN])
def test_ppo_atari_state_loads_in_a_fresh_process_and_two_resumes_give_the_same_numbers(name, tmp_path, capsys):
    """The script stopped by SIGTERM at the end of iteration 2: the network, Adam's moments, steps and lr, the global
    step and the RNGs load in a new process exactly as written (the envs are not saved: envpool's games); resumed
    twice from that state, the runs give the same losses, games, curve and model, and anneal the lr from iteration 3
    on (the last iteration's lr: 1/5 of --learning-rate)."""
    taken = []
    run_dir = ppo_stopped(name, tmp_path / "stopped", taken)
    [at_write] = taken
    assert f"envs not saved, {bk.ENVPOOL_NOT_SAVED}: a resumed run starts new episodes" in (capsys.readouterr().out)
    parts = at_write["parts"]
    assert parts["global_step"] == PPO_K and at_write["run"]["iterations"] == 2 and parts["optimizer"]["state"]
    assert float(parts["optimizer"]["param_groups"][0]["lr"]) == pytest.approx(2.5e-4 * (1 - 1 / 5))
    restored = resumed_in_a_fresh_process(name, run_dir, tmp_path, savable=False)
    saved = torch.load(run_dir / bk.STATE_FILE, weights_only=True)["state"]
    assert saved["envs"] == {bk.NOT_SAVED: bk.ENVPOOL_NOT_SAVED}
    del at_write["parts"]["envs"], restored["parts"]["envs"]  # the resumed run's own (new games)
    assert_same(at_write, restored)
    lines, dirs = [], []
    for i in range(2):
        folder = tmp_path / f"resumed{i}"
        dirs.append(copy_of(run_dir, folder))
        with taking_states(taken := []):
            lines.append(main(name, ["--resume", str(dirs[-1])], folder, savable=False)[-1])
        assert taken[-1]["parts"]["global_step"] == 160
        assert float(taken[-1]["parts"]["optimizer"]["param_groups"][0]["lr"]) == pytest.approx(2.5e-4 / 5)
    assert lines[0]["status"] == "ok" and lines[0]["resumed"] == 1 and lines[0]["steps"] == 160, lines[0]
    for key in ("steps", "episodes", "mean_return", "losses"):
        assert lines[0][key] == lines[1][key], key
    assert curve(dirs[0]) == curve(dirs[1])
    models = [torch.load(d / f"{name}.pt", weights_only=True)["model"] for d in dirs]
    assert_same(*models, where="the saved model")


def test_an_optimizer_tensor_lr_keeps_its_tensor_and_takes_the_saved_value():
    """A twin's lr is a tensor its compiled and captured graphs read (annealed in place): restoring Adam keeps that
    tensor (torch's load_state_dict alone would put the saved one, on the CPU, in its place) and copies the saved
    value into it; the moments and step are the saved ones."""
    params = [torch.nn.Parameter(torch.randn(3))]
    saved_adam = torch.optim.Adam(params, lr=torch.tensor(0.5), fused=True)
    params[0].grad = torch.randn(3)
    saved_adam.step()
    saved = bk.pack(saved_adam)
    live_params = [torch.nn.Parameter(torch.randn(3))]
    lr = torch.tensor(0.1)
    live = torch.optim.Adam(live_params, lr=lr, fused=True)
    assert bk.unpack(live, saved) is live
    assert live.param_groups[0]["lr"] is lr and float(lr) == 0.5
    assert torch.equal(live.state[live_params[0]]["exp_avg"], saved_adam.state[params[0]]["exp_avg"])


def test_views_of_one_byte_buffer_as_other_dtypes_are_saved_and_restored_in_place(tmp_path):
    """The R2D2 twin's obs, previous reward and episode starts are views of its step upload's byte buffer (issue 42):
    torch.save refuses one storage under several dtypes, so a view of part of a storage is saved as a copy of its
    own, and a resume writes the saved values back through the live views, into the buffer."""
    buffer = torch.zeros(32, dtype=torch.uint8)
    obs, rewards, first = (
        buffer[:16].view(torch.float32),
        buffer[16:24].view(torch.float32),
        buffer[24:28].view(torch.bool),
    )
    obs.copy_(torch.arange(4.0)), rewards.copy_(torch.tensor([1.5, -2.0])), first.copy_(torch.tensor([1, 0, 0, 1]))
    path = tmp_path / "state.pt"
    bk.atomic_save(bk.pack((buffer[:16], obs, rewards, first)), path)  # and a uint8 view of the same bytes
    saved = torch.load(path, weights_only=True)
    buffer.zero_()
    live = (buffer[:16], obs, rewards, first)
    assert all(a is b for a, b in zip(bk.unpack(live, saved), live, strict=True))
    assert obs.tolist() == [0.0, 1.0, 2.0, 3.0] and rewards.tolist() == [1.5, -2.0] and first.tolist() == [1, 0, 0, 1]
