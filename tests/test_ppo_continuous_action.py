"""PPO continuous-action pair: the math against float64 references, the twin against the eager script, the twin's
compiled pieces (whole graphs, pinned breaks, no recompiles), the scripts as subprocesses on CPU (smoke, save and
evaluate, bad input, a real divergence, determinism) and learning on InvertedPendulum-v4. The checks it shares with
tests/test_ppo.py are in tests/ppo_checks.py."""

import csv
import math
import signal
import sys
import types

import gymnasium as gym
import ppo_checks as checks
import pytest
import torch
import tyro
from conftest import (
    EXIT_CODES,
    GRACE,
    ROOT,
    assert_checkpoint_evaluates,
    assert_stopped_run,
    main_in_process,
    read_curve,
    run_script,
    started_runs,
    stop,
)
from ppo_checks import ITERATIONS, STEPS, UPDATES

from leanrl import bookkeeping as bk

SPACES = types.SimpleNamespace(
    single_observation_space=gym.spaces.Box(-10, 10, (5,)), single_action_space=gym.spaces.Box(-1, 1, (2,))
)
PAIR = checks.Pair("ppo_continuous_action", SPACES, action_shape=(2,), lr=3e-4)
EAGER, TWIN, SCRIPTS, MODULES = PAIR.EAGER, PAIR.TWIN, PAIR.SCRIPTS, PAIR.MODULES
eager, twin = PAIR.eager, PAIR.twin
# the tiny settings of tests/regression.py: Pendulum-v1, 7 iterations of 64 steps, 2 epochs of 2 minibatches of 32
REGRESSION = PAIR.REGRESSION

# a few iterations of a few steps: enough to run every part of a script
TINY = ["--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "2", "--total-timesteps", "192"]


# ---------------------------------------------------------------- GAE


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("shape", [(1, 16), (2, 8), (2048, 1), (128, 8)])
@pytest.mark.parametrize("gamma,gae_lambda", [(0.99, 0.95), (0.9, 1.0)])
def test_gae_matches_float64_reference(name, shape, gamma, gae_lambda):
    checks.gae_matches_float64_reference(MODULES[name], shape, gamma, gae_lambda)


@pytest.mark.parametrize("shape", [(2048, 4), (128, 8), (5, 3)])
def test_twin_gae_equals_eager_gae(shape):
    checks.twin_gae_equals_eager_gae(PAIR, shape)


def test_twin_gae_compiles_whole_once_to_the_same_values():
    checks.twin_gae_compiles_whole_once_to_the_same_values(twin, (2048, 1))


# ---------------------------------------------------------------- PPO loss


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("n", [64, 7])
@pytest.mark.parametrize("norm_adv", [True, False])
@pytest.mark.parametrize("clip_vloss", [True, False])
def test_ppo_loss_matches_float64_reference(name, n, norm_adv, clip_vloss):
    checks.ppo_loss_matches_float64_reference(MODULES[name], n, norm_adv, clip_vloss)


def test_twin_ppo_loss_equals_eager_ppo_loss():
    checks.twin_ppo_loss_equals_eager_ppo_loss(PAIR)


# ---------------------------------------------------------------- update


@pytest.mark.parametrize("max_grad_norm", [1e-3, 1e6], ids=["clipped", "unclipped"])
def test_twin_update_equals_eager_update(float64, max_grad_norm):
    checks.twin_update_equals_eager_update(PAIR, max_grad_norm)


# aot_eager in CI: Dynamo's graphs and AOTAutograd's functionalized update, run with eager's kernels. Inductor's
# kernels, which the twin's --compile runs in this file build and run, are compared with -m slow (32 s in a cold CI run)
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_update_equals_eager_update(backend):
    agent = checks.compiled_update_equals_eager_update(PAIR, backend)
    assert not torch.equal(agent.actor_logstd, torch.zeros_like(agent.actor_logstd)), "the update did nothing"


def test_twin_policy_step_compiles_whole_once_and_samples_as_eager():
    checks.twin_policy_step_compiles_whole_once_and_samples_as_eager(PAIR, T=4, B=3)


def test_twin_bootstrap_and_gae_compile_whole_to_the_float64_reference():
    checks.twin_bootstrap_and_gae_compile_whole_to_the_float64_reference(PAIR, B=3)


def test_the_twin_update_compiles_to_one_graph():
    checks.twin_update_compiles_to_one_graph(PAIR)


# ---------------------------------------------------------------- the GPU path, on the CPU (tests/gpu_standin.py)


def pinned_host_reads(flags):
    """The host reads of a twin run at the regression flags and these flags (tests/test_gpu_path.py counts its
    --cudagraphs and --compile --cudagraphs runs): one env, so a vector-env step is an env step."""
    return checks.pinned_host_reads(TWIN, ITERATIONS * STEPS)


def test_host_reads_of_the_twin_are_the_pinned_ones(tmp_path):
    checks.host_reads_of_the_twin_are_the_pinned_ones(PAIR, pinned_host_reads([]), tmp_path)


@pytest.mark.parametrize("flags", [[], ["--compile"]], ids=["cudagraphs", "compile-cudagraphs"])
def test_the_twins_own_optimizer_is_captured(flags, tmp_path):
    checks.the_twins_own_optimizer_is_captured(PAIR, flags, tmp_path)


def test_twin_steps_run_on_the_meta_device():
    checks.twin_steps_run_on_the_meta_device(PAIR, B=3)


def test_default_measure_burnin_leaves_compilation_and_capture_out(tmp_path):
    # the iteration in which each CUDA graph of the twin is captured at the default flags (2048 steps per iteration,
    # 10 epochs of 32 minibatches): its warmup-th call, at these calls per iteration
    calls_per_iteration = {"policy_step": 2048, "advantages_and_returns": 1, "update": 320}
    checks.default_measure_burnin_leaves_compilation_and_capture_out(PAIR, calls_per_iteration, tmp_path)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.mark.parametrize("name", SCRIPTS)
def test_steps_per_second_leave_the_burnin_iterations_out(name, tmp_path, monkeypatch):
    """A fake clock: the first update (where the twin compiles and captures) takes 100 s, every other one 1 s, and the
    env takes no time. With --measure-burnin 2, steps/s are those of iterations 3 to 7: 5 * 64 steps in 5 * 4 s."""
    module = MODULES[name]
    clock, update = Clock(), module.update

    def timed_update(*args, **kwargs):
        clock.now += 100.0 if clock.now == 1000.0 else 1.0
        return update(*args, **kwargs)

    monkeypatch.setattr(bk.time, "time", clock)
    monkeypatch.setattr(module, "update", timed_update)
    line, _ = main_in_process(module, REGRESSION + ["--measure-burnin", "2"], tmp_path)
    assert clock.now == 1000.0 + 100.0 + ITERATIONS * UPDATES - 1
    assert line["sps"] == pytest.approx((ITERATIONS - 2) * STEPS / ((ITERATIONS - 2) * UPDATES))
    clock.now = 1000.0  # again, measured from the start: the slow first update is in
    line, _ = main_in_process(module, REGRESSION + ["--measure-burnin", "0"], tmp_path / "all")
    assert line["sps"] == pytest.approx(ITERATIONS * STEPS / (100.0 + ITERATIONS * UPDATES - 1))


@pytest.mark.parametrize("name", SCRIPTS)
def test_track_logs_cleanrl_keys_with_cleanrl_meanings(name, tmp_path, monkeypatch, fake_wandb):
    checks.track_logs_cleanrl_keys_with_cleanrl_meanings(PAIR, MODULES[name], tmp_path, monkeypatch, fake_wandb)


def test_explained_variance_nan_is_reported_not_a_divergence(tmp_path):
    """bk.Run.check_finite(unchecked=...): values read with the losses, in the results line, never a reason to stop
    (CleanRL's explained variance is NaN when the returns do not vary); a non-finite loss still stops the run."""
    args = tyro.cli(twin.Args, args=["--results-file", str(tmp_path / "results.jsonl")])
    with bk.Run(__file__, args, torch.device("cpu"), record=False) as run:
        losses = {"loss": torch.tensor(0.5), "value": torch.tensor(0.25)}
        got = run.check_finite(64, losses, unchecked={"explained_variance": torch.tensor(float("nan"))})
        assert got["loss"] == 0.5 and got["value"] == 0.25 and math.isnan(got["explained_variance"])
        with pytest.raises(bk.Diverged, match="loss diverged at step 128: value=nan"):
            run.check_finite(128, {"loss": 0.5, "value": float("nan")}, unchecked={"explained_variance": 0.5})
        run.status = "ok"


def test_checkpoint_loads_to_the_cpu_for_numpy(tmp_path):
    """The observation statistics reach numpy from the CPU whatever the device: a checkpoint loaded straight to the
    device (map_location=device) crashed evaluation on CUDA. Each script's save_model writes the weights and env 0's
    statistics; bk.load_checkpoint reads them back on the CPU, where numpy reads them as they were (evaluation then
    loads the weights into its agent on the device)."""
    envs = eager.make_envs("InvertedPendulum-v4", 0.99, 1)
    envs.reset(seed=0)
    for _ in range(20):
        envs.step(envs.action_space.sample())
    saved = eager.obs_normalizer(envs.envs[0]).obs_rms
    for name in SCRIPTS:
        module = MODULES[name]
        agent = module.Agent(envs)
        path = tmp_path / f"{name}.pt"
        module.save_model(path, module.Args(env_id="InvertedPendulum-v4"), agent, envs)
        checkpoint = bk.load_checkpoint(module.__file__, path, "model", "obs_rms")
        assert checkpoint["args"]["env_id"] == "InvertedPendulum-v4"
        rms = checkpoint["obs_rms"]
        obs_stats = dict(mean=rms["mean"].numpy(), var=rms["var"].numpy(), count=rms["count"])
        assert type(obs_stats["mean"]) is type(saved.mean) and obs_stats["count"] == saved.count > 20
        assert (obs_stats["mean"] == saved.mean).all() and (obs_stats["var"] == saved.var).all()
        weights = checkpoint["model"]
        assert weights.keys() == agent.state_dict().keys()
        for key, value in agent.state_dict().items():
            assert weights[key].device.type == "cpu" and torch.equal(weights[key], value), key
    envs.close()


def test_a_file_that_is_not_a_checkpoint_of_the_script_exits_2(capsys, tmp_path):
    # no obs_rms: another script's checkpoint
    checks.not_a_checkpoint_exits_2(PAIR, {"args": {}, "model": {}}, capsys, tmp_path)


# ---------------------------------------------------------------- scripts as subprocesses


VARIANTS = [(EAGER, []), (TWIN, []), (TWIN, ["--compile"])]


@pytest.mark.parametrize("name,flags", VARIANTS, ids=["eager", "twin", "twin-compile"])
def test_smoke_halfcheetah_twice_the_same(name, flags, tmp_path):
    """No episode of HalfCheetah ends in 192 steps, but the last losses depend on every observation, action and reward
    of the three rollouts and on every update before them (tests/ppo_checks.py compares them)."""
    for proc, _, folder in checks.runs_twice_the_same(name, [*TINY, *flags], "HalfCheetah-v4", tmp_path):
        # HalfCheetah-v4's XML uses MuJoCo 4's deprecated settotalmass: the scripts drop exactly that warning
        assert "settotalmass" not in proc.stderr + proc.stdout and not (folder / "MUJOCO_LOG.TXT").exists()


@pytest.mark.parametrize("name", SCRIPTS)
def test_save_model_then_evaluate_checkpoint(name, tmp_path):
    checkpoint_path, checkpoint, line = checks.saved_then_evaluated(
        name, ["--env-id", "InvertedPendulum-v4", *TINY], tmp_path
    )
    assert checkpoint["args"]["env_id"] == "InvertedPendulum-v4" and line["env_id"] == "InvertedPendulum-v4"
    # the observation statistics that evaluation needs were saved, and training did move them
    rms = checkpoint["obs_rms"]
    assert rms["count"] > 100 and not torch.allclose(rms["var"], torch.ones_like(rms["var"]))
    curve = list(csv.DictReader((checkpoint_path.parent / "eval_returns.csv").open()))
    # the evaluation plays what the checkpoint holds: the test replays it (mean action, the saved observation
    # statistics frozen, the same seed) and gets the same episodes; without the statistics it would not
    returns, steps = replay_evaluation(MODULES[name], checkpoint, episodes=3, seed=5)
    assert line["mean_return"] == pytest.approx(sum(returns) / 3) and line["steps"] == steps, (returns, steps)
    assert [float(row["return"]) for row in curve] == pytest.approx(returns)
    assert replay_evaluation(MODULES[name], checkpoint, episodes=3, seed=5, obs_stats=False) != (returns, steps)


def replay_evaluation(module, checkpoint, episodes, seed, obs_stats=True):
    """(returns, steps) of `episodes` episodes played with the checkpoint's mean action, on CPU."""
    envs = module.make_envs(checkpoint["args"]["env_id"], checkpoint["args"]["gamma"], 1)
    normalizer = module.obs_normalizer(envs.envs[0])
    if obs_stats:
        rms = checkpoint["obs_rms"]
        normalizer.obs_rms.mean, normalizer.obs_rms.var = rms["mean"].numpy(), rms["var"].numpy()
        normalizer.obs_rms.count = rms["count"]
    normalizer.update_running_mean = False
    agent = module.Agent(envs)
    agent.load_state_dict(checkpoint["model"])
    played = checks.play(envs, agent.actor_mean, episodes, seed)
    envs.close()
    return played


BAD_INPUTS = [
    (["--env-id", "NoSuchEnv-v0"], "--env-id"),
    (["--env-id", "CartPole-v1"], "--env-id"),  # discrete actions
    (["--env-id", "Breakout-v5"], "--env-id"),  # an Atari (envpool) id
    (["--env-id", "ALE/Breakout-v5"], "--env-id"),
    (["--total-timesteps", "1000"], "--total-timesteps"),  # below one iteration of 2048 steps
    (["--num-steps", "0"], "--num-steps"),
    (["--update-epochs", "-1"], "--update-epochs"),
    (["--num-minibatches", "3"], "--num-minibatches"),  # 2048 is not divisible by 3
    (["--learning-rate", "-1"], "--learning-rate"),
    (["--results-file", "."], "--results-file"),  # a folder
    (["--results-file", "a_file/results.jsonl"], "--results-file"),  # under a file (check_bad_input makes a_file)
]


@pytest.mark.parametrize("args,flag", BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_exits_2_with_one_line(args, flag, tmp_path):
    checks.check_bad_input(EAGER, args, flag, tmp_path)


@pytest.mark.parametrize("args,flag", [(["--cudagraphs"], "--cudagraphs"), BAD_INPUTS[2], BAD_INPUTS[4]])
def test_twin_bad_input_exits_2_with_one_line(args, flag, tmp_path):
    checks.check_bad_input(TWIN, args, flag, tmp_path)


@pytest.mark.parametrize("args,flag", BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_twin_check_args_rejects_bad_input(args, flag, capsys, tmp_path, monkeypatch):
    checks.twin_check_args_rejects_bad_input(PAIR, args, flag, capsys, tmp_path, monkeypatch)


@pytest.mark.parametrize("name", SCRIPTS)
def test_non_finite_loss_stops_the_run_as_diverged(name, tmp_path):
    checks.non_finite_loss_stops_the_run_as_diverged(name, ["--env-id", "InvertedPendulum-v4", *TINY], tmp_path)


# what each script reports when a huge learning rate wrecks the policy in its first update: the twin (no argument
# checks) computes a NaN loss; the eager script's Normal refuses the collapsed std before a loss exists
DIVERGED_MESSAGE = {
    EAGER: r"loss diverged at step 64: the policy's Normal got invalid parameters",
    TWIN: r"loss diverged at step 64: (loss|policy|value|entropy|approx_kl)=(nan|inf|-inf)",
}


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_real_divergence_is_reported_in_strict_json(name, tmp_path):
    """A learning rate of 1e6 really diverges."""
    args = ["--env-id", "InvertedPendulum-v4", *TINY, "--learning-rate", "1e6"]
    checks.a_real_divergence_is_reported_in_strict_json(name, args, DIVERGED_MESSAGE[name], tmp_path)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stopped_run_writes_its_line_curve_and_checkpoint(sig, tmp_path):
    """Ctrl-C (SIGINT) or a scheduler's SIGTERM once episodes have ended: the run stops and exits 130 / 143 within
    seconds, with no traceback, leaving its results line (status interrupted, strict JSON), the summary line that points
    at it, its return curve and its --save-model checkpoint, which --eval-checkpoint plays."""
    results = tmp_path / "results.jsonl"
    cmd = [sys.executable, str(ROOT / "leanrl" / f"{EAGER}.py"), "--no-cuda", "--results-file", str(results)]
    cmd += ["--env-id", "InvertedPendulum-v4", *TINY[:6], "--total-timesteps", "1000000", "--save-model"]
    with started_runs([(cmd, {})], tmp_path, rows=2) as procs:
        [(stdout, stderr)], seconds = stop(procs, sig)
    assert procs[0].returncode == EXIT_CODES[sig], stderr[-3000:]
    assert seconds < GRACE, seconds
    line = assert_stopped_run(stdout, stderr, results, sig, EAGER)
    checkpoint = tmp_path / line["run_name"] / f"{EAGER}.pt"
    assert f"model saved to {checkpoint}" in stdout
    (tmp_path / "eval").mkdir()
    assert_checkpoint_evaluates(EAGER, checkpoint, tmp_path / "eval", episodes=2)


def test_eager_is_deterministic_over_episodes(tmp_path):
    """Same seed, same machine, eager on CPU: the same losses and the same episodes twice, on an env whose episodes
    end within the budget."""
    for d in "ab":
        (tmp_path / d).mkdir()
    runs = [run_script(EAGER, "--env-id", "InvertedPendulum-v4", *TINY, tmp_path=tmp_path / d) for d in "ab"]
    for proc, _ in runs:
        assert proc.returncode == 0, proc.stderr[-3000:]
    (_, [first]), (_, [second]) = runs
    assert first["episodes"] > 0
    for key in ("losses", "mean_return", "episodes", "steps"):
        assert first[key] == second[key], key
    curves = [read_curve(line, tmp_path / d) for d, line in zip("ab", (first, second))]
    assert [row.split(",")[::2] for row in curves[0].splitlines()] == [
        row.split(",")[::2] for row in curves[1].splitlines()
    ], "the step and return columns differ"


# ---------------------------------------------------------------- learning
# InvertedPendulum-v4: the best return is 1000 (1000 steps balanced), a random policy gets about 8.


def learn(name, flags, steps, seed, tmp_path):
    """Train on InvertedPendulum-v4; returns (results line, mean of the last 10 episodic returns)."""
    args = ["--env-id", "InvertedPendulum-v4", "--total-timesteps", str(steps), "--seed", str(seed), *flags]
    line, returns = checks.learn(name, args, tmp_path)
    return line, sum(returns[-10:]) / len(returns[-10:])


# CI budget: 20,480 steps with 512-step rollouts (8 minibatches, so still 64 samples each), 40 iterations instead
# of 10: the same number of gradient steps per env step as CleanRL's defaults, updated more often.
QUICK = ["--num-steps", "512", "--num-minibatches", "8"]


# CI learns with the twin; the eager script's run is `-m slow` (tests/regression.py pins its numbers for a seed,
# and the twin-equals-eager tests tie the twin's updates to it)
@pytest.mark.parametrize("name", [pytest.param(EAGER, marks=pytest.mark.slow), TWIN])
def test_learns_inverted_pendulum_in_20k_steps(name, tmp_path):
    """Measured on this budget: mean of the last 100 episodes 183-189 (eager, seeds 1-5) and 180-183 (twin,
    seeds 1-3); mean of the last 10 episodes 370-1000. The bars are 12x and 25x a random policy's 8. In a cold run
    of the whole suite on a 2-core AMD EPYC (two files at a time): eager 37 s, twin 28 s."""
    line, last10 = learn(name, QUICK, 20480, 1, tmp_path)
    assert line["mean_return"] >= 100, line["mean_return"]
    assert last10 >= 200, last10


@pytest.mark.slow
@pytest.mark.parametrize("name,flags", [(EAGER, []), (TWIN, ["--compile"])], ids=["eager", "twin-compile"])
def test_reaches_800_on_inverted_pendulum_within_200k_steps(name, flags, tmp_path):
    """The issue's bar: mean of the last 100 episodes >= 800 within 200k steps (97 iterations of 2048)."""
    line, _ = learn(name, flags, 200000, 1, tmp_path)
    assert line["steps"] <= 200000
    assert line["mean_return"] >= 800, line["mean_return"]
