"""The Atari twins' --async-envs and --env-threads (issue 40): two env groups, one stepping while the policy acts for
the other, give each env the trajectory it has without them; the capture stand-in and the host-read budget hold with
the overlap on; bad values of the flags get one line and exit code 2."""

import importlib
from collections import defaultdict
from functools import partial

import numpy as np
import pytest
import torch
from conftest import (
    args_from_flags,
    assert_main_exits_2_with_one_line,
    curve_points,
    load_script,
    main_args,
    run_in,
    run_script,
)
from gpu_standin import host_reads, run_main, uploads
from regression import PAIRS

TWINS = ("pqn_atari_envpool_torchcompile", "ppo_atari_envpool_torchcompile")


@pytest.fixture(scope="module")
def mods():
    return {name: load_script(name) for name in TWINS}


@pytest.fixture(autouse=True)
def twin_settings():
    """The twins switch argument validation off and TF32 on for the process: leave the other tests as they were."""
    validate, precision = torch.distributions.Distribution._validate_args, torch.get_float32_matmul_precision()
    yield
    torch.distributions.Distribution.set_default_validate_args(validate)
    torch.set_float32_matmul_precision(precision)


def fixed_policy(network, obs, actions, *storage_and_step):
    """A policy step with the twins' signature whose action is a fixed function of the observation (no random draw):
    a weighted sum of each env's pixels (a ball a pixel away changes it) folded onto the 4 Breakout actions. The other
    storage rows get the frames' mean."""
    *storage, step = storage_and_step
    frames = obs[step].flatten(0, 1).flatten(1).long()
    action = (frames * (torch.arange(frames.shape[1]) % 7 + 1)).sum(1) % 4
    actions[step] = action
    for rows in storage:
        if rows.dim() == 2:  # values (and logprobs): (T, envs); PQN's epsilons, (T,), are an input
            rows[step] = frames.float().mean(1) / 255.0
    return action


class Recorder:
    """An envpool env that writes down, by global env id, every action it is sent and every step it returns."""

    def __init__(self, envs, first_env, trajectories):
        self.envs, self.first, self.trajectories = envs, first_env, trajectories
        self.observation_space, self.action_space = envs.observation_space, envs.action_space

    def reset(self):
        obs, info = self.envs.reset()
        for i, frames in enumerate(obs):
            self.trajectories[self.first + i].append(("reset", frames.copy()))
        return obs, info

    def send(self, action):
        for i, a in enumerate(action):
            self.trajectories[self.first + i].append(("action", int(a)))
        self.envs.send(action)

    def recv(self):
        obs, reward, terminations, truncations, info = self.envs.recv()
        for i in range(len(obs)):
            step = (obs[i].copy(), float(reward[i]), bool(terminations[i]), bool(truncations[i]))
            self.trajectories[self.first + i].append(("step", step, float(info["reward"][i])))
        return obs, reward, terminations, truncations, info

    def step(self, action):
        self.send(action)
        return self.recv()

    def close(self):
        self.envs.close()


FLAGS = ["--num-envs", "4", "--num-steps", "16", "--total-timesteps", "192", "--num-minibatches", "2"]
FLAGS += ["--update-epochs", "1", "--measure-burnin", "1", "--seed", "3"]


def recorded_run(module, flags, tmp_path, monkeypatch):
    """A run with the fixed policy and every env recorded; returns (trajectories by env id, results line, curve)."""
    trajectories, make_env = defaultdict(list), module.make_env
    args = main_args(module, flags, tmp_path)

    def recorded_make_env(env_id, num_envs, seed, *rest):
        return Recorder(make_env(env_id, num_envs, seed, *rest), seed - args.seed, trajectories)

    monkeypatch.setattr(module, "make_env", recorded_make_env)
    monkeypatch.setattr(module, "policy_step", fixed_policy)
    module.main(args)
    monkeypatch.undo()
    return trajectories, *run_in(tmp_path)


def same_trajectory(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g[0] == w[0]
        if g[0] == "reset":
            np.testing.assert_array_equal(g[1], w[1])
        elif g[0] == "action":
            assert g[1] == w[1]
        else:
            np.testing.assert_array_equal(g[1][0], w[1][0])
            assert g[1][1:] == w[1][1:] and g[2] == w[2]


@pytest.mark.parametrize("name", TWINS)
def test_each_env_steps_as_without_the_overlap(mods, name, tmp_path, monkeypatch):
    """With a policy that is a fixed function of the observation, every env (by its id across the groups) sees the
    same observations, actions, rewards and ends with --async-envs as without; so do the update (the same losses)
    and the return curve. A group's columns written into another's, or a group seeded as another, fails it."""
    module = mods[name]
    sync = recorded_run(module, FLAGS, tmp_path / "sync", monkeypatch)
    overlap = recorded_run(module, [*FLAGS, "--async-envs", "--env-threads", "-1"], tmp_path / "async", monkeypatch)
    (want, want_line, want_curve), (got, line, curve) = sync, overlap
    assert sorted(got) == sorted(want) == [0, 1, 2, 3]
    for env_id in want:
        assert sum(kind == "action" for kind, *_ in want[env_id]) == 192 // 4  # every env stepped every step
        same_trajectory(got[env_id], want[env_id])
    assert line["status"] == want_line["status"] == "ok" and line["steps"] == want_line["steps"] == 192
    assert line["losses"] == want_line["losses"]
    assert curve == want_curve


@pytest.mark.parametrize("name", TWINS)
def test_the_capture_stand_in_gives_the_numbers_of_the_run_without_it_with_the_overlap_on(mods, name, tmp_path):
    """--async-envs --cudagraphs under the CUDA-graph stand-in (each group's policy step its own graph) equals the
    same run with every graph called directly; a group's step goes up in one copy (issue 40), 2 groups x 320 steps."""
    flags = [*PAIRS[name.removesuffix("_torchcompile")], "--async-envs"]
    want_line, want_curve = run_main(mods[name], flags, tmp_path / "plain", cudagraphs="uncaptured")
    with uploads() as copies:
        line, curve = run_main(mods[name], flags, tmp_path / "captured", cudagraphs=True)
    pair_tests = importlib.import_module(f"test_{name.removesuffix('_torchcompile')}")
    assert dict(copies) == {**pair_tests.UPLOADS, pair_tests.STEP_UPLOAD: 640}
    assert line["status"] == want_line["status"] == "ok"
    assert (line["steps"], line["episodes"], curve) == (want_line["steps"], want_line["episodes"], want_curve)
    assert line["losses"] == want_line["losses"]


# With --async-envs at the regression flags (10 iterations of 2 envs x 32 steps: two groups of one env), the host reads
# of the pair's own budget (its test file) but for the actions: one read a group a step, 2 x 320
HOST_VIEWS = "host = staging.numpy()  # numpy's views of it, made once (a host tensor's: no sync)"
OVERLAP_READS = {
    "pqn_atari_envpool_torchcompile": {
        "tolist at bookkeeping.py: values = torch.stack([v.detach().float() for v in values]).tolist()": 10,
        "__bool__ at pqn_atari_envpool_torchcompile.py: optimizer = optim.RAdam(": 1,
        f"numpy at pqn_atari_envpool_torchcompile.py: {HOST_VIEWS}": 1,
    },
    "ppo_atari_envpool_torchcompile": {
        "tolist at ppo_atari_envpool_torchcompile.py: *logged, explained_var = torch.cat(logged).tolist()": 10,
        "__bool__ at ppo_atari_envpool_torchcompile.py: optimizer = optim.Adam(": 1,
        f"numpy at ppo_atari_envpool_torchcompile.py: {HOST_VIEWS}": 1,
    },
}


@pytest.mark.parametrize("name", TWINS)
def test_host_reads_with_the_overlap_are_one_action_read_a_group(mods, name, tmp_path):
    send = f"{name}.py: env_groups[group].send(action.cpu().numpy())"
    want = {f"cpu at {send}": 640, f"numpy at {send}": 640, **OVERLAP_READS[name]}
    with host_reads() as reads:
        line, _ = run_main(mods[name], [*PAIRS[name.removesuffix("_torchcompile")], "--async-envs"], tmp_path)
    assert line["status"] == "ok" and line["steps"] == 640
    assert dict(reads) == want


def test_env_threads_minus_one_are_the_cores_this_process_may_use(mods, monkeypatch):
    import os

    import envpool

    made = []
    monkeypatch.setattr(envpool, "make", lambda *args, **kwargs: made.append(kwargs["num_threads"]))
    for name in TWINS:
        mods[name].make_env("Breakout-v5", 2, 1, -1)
        mods[name].make_env("Breakout-v5", 2, 1)
        mods[name].make_env("Breakout-v5", 2, 1, 3)
    assert made == [len(os.sched_getaffinity(0)), 0, 3] * 2


@pytest.mark.parametrize("name", TWINS)
def test_the_fast_configuration_passes_the_twins_checks(mods, name, tmp_path):
    """FAST_FLAGS parse into the twin's Args and pass its checks (--no-anneal-lr once failed the check that learning
    rates are positive): check_args returns, nothing exits."""
    import shlex

    args = main_args(mods[name], shlex.split(mods[name].FAST_FLAGS), tmp_path)
    assert args.async_envs and args.env_threads == -1 and args.num_envs % 2 == 0
    mods[name].check_args(args)


BAD_INPUTS = [
    (("--async-envs", "True", "--num-envs", "3"), "--async-envs"),
    (("--env-threads", "-2"), "--env-threads"),
]


@pytest.mark.parametrize("name", TWINS)
@pytest.mark.parametrize("flags,flag", BAD_INPUTS, ids=[flag for _, flag in BAD_INPUTS])
def test_bad_input_exits_2_with_one_line(mods, name, flags, flag, capsys, tmp_path):
    args = args_from_flags(mods[name], flags)
    assert_main_exits_2_with_one_line(mods[name], name, args, flag, capsys, tmp_path)


# the fast configurations at a CPU budget: whole iterations (PQN 128 envs x 32 steps, PPO 60 envs x 128 steps)
CPU_BUDGET = {"pqn_atari_envpool_torchcompile": 36 * 4096, "ppo_atari_envpool_torchcompile": 13 * 7680}


@pytest.mark.slow
@pytest.mark.parametrize("name", TWINS)
def test_the_fast_configuration_learns_breakout_at_a_cpu_budget(mods, name, tmp_path):
    """The twin in its FAST_FLAGS on Breakout-v5, seed 1, at CPU_BUDGET steps (eager, no --compile): the mean score of
    the last 100 games is at least 1.3x that of the first 100 games, and 0.5 more. On the 2-core AMD EPYC, loaded by
    other jobs (load average 4-5), torch 2.13.0+cpu, 2026-11-28: PQN 147,456 steps in 16 min, 669 games, first 100
    games 1.02, last 100 2.67; PPO 99,840 steps in 25 min, 513 games, 1.15 then 1.85."""
    import shlex

    flags = [*shlex.split(mods[name].FAST_FLAGS), "--total-timesteps", str(CPU_BUDGET[name])]
    proc, lines = run_script(name, *flags, tmp_path=tmp_path, timeout=3600)
    assert proc.returncode == 0 and len(lines) == 1 and lines[0]["status"] == "ok", proc.stderr[-2000:]
    scores = [score for _, score in curve_points(lines[0], tmp_path)]
    first, last = float(np.mean(scores[:100])), float(np.mean(scores[-100:]))
    print(f"{name}: {len(scores)} games, first 100 {first:.2f}, last 100 {last:.2f}, wall {lines[0]['wall_s']:.0f} s")
    assert len(scores) >= 200 and last >= 1.3 * first and last >= first + 0.5


def bound_run(module, flags, monkeypatch, tmp_path):
    """A run of a twin in this process with every partial() main() makes recorded: (results line, the positional
    arguments of each partial in the order made, the copies of host data to the device by line)."""
    from gpu_standin import run_main, uploads

    bound = []

    def recording_partial(fn, *args, **kwargs):
        bound.append(args)
        return partial(fn, *args, **kwargs)

    monkeypatch.setattr(module, "partial", recording_partial)
    with uploads() as copies:
        line, _ = run_main(module, flags, tmp_path)
    return line, bound, dict(copies)


def assert_views_of_one_storage(obs, env_out, flat_obs, policy_obs):
    """obs (T + 1, B, 4, 84, 84) and env_out (T + 1, 2, B) are views of one byte buffer of rows (obs bytes, reward,
    done); the update's flat batch and each policy step's obs are views of it too, live: a write into the storage
    shows in them (a copy made when main() bound them would hand every update the first rollout's obs)."""
    rows, envs, obs_bytes = obs.shape[0], obs.shape[1], obs[0, 0].numel()
    storage = obs.untyped_storage()
    assert storage.nbytes() == rows * envs * (obs_bytes + 8)
    for view in (env_out, flat_obs, *policy_obs):
        assert view._is_view() and view.untyped_storage().data_ptr() == storage.data_ptr()
    assert flat_obs.shape == ((rows - 1) * envs,) + obs.shape[2:] and flat_obs.data_ptr() == obs.data_ptr()
    assert env_out.dtype == torch.float32 and env_out.shape == (rows, 2, envs)
    assert env_out.data_ptr() == obs.data_ptr() + obs_bytes  # env 0's reward follows its obs bytes
    with torch.no_grad():
        before = flat_obs[-1].clone()
        obs[-2, -1] += 1  # the last row of the flat batch: step T - 1, the last env
        assert torch.equal(flat_obs[-1], before + 1) and torch.equal(policy_obs[-1][-2, -1], before + 1)
        obs[-2, -1] -= 1


@pytest.mark.parametrize("async_envs", [False, True], ids=["sync", "async-envs"])
@pytest.mark.parametrize("name", TWINS)
def test_a_step_goes_up_in_one_copy_into_views_of_one_storage(mods, name, async_envs, monkeypatch, tmp_path):
    """Issue 40 item 1, one pinned upload a step: the obs, reward and done of a (group's) step go to the device in one
    non_blocking copy from the pinned buffer, straight into the byte storage whose views obs and env_out are; the
    policy steps, the returns (GAE, Q(lambda)) and the update are bound to views of it (the update's flat batch too:
    not a copy)."""
    pair_tests = importlib.import_module(f"test_{name.removesuffix('_torchcompile')}")
    flags = pair_tests.tiny_flags() + (["--async-envs"] if async_envs else [])
    line, bound, copies = bound_run(mods[name], flags, monkeypatch, tmp_path)
    assert line["status"] == "ok" and line["steps"] == 640
    steps = 320 * (2 if async_envs else 1)  # a copy a group a step
    assert copies == {**pair_tests.UPLOADS, pair_tests.STEP_UPLOAD: steps}
    *policies, (_, obs, env_out, *_), (_, _, flat_obs, *_) = bound
    assert len(policies) == (2 if async_envs else 1)
    assert_views_of_one_storage(obs, env_out, flat_obs, [policy[1] for policy in policies])
