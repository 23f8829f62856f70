"""PQN with CartPole-v1 on the device (leanrl/pqn_device_env.py): the tensor env against gymnasium's CartPole-v1 (one
step from random states in float32, whole trajectories with the vector env's autoreset in float64, a changed constant
caught), the episode statistics kept on the device, the compiled iteration against the eager one (no recompile), the
whole iteration captured on the CPU stand-in (host reads pinned: none inside an iteration), bad input, and learning."""

import csv
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
import tyro
from conftest import assert_finite_results_line, assert_summary_matches, load_script, main_in_process, run_script
from gpu_standin import CONTRACTS, host_reads, run_main
from test_gpu_path import same_run

NAME = "pqn_device_env"
script = load_script(NAME)

# a tiny run: 4 iterations of 64 envs x 16 steps, 2 epochs of 4 minibatches (of 256), at the twin's lr and epsilon
# schedule: at this file's lr (1e-3) the compiled run's float rounding (capturable RAdam's float32 bias corrections)
# grows to 3.3e-3 relative in the losses within 32 updates (measured), which would hide a real difference
ENVS, STEPS, ITERATIONS, EPOCHS, MINIBATCHES = 64, 16, 4, 2, 4
TINY = ["--num-envs", str(ENVS), "--num-steps", str(STEPS), "--total-timesteps", str(ITERATIONS * ENVS * STEPS),
        "--update-epochs", str(EPOCHS), "--num-minibatches", str(MINIBATCHES), "--learning-rate", "2.5e-4",
        "--exploration-fraction", "0.5"]  # fmt: skip


# ---------------------------------------------------------------- the env is CartPole-v1


def gym_one_steps(states, elapsed, actions):
    """gymnasium's CartPole-v1 (gym.make: TimeLimit and all) stepped once from each state, its TimeLimit at `elapsed`
    steps: (obs, reward, terminated, truncated, the float64 state reached), as numpy arrays."""
    env = gym.make("CartPole-v1")
    env.reset(seed=0)
    out = []
    for state, steps, action in zip(states.tolist(), elapsed.tolist(), actions.tolist(), strict=True):
        env.unwrapped.state = np.array(state, dtype=np.float64)
        env.unwrapped.steps_beyond_terminated = None
        env.get_wrapper_attr("_elapsed_steps")  # the TimeLimit wrapper's counter exists
        env.set_wrapper_attr("_elapsed_steps", steps)
        obs, reward, terminated, truncated, _ = env.step(action)
        out.append((obs, reward, terminated, truncated, np.array(env.unwrapped.state)))
    return [np.array(column) for column in zip(*out, strict=True)]


def random_states(n, seed):
    """States on both sides of every threshold (x 2.4, theta 12 degrees), velocities that cross them in one step, and
    episodes 0 to 499 steps old, a fifth of them one to four steps from the 500-step limit."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.tensor([2.6, 3.0, 0.25, 3.5])
    states = (torch.rand(n, 4, generator=g) * 2 - 1) * scale
    elapsed = torch.randint(0, 500, (n,), generator=g)
    near_limit = torch.rand(n, generator=g) < 0.2
    elapsed = torch.where(near_limit, torch.randint(496, 500, (n,), generator=g), elapsed)
    # and states at rest a hair inside and outside each threshold (x or theta unchanged by the step): an off-by-a-little
    # threshold, or > for >=, fails on these
    theta_limit = 12 * 2 * math.pi / 360
    edges = torch.tensor([sign * limit * (1 + d) for limit in (2.4, theta_limit) for sign in (-1, 1)
                          for d in (-1e-3, -1e-4, 1e-4, 1e-3)])  # fmt: skip
    for i, value in enumerate(edges.tolist()):
        coordinate = 0 if i < len(edges) // 2 else 2
        states[i, coordinate], states[i, coordinate + 1] = value, 0.0
    return states, elapsed, torch.randint(0, 2, (n,), generator=g)


def one_step_mismatches(n=6000, seed=0, **constants):
    """Step gymnasium's CartPole-v1 and cartpole_step (float32, as the script runs it) from the same n random states
    with the same actions; returns what differs, by field. A termination within float32 rounding of a threshold (the
    float64 state within 1e-5 of it) may go either way and is not compared; there are few of those."""
    states, elapsed, actions = random_states(n, seed)
    obs, reward, terminated, truncated, state64 = gym_one_steps(states, elapsed, actions)
    reset = script.cartpole_reset(torch.rand(n, 4, generator=torch.Generator().manual_seed(seed)))
    next_state, next_elapsed, got_reward, got_term, got_trunc, final = script.cartpole_step(
        states, elapsed, actions, reset, **constants
    )
    theta_limit = 12 * 2 * math.pi / 360
    borderline = (np.abs(np.abs(state64[:, 0]) - 2.4) < 1e-5) | (np.abs(np.abs(state64[:, 2]) - theta_limit) < 1e-5)
    assert borderline.sum() < 5, borderline.sum()
    done = terminated | truncated
    found = {}
    if not torch.allclose(final, torch.from_numpy(obs), rtol=1.3e-6, atol=1e-5):
        found["obs"] = (final - torch.from_numpy(obs)).abs().max().item()
    if not np.array_equal(got_term.numpy()[~borderline], terminated[~borderline]):
        found["terminated"] = int((got_term.numpy() != terminated)[~borderline].sum())
    if not np.array_equal(got_trunc.numpy(), truncated):
        found["truncated"] = int((got_trunc.numpy() != truncated).sum())
    if not np.array_equal(got_reward.numpy(), reward.astype(np.float32)):
        found["reward"] = True
    # the same-step autoreset: an ended env starts again from its reset state, 0 steps old; the others go on
    want_next = torch.where(torch.from_numpy(done)[:, None], reset, final)
    want_elapsed = torch.where(torch.from_numpy(done), 0, elapsed + 1)
    if not (torch.equal(next_state, want_next) and torch.equal(next_elapsed, want_elapsed)):
        found["autoreset"] = True
    return found, terminated.mean(), truncated.mean(), (terminated & truncated).sum()


def test_one_step_from_random_states_is_gymnasiums_cartpole():
    """6,000 random states on both sides of the thresholds, 1,200 of them at the time limit: the obs, reward,
    termination and truncation of each step equal gymnasium's (float32 against its float64), and the autoreset."""
    found, terminated, truncated, both = one_step_mismatches()
    assert found == {}
    assert 0.15 < terminated < 0.6 and 0.04 < truncated < 0.2 and both > 10  # every kind of step was compared


@pytest.mark.parametrize(
    "constants",
    [dict(x_threshold=2.3), dict(theta_threshold=13 * 2 * math.pi / 360), dict(max_steps=499), dict(gravity=9.81),
     dict(force_mag=10.5), dict(tau=0.021), dict(length=0.55), dict(masspole=0.11), dict(x_threshold=2.4 * (1 + 5e-4)),
     dict(theta_threshold=12 * 2 * math.pi / 360 * (1 - 5e-4))],
    ids=lambda c: next(iter(c)),
)  # fmt: skip
def test_a_changed_constant_fails_the_comparison(constants):
    """The comparison above can fail: each constant of the equations or the thresholds, changed a little, is caught."""
    found, *_ = one_step_mismatches(n=3000, seed=1, **constants)
    assert found, constants


def balancing_actions(obs, rng):
    """Push toward where the pole falls (episodes that reach the 500-step limit), env i's actions random with
    probability i / 64 (episodes that end early)."""
    greedy = (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(np.int64)
    return np.where(rng.random(len(obs)) < np.arange(len(obs)) / 64, rng.integers(0, 2, len(obs)), greedy)


def test_trajectories_with_autoreset_are_gymnasiums_vector_env():
    """The twin's vector env (make_envs: SAME_STEP autoreset, RecordEpisodeStatistics) of 32 envs and cartpole_step in
    float64 from the same states with the same actions, 1,200 steps: every obs (the reset ones included), reward,
    termination, truncation, final obs and episode age agree. The tensor env is given gymnasium's reset states (the
    two draw from different generators); the draws themselves are tested below."""
    n, rng = 32, np.random.default_rng(0)
    envs = script.make_envs("CartPole-v1", n)
    obs, _ = envs.reset(seed=3)
    states = lambda: torch.tensor(np.stack([e.unwrapped.state for e in envs.envs]))  # noqa: E731
    state, elapsed = states(), torch.zeros(n, dtype=torch.long)
    counts = {"terminated": 0, "truncated": 0}
    for t in range(1200):
        actions = balancing_actions(obs, rng)
        obs, reward, terminated, truncated, infos = envs.step(actions)
        want_state = states()  # after the autoreset: an ended env's reset state
        state, elapsed, got_reward, got_term, got_trunc, final = script.cartpole_step(
            state, elapsed, torch.from_numpy(actions), want_state
        )
        torch.testing.assert_close(state, want_state, rtol=0, atol=1e-9, msg=f"step {t}")
        torch.testing.assert_close(state.float(), torch.from_numpy(obs), msg=f"step {t}")
        assert np.array_equal(got_term.numpy(), terminated) and np.array_equal(got_trunc.numpy(), truncated), t
        assert np.array_equal(got_reward.numpy(), reward), t
        ages = [e.get_wrapper_attr("_elapsed_steps") for e in envs.envs]
        assert elapsed.tolist() == ages, t
        ended = terminated | truncated
        if ended.any():
            want_final = torch.from_numpy(np.stack(infos["final_obs"][ended]))
            torch.testing.assert_close(final[torch.from_numpy(ended)].float(), want_final, msg=f"step {t}")
        counts["terminated"] += int(terminated.sum())
        counts["truncated"] += int(truncated.sum())
    envs.close()
    assert counts["terminated"] > 50 and counts["truncated"] > 10, counts


def test_reset_states_are_uniform_in_five_hundredths():
    """gymnasium draws each coordinate uniform in [-0.05, 0.05): the same range, mean 0 and spread 0.1 / sqrt(12), from
    the counter-based draws the rollout makes (tests/test_many_seeds.py tests the draws themselves)."""
    draws = script.cartpole_reset(script.counter_uniform(torch.tensor([1]), torch.tensor(7), 2, 400000).view(-1, 4))
    assert draws.shape == (100000, 4) and draws.dtype == torch.float32
    assert draws.min() >= -0.05 and draws.max() < 0.05 and draws.min() < -0.0499 and draws.max() > 0.0499
    torch.testing.assert_close(draws.mean(0), torch.zeros(4), rtol=0, atol=5e-4)
    torch.testing.assert_close(draws.std(0), torch.full((4,), 0.1 / 12**0.5), rtol=0, atol=5e-4)


# ---------------------------------------------------------------- the rollout step and its episode statistics


def test_rollout_step_keeps_the_episode_statistics_on_the_device():
    """Over 200 rollout steps of 16 envs (a random Q-network, epsilon 0.5): each env's episodes, read back from the
    storage, are CartPole's: an episode ends where the step after it begins one (dones), its length is the number of
    steps since the previous end (the first episode counted from the env's start), its return the same (reward 1)."""
    torch.manual_seed(0)
    T, B = 200, 16
    q_network = script.QNetwork(4, 2)
    q_fn = lambda x: q_network(x[0])[None]  # noqa: E731  (one seed: the storage's first dim)
    obs, values, rewards, dones, ended_returns = (torch.zeros(1, T, B, *s) for s in [(4,), (), (), (), ()])
    actions, ended_lengths = torch.zeros(1, T, B, dtype=torch.long), torch.zeros(1, T, B, dtype=torch.long)
    env = dict(state=script.cartpole_reset(torch.rand(1, B, 4)), elapsed=torch.zeros(1, B, dtype=torch.long),
               done=torch.zeros(1, B), length=torch.zeros(1, B, dtype=torch.long),
               **{"return": torch.zeros(1, B)})  # fmt: skip
    rng = dict(seeds=torch.tensor([0]), counter=torch.zeros(1, dtype=torch.long))
    epsilons = torch.full((T,), 0.5)
    for step in torch.arange(T).split(1):
        script.rollout_step(q_fn, obs, actions, values, rewards, dones, epsilons, env, ended_returns,
                            ended_lengths, rng, step)  # fmt: skip
    assert rng["counter"] == T  # one count a step
    obs, actions, values, rewards, dones, ended_returns, ended_lengths = (
        x[0] for x in (obs, actions, values, rewards, dones, ended_returns, ended_lengths)
    )
    env = {key: value[0] for key, value in env.items()}
    assert torch.equal(rewards, torch.ones(T, B))
    ended = ended_lengths > 0
    assert torch.equal(ended[:-1], dones[1:].bool()) and torch.equal(ended[-1], env["done"].bool())
    assert torch.equal(ended_returns, ended_lengths.float())
    for b in range(B):
        ends = torch.nonzero(ended[:, b]).flatten().tolist()
        assert len(ends) >= 3, b
        assert ended_lengths[ends, b].tolist() == [t - s for t, s in zip(ends, [-1, *ends[:-1]], strict=True)], b
        assert env["length"][b] == T - 1 - ends[-1] and env["return"][b] == env["length"][b]
    assert (values != 0).all() and (actions == 0).any() and (actions == 1).any()


# ---------------------------------------------------------------- the iteration: compiled, captured, host reads


# compiled with aot_eager in CI (Dynamo's graphs and AOTAutograd's functionalized update, run with eager's kernels);
# inductor's kernels, which --compile runs, with -m slow (98 s on the 2-core EPYC at load average 5)
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_iteration_equals_the_eager_one_and_compiles_once(backend, tmp_path, monkeypatch):
    """Same seed on CPU: the run with --compile (the rollout step drawing with aten's generator) has the eager run's
    episodes and curve, and its losses to float rounding; its three graphs (rollout step, returns, update) compile in
    the first iteration and nothing recompiles after."""
    (tmp_path / "eager").mkdir()
    (tmp_path / "compiled").mkdir()
    plain, curve = main_in_process(script, [*TINY, "--seed", "2"], tmp_path / "eager")
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: compile_(fn, **{**kwargs, "backend": backend}))
    calls, iteration = [], script.iteration

    def counted(*args, **kwargs):
        calls.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
        with torch._dynamo.config.patch(error_on_recompile=len(calls) > 1):
            return iteration(*args, **kwargs)

    monkeypatch.setattr(script, "iteration", counted)
    compiled, compiled_curve = main_in_process(script, [*TINY, "--seed", "2", "--compile"], tmp_path / "compiled")
    assert calls == [0, 3, 3, 3] and torch._dynamo.utils.counters["stats"]["unique_graphs"] == 3
    assert compiled_curve == curve and compiled["episodes"] == plain["episodes"] > 50
    for key, value in plain["losses"].items():
        assert compiled["losses"][key] == pytest.approx(value, rel=1e-3), key


# the host reads of a run, by line: the log point's read of the ended episodes (once to the host, numpy of the host
# copy) and of the losses and the lr, once an iteration each; none inside the iteration
READ = "ended = torch.stack([ended_returns, ended_lengths.float()]).cpu().numpy()"
HOST_READS = {
    f"cpu at {NAME}.py: {READ}": ITERATIONS,
    f"numpy at {NAME}.py: {READ}": ITERATIONS,
    "tolist at bookkeeping.py: values = torch.stack([v.detach().float() for v in values]).tolist()": ITERATIONS,
}


@pytest.mark.parametrize("flags", [[], ["--compile"]], ids=["cudagraphs", "compile-cudagraphs"])
def test_the_whole_iteration_captured_gives_the_numbers_of_the_run_without(flags, tmp_path):
    """--cudagraphs on the CPU stand-in (tests/gpu_standin.py): one CudaGraphModule, the whole iteration, captured in
    iteration 2 (within --measure-burnin) with no input and no host read in it, replayed after; the run's curve and
    losses are those of the same run uncaptured. The host reads of the captured run are the pinned ones."""
    want = run_main(script, [*TINY, *flags], tmp_path / "plain", cudagraphs="uncaptured")
    with host_reads() as reads:
        got = run_main(script, [*TINY, *flags], tmp_path / "graphs", cudagraphs=True)
    same_run(got, want)
    [contract] = CONTRACTS
    assert contract.name == "iteration" and contract.calls == ITERATIONS and contract.captured_at == 2
    assert contract.violations(max_bytes_in=0) == [] and contract.captured_at < script.Args.measure_burnin
    assert dict(reads) == HOST_READS


def test_host_reads_are_the_log_points_only(tmp_path):
    """Every read of a tensor to the host in an uncaptured run (RAdam capturable, as on CUDA), counted by line."""
    with host_reads() as reads:
        line, _ = run_main(script, TINY, tmp_path)
    assert line["status"] == "ok" and line["steps"] == ITERATIONS * ENVS * STEPS
    assert dict(reads) == HOST_READS


# ---------------------------------------------------------------- the script


def test_smoke_save_and_evaluate_in_gymnasiums_cartpole(tmp_path):
    """A tiny run as a subprocess: results line, summary and curve (an episode a line, at the step it ended); the
    checkpoint, in the PQN pair's format, played in gymnasium's CartPole-v1 by this script and by pqn.py."""
    proc, lines = run_script(NAME, *TINY, "--save-model", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [line] = lines
    assert_finite_results_line(line, NAME)
    assert_summary_matches(proc.stdout, line, tmp_path / "results.jsonl")
    assert line["steps"] == ITERATIONS * ENVS * STEPS and line["episodes"] > 50 and line["compile"] is False
    assert set(line["losses"]) == {"td_loss", "q_values", "learning_rate"}
    assert line["epsilon"] == pytest.approx(0.05) and line["losses"]["learning_rate"] == pytest.approx(2.5e-4 / 4)
    rows = list(csv.reader((tmp_path / line["run_name"] / "returns.csv").open()))
    assert rows[0] == ["step", "wall_s", "return", "seed"] and len(rows) - 1 == line["episodes"]
    assert {row[3] for row in rows[1:]} == {"1"} and line["seeds"]["seed"] == [1]  # one seed: --seed's
    steps = [int(row[0]) for row in rows[1:]]
    assert steps == sorted(steps) and set(steps) <= {ENVS * (s + 1) for s in range(ITERATIONS * STEPS)}
    assert all(float(row[2]) >= 8 and float(row[2]).is_integer() for row in rows[1:])  # CartPole lasts 8+ steps
    checkpoint = tmp_path / line["run_name"] / f"{NAME}.pt"
    for player in (NAME, "pqn"):
        proc, lines = run_script(player, "--eval-checkpoint", str(checkpoint), "--eval-episodes", "2",
                                 tmp_path=tmp_path)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert lines[-1]["mode"] == "eval" and lines[-1]["episodes"] == 2 and lines[-1]["mean_return"] > 0


def test_cudagraphs_without_cuda_exits_2_with_one_line(tmp_path):
    proc, lines = run_script(NAME, "--cudagraphs", tmp_path=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    [err] = [line for line in proc.stderr.splitlines() if line.strip()]
    assert err.startswith(f"{NAME}.py: error: ") and "--cudagraphs" in err and lines == []


BAD_INPUTS = [
    (["--env-id", "Acrobot-v1"], "--env-id"),  # a gymnasium env, but not the one in this file
    (["--env-id", "NoSuchEnv-v0"], "--env-id"),
    (["--capture-video"], "--capture-video"),  # only for an evaluation
    (["--total-timesteps", "500"], "--total-timesteps"),  # less than one iteration
    (["--num-minibatches", "7"], "--num-minibatches"),  # does not divide the batch
    (["--num-envs", "0"], "--num-envs"),
    (["--num-steps", "-1"], "--num-steps"),
    (["--update-epochs", "0"], "--update-epochs"),
    (["--learning-rate", "0"], "--learning-rate"),
    (["--q-lambda", "1.5"], "--q-lambda"),
]


@pytest.mark.parametrize("args,flag", BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_exits_2_with_one_line(args, flag, capsys, tmp_path):
    cli = tyro.cli(script.Args, args=[*args, "--no-cuda", "--results-file", str(tmp_path / "results.jsonl")])
    with pytest.raises(SystemExit) as exit_info:
        script.main(cli)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"{NAME}.py: error: ") and flag in err, err
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------- learning
# CartPole-v1: the best return is 500; a random policy gets about 22.


def first_time_at(rows, bar):
    """(wall_s, step) of the first episode after which the last 100 episodes' mean is at least `bar`, or None."""
    returns = [float(row[2]) for row in rows]
    for i in range(99, len(returns)):
        if sum(returns[i - 99 : i + 1]) >= 100 * bar:
            return float(rows[i][1]), int(rows[i][0])
    return None


def learn(flags, tmp_path):
    proc, lines = run_script(NAME, *flags, tmp_path=tmp_path, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [line] = lines
    rows = list(csv.reader((tmp_path / line["run_name"] / "returns.csv").open()))[1:]
    return line, rows


def test_learns_cartpole_in_65k_steps(tmp_path):
    """The defaults on a 65,536-step budget (32 iterations of 64 envs x 32 steps; epsilon at 0.05 from 7.9k steps on),
    eager. The mean of the last 100 episodes at 60k steps in the tuning runs (defaults, 300k budget, 2-core AMD EPYC):
    184, 91 (seeds 1, 2). The bar, 60, is well above a random policy's 22 and under every measured value."""
    line, _ = learn(["--total-timesteps", "65536", "--seed", "1"], tmp_path)
    assert line["steps"] == 65536 and line["mean_return"] >= 60, line["mean_return"]


@pytest.mark.slow
def test_reaches_475_at_the_defaults_in_two_seeds_of_three(tmp_path):
    """The issue's target at the defaults (500k steps, eager, the faster on a 2-core CPU: no compile to pay): the
    mean of the last 100 episodes reaches 475 (at some point of the run) in two of seeds 1, 2, 3.
    Measured (2-core AMD EPYC, taskset -c 1, load average 5-7 from other jobs): 475 first reached at 22.3, 25.0 and
    13.3 s of the curves' clock (steps 239,232, 294,592, 122,560) for seeds 1, 2, 3; the three runs took 142 s."""
    reached = []
    for seed in (1, 2, 3):
        (tmp_path / str(seed)).mkdir()
        _, rows = learn(["--seed", str(seed)], tmp_path / str(seed))
        reached.append(first_time_at(rows, 475))
    assert sum(hit is not None for hit in reached) >= 2, reached
