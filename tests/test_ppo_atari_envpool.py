"""PPO Atari (envpool): math against float64 references, twin agreement, the scripts end to end on CPU."""

import copy
import math
import sys
from functools import partial

import numpy as np
import pytest
import torch
from conftest import assert_finite_results_line, load_script, run_script
from reference import gae_reference, ppo_loss_reference, random_ppo_minibatch, random_rollout

EAGER, TWIN = "ppo_atari_envpool", "ppo_atari_envpool_torchcompile"
SCRIPTS = (EAGER, TWIN)
TINY = ("--num-envs", "2", "--num-steps", "16", "--measure-burnin", "1", "--total-timesteps")


@pytest.fixture(autouse=True)
def one_thread_per_subprocess(monkeypatch):
    # the scripts run as subprocesses beside this one on a 2-core machine: two OpenMP teams spinning on two cores
    # slow each other down many times over
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="module")
def mods():
    loaded = {}
    for name in SCRIPTS:
        module = load_script(name)
        # torch.compile looks the functions' module up by name to read its globals
        sys.modules.setdefault(module.__name__, module)
        loaded[name] = module
    return loaded


# ---------------------------------------------------------------- GAE


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("shape", [(1, 5), (2, 4), (2048, 1), (128, 8), (37, 3)])
def test_gae_matches_float64_reference(mods, name, shape):
    T, B = shape
    rollout = random_rollout(T, B, seed=T * 100 + B, done_prob=0.1)
    rewards, values, dones, next_value, next_done = rollout
    if T > 1:
        assert dones.sum() > 0, "the input must contain episode ends"
    got = mods[name].gae(rewards, values, dones, next_value, next_done, 0.99, 0.95)
    want = gae_reference(rewards, values, dones, next_value, next_done, 0.99, 0.95)
    assert got.shape == (T, B) and got.dtype == torch.float32
    # float32 sums of up to ~1/(1 - gamma*lambda) = 17 terms of size ~1 (the decay bounds them whatever T is):
    # relative error ~1e-6, so 1e-4 leaves room for the doubling form's different summation order.
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def test_gae_of_the_twin_equals_the_eager_loop(mods):
    for T, B in [(1, 3), (2, 8), (128, 8), (1000, 2)]:
        rollout = random_rollout(T, B, seed=T + B, done_prob=0.2)
        eager = mods[EAGER].gae(*rollout, 0.9, 0.8)
        twin = mods[TWIN].gae(*rollout, 0.9, 0.8)
        torch.testing.assert_close(twin, eager, rtol=1e-5, atol=1e-5)


def test_gae_bootstraps_only_where_the_episode_goes_on(mods):
    # one step, next obs begins a new episode: the advantage is the bare reward minus the value
    for name in SCRIPTS:
        adv = mods[name].gae(
            torch.tensor([[2.0, 2.0]]),
            torch.tensor([[0.5, 0.5]]),
            torch.zeros(1, 2),
            torch.tensor([10.0, 10.0]),
            torch.tensor([1.0, 0.0]),
            0.9,
            0.95,
        )
        torch.testing.assert_close(adv, torch.tensor([[1.5, 1.5 + 9.0]]))


# ---------------------------------------------------------------- PPO loss


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("norm_adv", [True, False])
@pytest.mark.parametrize("clip_vloss", [True, False])
def test_ppo_loss_matches_float64_reference(mods, name, norm_adv, clip_vloss):
    inputs = random_ppo_minibatch(257, seed=int(norm_adv) * 2 + int(clip_vloss))
    ratio = (inputs[0] - inputs[1]).exp()
    clipped = ((ratio - 1).abs() > 0.1).float().mean()
    assert 0.1 < clipped < 0.9, "the input must have clipped and unclipped ratios"
    value_clipped = ((inputs[3] - inputs[4]).abs() > 0.1).float().mean()
    assert 0.1 < value_clipped < 0.9, "the input must have clipped and unclipped values"
    hyper = dict(clip_coef=0.1, ent_coef=0.01, vf_coef=0.5, norm_adv=norm_adv, clip_vloss=clip_vloss)
    loss, parts = mods[name].ppo_loss(*inputs, **hyper)
    want = ppo_loss_reference(*inputs, **hyper)
    got = {"loss": loss, **parts}
    for key, value in want.items():
        assert not got[key].requires_grad
        torch.testing.assert_close(got[key].double(), torch.tensor(value, dtype=torch.float64), rtol=1e-5, atol=1e-6)
    assert parts["clipfrac"] > 0


def test_ppo_loss_of_the_twin_equals_the_eager_one(mods):
    inputs = random_ppo_minibatch(64, seed=7)
    for norm_adv in (True, False):
        for clip_vloss in (True, False):
            hyper = (0.2, 0.01, 0.5, norm_adv, clip_vloss)
            eager_loss, eager_parts = mods[EAGER].ppo_loss(*inputs, *hyper)
            twin_loss, twin_parts = mods[TWIN].ppo_loss(*inputs, *hyper)
            torch.testing.assert_close(twin_loss, eager_loss)
            torch.testing.assert_close(twin_parts, eager_parts)


def test_ppo_loss_gradient_flows_to_the_new_policy_and_value(mods):
    newlogprob, oldlogprob, entropy, newvalue, oldvalue, advantages, returns = random_ppo_minibatch(32, seed=3)
    newlogprob.requires_grad_(True)
    newvalue.requires_grad_(True)
    entropy.requires_grad_(True)
    loss, _ = mods[TWIN].ppo_loss(
        newlogprob, oldlogprob, entropy, newvalue, oldvalue, advantages, returns, 0.1, 0.01, 0.5, True, True
    )
    loss.backward()
    for tensor in (newlogprob, newvalue, entropy):
        assert tensor.grad is not None and tensor.grad.abs().sum() > 0


# ---------------------------------------------------------------- update: compiled vs eager


def minibatch(n, n_actions, seed):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randint(0, 256, (n, 4, 84, 84), generator=g, dtype=torch.uint8)
    actions = torch.randint(0, n_actions, (n,), generator=g)
    logprobs = -torch.rand(n, generator=g) * 2 - 0.5
    return obs, actions, logprobs, torch.randn(n, generator=g), torch.randn(n, generator=g), torch.randn(n, generator=g)


def test_compiled_update_of_the_twin_equals_the_eager_update(mods):
    hyper = dict(clip_coef=0.1, ent_coef=0.01, vf_coef=0.5, norm_adv=True, clip_vloss=True, max_grad_norm=0.5)
    torch.manual_seed(0)
    agent = mods[EAGER].Agent(4)
    twin_agent = copy.deepcopy(agent)
    initial = copy.deepcopy(agent.state_dict())
    eager_optimizer = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5)
    twin_optimizer = torch.optim.Adam(twin_agent.parameters(), lr=torch.tensor(2.5e-4), eps=1e-5, fused=True)
    eager_update = partial(mods[EAGER].update, agent, eager_optimizer, **hyper)
    twin_update = torch.compile(partial(mods[TWIN].update, twin_agent, twin_optimizer, **hyper))
    for seed in range(3):
        batch = minibatch(8, 4, seed)
        # the first call compiles; later ones, with the lr annealed in place in between, must not recompile
        with torch._dynamo.config.patch(error_on_recompile=seed > 0):
            want, got = eager_update(*batch), twin_update(*batch)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        eager_optimizer.param_groups[0]["lr"] = 2.5e-4 / (seed + 2)
        twin_optimizer.param_groups[0]["lr"].fill_(2.5e-4 / (seed + 2))
    for (key, want), got in zip(agent.state_dict().items(), twin_agent.state_dict().values()):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6, msg=key)
        assert not torch.equal(want, initial[key]), f"{key} was not updated"


# ---------------------------------------------------------------- env helpers


def test_game_returns_sum_raw_rewards_over_lives_and_reset_on_game_over(mods):
    for name in SCRIPTS:
        running = np.zeros(3)
        game_returns = mods[name].game_returns
        assert game_returns(running, np.array([1.0, 4.0, 0.0]), np.array([False, False, False])) == []
        # a lost life (an episode end for learning) is no game over: the score goes on
        assert game_returns(running, np.array([2.0, 0.0, 7.0]), np.array([False, True, False])) == [4.0]
        assert game_returns(running, np.array([1.0, 1.0, 0.0]), np.array([True, False, True])) == [4.0, 7.0]
        np.testing.assert_array_equal(running, [0.0, 1.0, 0.0])


# ---------------------------------------------------------------- scripts end to end


def read_curve(line, tmp_path):
    return (tmp_path / line["run_name"] / "returns.csv").read_text()


@pytest.mark.parametrize("name,flags", [(EAGER, ()), (TWIN, ("--compile",))])
def test_smoke_tiny_budget(name, flags, tmp_path):
    proc, lines = run_script(name, *TINY, "64", *flags, "--save-model", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = lines
    assert_finite_results_line(line, name)
    assert line["steps"] == 64 and line["mode"] == "train"
    assert line["compile"] is ("--compile" in flags) and line["cudagraphs"] is False
    assert read_curve(line, tmp_path).startswith("step,wall_s,return\n")

    # the checkpoint plays full games
    checkpoint = tmp_path / line["run_name"] / f"{name}.pt"
    proc, lines = run_script(name, "--eval-checkpoint", str(checkpoint), "--eval-episodes", "1", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    evaluation = lines[-1]
    assert evaluation["mode"] == "eval" and evaluation["status"] == "ok"
    assert evaluation["episodes"] == 1 and math.isfinite(evaluation["mean_return"])
    assert evaluation["steps"] > 0 and evaluation["env_id"] == "Breakout-v5"


def test_smoke_lean_eager_twin_learns_like_the_eager_script(tmp_path):
    # the twin without flags: the same algorithm; losses of the same order as the eager run's
    proc, lines = run_script(TWIN, *TINY, "64", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_finite_results_line(lines[0], TWIN)
    assert lines[0]["losses"]["entropy"] == pytest.approx(math.log(4), abs=0.05)


def test_eager_runs_are_deterministic(tmp_path):
    runs = []
    for i in range(2):
        (tmp_path / str(i)).mkdir()
        proc, lines = run_script(EAGER, *TINY, "64", tmp_path=tmp_path / str(i))
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(lines[0])
    assert runs[0]["losses"] == runs[1]["losses"]
    assert runs[0]["mean_return"] == runs[1]["mean_return"]


# ---------------------------------------------------------------- bad input


BAD_INPUTS = [
    (("--env-id", "NotAGame-v5"), "--env-id"),
    (("--env-id", "HalfCheetah-v4"), "--env-id"),  # envpool knows it, but it is MuJoCo
    (("--env-id", "CartPole-v1"), "--env-id"),
    (("--env-id", "D1Basic-v1"), "--env-id"),  # image observations, but not discrete actions
    (("--total-timesteps", "100"), "--total-timesteps"),
    (("--num-envs", "0"), "--num-envs"),
    (("--num-steps", "-1"), "--num-steps"),
    (("--update-epochs", "0"), "--update-epochs"),
    (("--num-minibatches", "3"), "--num-minibatches"),
]


def flags_to_args(module, flags):
    fields = {flag.removeprefix("--").replace("-", "_"): value for flag, value in zip(flags[::2], flags[1::2])}
    defaults = module.Args()
    return module.Args(**{k: type(getattr(defaults, k))(v) for k, v in fields.items()})


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("flags,flag", BAD_INPUTS)
def test_bad_input_exits_2_with_one_line(mods, name, flags, flag, capsys, tmp_path):
    args = flags_to_args(mods[name], flags)
    args.results_file = str(tmp_path / "results.jsonl")
    with pytest.raises(SystemExit) as exit_info:
        mods[name].main(args)
    assert exit_info.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith(f"{name}.py: error: ") and flag in err[0], err
    assert not (tmp_path / "results.jsonl").exists()


def test_atari_games_other_than_breakout_are_accepted(mods):
    for name in SCRIPTS:
        mods[name].check_env_id("Pong-v5")  # no exit


@pytest.mark.parametrize(
    "name,flags,flag",
    [(TWIN, ("--cudagraphs",), "--cudagraphs"), (EAGER, ("--env-id", "HalfCheetah-v4"), "--env-id")],
)
def test_bad_input_from_the_command_line(name, flags, flag, tmp_path):
    proc, lines = run_script(name, *TINY, "64", *flags, tmp_path=tmp_path)
    assert proc.returncode == 2
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and flag in err[0] and "Traceback" not in proc.stderr, proc.stderr
    assert lines == []
    if flag == "--cudagraphs":
        assert err[0] == f"{name}.py: error: --cudagraphs needs CUDA, and none is available"
