"""PPO Atari (envpool): math against float64 references, twin agreement, the scripts end to end on CPU."""

import copy
import math
import re
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from conftest import (
    GRACE,
    ROOT,
    args_from_flags,
    assert_checkpoint_evaluates,
    assert_finite_results_line,
    assert_main_exits_2_with_one_line,
    assert_stopped_run,
    assert_summary_matches,
    curve_points,
    load_script,
    main_in_process,
    read_curve,
    run_script,
    started_runs,
    stop,
    strict_json,
)
from reference import gae_reference, ppo_loss_reference, random_ppo_minibatch, random_rollout

from leanrl import bookkeeping as bk

EAGER, TWIN = "ppo_atari_envpool", "ppo_atari_envpool_torchcompile"
SCRIPTS = (EAGER, TWIN)
TINY = ("--num-envs", "2", "--num-steps", "16", "--measure-burnin", "1", "--total-timesteps")


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


@pytest.mark.parametrize("name", SCRIPTS)
def test_old_approx_kl_is_cleanrls(mods, name):
    """losses/old_approx_kl as CleanRL logs it: the mean of -log(ratio), in float64 over the samples."""
    inputs = random_ppo_minibatch(101, seed=11)
    _, parts = mods[name].ppo_loss(*inputs, 0.1, 0.01, 0.5, True, True)
    want = sum(old - new for new, old in zip(inputs[0].double().tolist(), inputs[1].double().tolist())) / 101
    assert abs(want) > 1e-3  # not a near-zero that any formula would match
    torch.testing.assert_close(parts["old_approx_kl"].double(), torch.tensor(want, dtype=torch.float64))


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("shape", [(4, 2), (128, 8), (1, 5)])
def test_explained_variance_matches_float64_reference(mods, name, shape):
    """CleanRL's 1 - Var[returns - values] / Var[returns] (population variances), NaN where the returns are equal."""
    g = torch.Generator().manual_seed(shape[0])
    values = torch.randn(shape, generator=g)
    returns = values + 0.5 * torch.randn(shape, generator=g) + 0.3
    y_true, y_pred = returns.double().flatten().tolist(), values.double().flatten().tolist()

    def var(xs):
        mean = sum(xs) / len(xs)
        return sum((x - mean) ** 2 for x in xs) / len(xs)

    want = 1 - var([t - p for t, p in zip(y_true, y_pred)]) / var(y_true)
    got = mods[name].explained_variance(values, returns)
    assert got.shape == () and 0.0 < want < 1.0
    torch.testing.assert_close(got.double(), torch.tensor(want, dtype=torch.float64), rtol=1e-5, atol=1e-6)
    constant = torch.full(shape, 2.0)
    assert mods[name].explained_variance(values, constant).isnan()  # CleanRL's np.nan when var(returns) == 0


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


HYPER = dict(clip_coef=0.1, ent_coef=0.01, vf_coef=0.5, norm_adv=True, clip_vloss=True, max_grad_norm=0.5)


# aot_eager in CI: Dynamo's graphs and AOTAutograd's functionalized update, run with eager's kernels. Inductor's
# kernels, which the twin's --compile runs in this file build and run, are compared with -m slow (38 s in a cold CI run)
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_update_of_the_twin_equals_the_eager_update(mods, backend):
    # the twin gathers the minibatch inside its compiled update from the whole flat batch; the eager update gets the
    # gathered minibatch. Same steps, same weights after them.
    torch.manual_seed(0)
    agent = mods[EAGER].Agent(4)
    twin_agent = copy.deepcopy(agent)
    initial = copy.deepcopy(agent.state_dict())
    eager_optimizer = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5)
    twin_optimizer = torch.optim.Adam(twin_agent.parameters(), lr=torch.tensor(2.5e-4), eps=1e-5, fused=True)
    eager_update = partial(mods[EAGER].update, agent, eager_optimizer, **HYPER)
    batch = minibatch(24, 4, seed=0)
    compiled = torch.compile(mods[TWIN].update, backend=backend)
    twin_update = partial(compiled, twin_agent, twin_optimizer, *batch, **HYPER)
    for iteration in range(3):
        # a minibatch is a view into one permutation, as in the scripts: another storage offset must not recompile
        mb_inds = torch.randperm(24, generator=torch.Generator().manual_seed(iteration)).split(8)[iteration]
        # the first call compiles; later ones, with the lr annealed in place in between, must not recompile
        with torch._dynamo.config.patch(error_on_recompile=iteration > 0):
            want, got = eager_update(*(x[mb_inds] for x in batch)), twin_update(mb_inds)
        # the twin returns one stacked tensor, named by LOSSES
        torch.testing.assert_close(dict(zip(mods[TWIN].LOSSES, got)), want, rtol=1e-4, atol=1e-5)
        eager_optimizer.param_groups[0]["lr"] = 2.5e-4 / (iteration + 2)
        twin_optimizer.param_groups[0]["lr"].fill_(2.5e-4 / (iteration + 2))
    for (key, want), got in zip(agent.state_dict().items(), twin_agent.state_dict().values()):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6, msg=key)
        assert not torch.equal(want, initial[key]), f"{key} was not updated"


def rollout_storage(T, B, seed):
    """The twin's storage after a rollout: T + 1 rows of observations and (reward, done), with episode ends."""
    from test_pqn_atari_envpool import as_received

    g = torch.Generator().manual_seed(seed)
    obs = torch.randint(0, 256, (T + 1, B, 4, 84, 84), generator=g, dtype=torch.uint8)
    env_out = torch.stack([torch.randn(T + 1, B, generator=g), (torch.rand(T + 1, B, generator=g) < 0.2).float()], 1)
    obs, env_out = as_received(obs, env_out)  # laid out as the twin lays them out
    actions = torch.zeros(T, B, dtype=torch.long)
    return obs, env_out, actions, torch.zeros(T, B), torch.randn(T, B, generator=g)


def test_policy_step_and_gae_of_the_twin_compile_whole_and_equal_eager(mods):
    twin = mods[TWIN]
    torch.manual_seed(0)
    agent = twin.Agent(4)
    T, B = 5, 3
    obs, env_out, actions, logprobs, values = rollout_storage(T, B, seed=1)
    compiled_policy = torch.compile(twin.policy_step, fullgraph=True, backend="aot_eager")
    steps = torch.arange(T)
    for step in range(T):
        # same generator state for both, so the same actions are sampled
        torch.manual_seed(step)
        want = mods[EAGER].Agent.get_action_and_value(agent, obs[step])
        torch.manual_seed(step)
        with torch._dynamo.config.patch(error_on_recompile=step > 0):  # every step runs the one graph
            action = compiled_policy(agent, obs, actions, logprobs, values, steps[step : step + 1])
        torch.testing.assert_close(action, want[0])
        torch.testing.assert_close(actions[step], want[0])
        torch.testing.assert_close(logprobs[step], want[1])
        torch.testing.assert_close(values[step], want[3].flatten())

    # bootstrap + GAE over the storage equal the eager script's, which keeps (T, B) rewards and dones and a next_obs
    advantages, returns = torch.zeros(T, B), torch.zeros(T, B)
    compiled_gae = torch.compile(twin.advantages_and_returns, fullgraph=True, backend="aot_eager")
    for iteration in range(2):
        with torch._dynamo.config.patch(error_on_recompile=iteration > 0):
            compiled_gae(agent, obs, env_out, values, advantages, returns, 0.99, 0.95)
        with torch.no_grad():
            next_value = agent.get_value(obs[T]).reshape(-1)
        rewards, dones, next_done = env_out[1:, 0], env_out[:T, 1], env_out[T, 1]
        want = mods[EAGER].gae(rewards, values, dones, next_value, next_done, 0.99, 0.95)
        assert dones.sum() > 0
        torch.testing.assert_close(advantages, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(returns, want + values)
        env_out[:, 0] += 1.0  # the next iteration's rewards: same graph, new numbers


def test_graph_breaks_of_the_twin_update_are_pytorchs_own(mods):
    """Each break is compiled code handing back to Python; this pins them so that a new one fails here."""
    from torch._dynamo.utils import counters

    twin = mods[TWIN]
    torch.manual_seed(0)
    agent = twin.Agent(4)
    optimizer = torch.optim.Adam(agent.parameters(), lr=torch.tensor(2.5e-4), eps=1e-5, fused=True)
    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    counters.clear()
    update = partial(torch.compile(twin.update, backend=counting_backend), agent, optimizer, *minibatch(16, 4, 0))
    update(torch.arange(8), **HYPER)
    breaks = {reason.splitlines()[0]: count for reason, count in counters["graph_break"].items()}
    # torch 2.13 breaks the update into 3 graphs; the breaks, as dynamo counts them:
    # - loss.backward(): dynamo does not trace backward() (trace_autograd_ops is off), 1
    # - Optimizer.step's wrapper (_use_grad) calls torch._dynamo.graph_break() before and after the step, 2
    # - fused Adam's kernel is torch.compiler.disable'd ("don't trace into fused optimizer"): a fallback op, counted in
    #   Adam.step and again in torch.optim.adam.adam, where tracing resumes, 2
    # Optimizer.zero_grad would add one more ("marked as skipped"): the twin sets the grads to None itself.
    assert breaks == {
        "Unsupported Tensor.backward() call": 1,
        "Call to `torch._dynamo.graph_break()`": 2,
        "Skip calling `torch.compiler.disable()`d function": 2,
    }, breaks
    assert len(graphs) == 3
    # nothing recompiles over several steps with other indices and an annealed lr
    with torch._dynamo.config.patch(error_on_recompile=True):
        for i in range(4):
            optimizer.param_groups[0]["lr"].fill_(1e-4 / (i + 1))
            update(torch.randperm(16).split(8)[i % 2], **HYPER)
    assert len(graphs) == 3


# ---------------------------------------------------------------- episode accounting


def test_game_returns_sum_raw_rewards_over_lives_and_reset_on_game_over():
    # both scripts count their games with bk.game_returns (and the scripted env below runs each of them through it)
    running = np.zeros(3)
    game_returns = bk.game_returns
    assert game_returns(running, np.array([1.0, 4.0, 0.0]), np.array([False, False, False])) == []
    # a lost life (an episode end for learning) is no game over: the score goes on
    assert game_returns(running, np.array([2.0, 0.0, 7.0]), np.array([False, True, False])) == [4.0]
    assert game_returns(running, np.array([1.0, 1.0, 0.0]), np.array([True, False, True])) == [4.0, 7.0]
    np.testing.assert_array_equal(running, [0.0, 1.0, 0.0])


class ScriptedAtari:
    """An envpool-shaped Atari env (gym API, episodic_life, reward_clip) that plays a script for two envs.

    Each row: raw rewards (info["reward"]), life lost (terminations, episodic_life), time limit (truncations),
    game over (info["terminated"], lives == 0), lives left.
    """

    SCRIPT = [
        ((0, 10), (0, 0), (0, 0), (0, 0), (5, 5)),
        ((4, 0), (0, 0), (0, 0), (0, 0), (5, 5)),
        ((0, 0), (1, 0), (0, 0), (0, 0), (4, 5)),  # env 0 loses a life: an episode for learning, not a game end
        ((7, 0), (0, 0), (0, 1), (0, 0), (4, 5)),  # env 1 is cut by the time limit: its game ends, score 10
        ((0, 3), (0, 0), (0, 0), (0, 0), (4, 5)),
        ((0, 0), (1, 0), (0, 0), (1, 0), (0, 5)),  # env 0 loses its last life: game over, score 4 + 7 = 11
        ((2, 0), (0, 0), (0, 0), (0, 0), (5, 5)),
        ((0, 0), (0, 1), (0, 0), (0, 1), (5, 0)),  # env 1: game over, score 3
    ]
    WANT = [(8, 10.0), (12, 11.0), (16, 3.0)]  # (global step, score) of the games that end

    def __init__(self, *args, **kwargs):
        self.observation_space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
        self.action_space = gym.spaces.Discrete(4)
        self.t = 0

    def reset(self):
        return np.zeros((2, 4, 84, 84), np.uint8), {}

    def step(self, action):
        assert action.shape == (2,)
        raw, life_lost, time_limit, game_over, lives = map(np.array, self.SCRIPT[self.t])
        self.t += 1
        info = dict(reward=raw.astype(np.float32), terminated=game_over.astype(np.int32), lives=lives.astype(np.int32))
        obs = np.full((2, 4, 84, 84), 20 * self.t, np.uint8)
        clipped = np.sign(raw).astype(np.float32)  # reward_clip: what the agent learns from
        return obs, clipped, life_lost.astype(bool) | game_over.astype(bool), time_limit.astype(bool), info

    def send(self, action):  # the twins' envs.step, in two halves
        self.action = action

    def recv(self):
        return self.step(self.action)

    def close(self):
        pass


@pytest.mark.parametrize("name", SCRIPTS)
def test_episode_accounting_on_a_scripted_env(mods, name, monkeypatch, tmp_path, capsys):
    """A game ends on its last life or at the time limit, never on a lost life; its score is the raw rewards' sum."""
    module = mods[name]
    monkeypatch.setattr(module, "make_env", ScriptedAtari)
    args = module.Args(num_envs=2, num_steps=8, total_timesteps=16, num_minibatches=1, update_epochs=1, cuda=False)
    args.results_file = str(tmp_path / "results.jsonl")
    validate, precision = torch.distributions.Distribution._validate_args, torch.get_float32_matmul_precision()
    try:
        module.main(args)
    finally:  # the twin switches these off for the process; leave the other tests as they found it
        torch.distributions.Distribution.set_default_validate_args(validate)
        torch.set_float32_matmul_precision(precision)
    (line,) = [strict_json(text) for text in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert line["status"] == "ok" and line["episodes"] == 3 and line["mean_return"] == pytest.approx(8.0)
    curve = read_curve(line, tmp_path).splitlines()
    assert [(int(row.split(",")[0]), float(row.split(",")[2])) for row in curve[1:]] == ScriptedAtari.WANT
    assert_summary_matches(capsys.readouterr().out, line, args.results_file)


# ---------------------------------------------------------------- scripts end to end


# two envs, two iterations of 128 steps: Breakout games end (seed 1: two of them, one scoring), the second iteration
# starts from the first one's last step, and the updates take minibatches of a shuffled batch
RUN = ("--num-envs", "2", "--num-steps", "128", "--num-minibatches", "2", "--update-epochs", "2")
RUN += ("--total-timesteps", "512", "--measure-burnin", "1")
VARIANTS = {"eager": (EAGER, ()), "twin": (TWIN, ()), "twin --compile": (TWIN, ("--compile",))}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each variant run twice with the same seed (the first saves its model); {variant: [(dir, line, curve), x2]}, the
    curve [(step, return)].

    The runs go two at a time (one thread each): on CI's two cores that halves the wait. The compiled variant's second
    run starts when its first has ended, so that it loads the first one's kernels from inductor's cache rather than
    compiling them a second time beside it.
    """

    def run(variant, attempt):
        name, flags = VARIANTS[variant]
        tmp = tmp_path_factory.mktemp(variant.replace(" ", "_").replace("-", ""))
        save = ("--save-model",) if attempt == 0 else ()
        proc, lines = run_script(name, *RUN, *flags, *save, tmp_path=tmp)
        assert proc.returncode == 0, proc.stderr[-3000:]
        (line,) = lines
        assert_finite_results_line(line, name)
        assert line["compile"] is ("--compile" in flags) and line["cudagraphs"] is False
        assert_summary_matches(proc.stdout, line, tmp / "results.jsonl")
        return tmp, line, curve_points(line, tmp)

    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {("twin --compile", 0): pool.submit(run, "twin --compile", 0)}  # the longest first
        futures |= {(v, i): pool.submit(run, v, i) for v in VARIANTS for i in range(2) if v != "twin --compile"}
        futures["twin --compile", 0].result()
        futures["twin --compile", 1] = pool.submit(run, "twin --compile", 1)
        return {variant: [futures[variant, i].result() for i in range(2)] for variant in VARIANTS}


@pytest.mark.parametrize("variant", VARIANTS)
def test_runs_are_deterministic(runs, variant):
    """Same seed, same machine, on CPU: the same numbers twice, also compiled."""
    (_, a, curve_a), (_, b, curve_b) = runs[variant]
    assert a["steps"] == 512 and a["episodes"] >= 2, a
    assert a["losses"] == b["losses"]
    assert (a["mean_return"], a["episodes"]) == (b["mean_return"], b["episodes"])
    assert curve_a == curve_b


def test_twin_plays_and_learns_like_the_eager_script(runs):
    """The twin without flags is the same algorithm: with the same seed it samples the same actions from the same
    weights, so the same games end with the same scores over both iterations. Its Adam is fused (same math, other
    rounding), so the weights after an update, and the last losses, agree to float32 rounding rather than bitwise."""
    (_, eager, eager_curve), _ = runs["eager"]
    (_, twin, twin_curve), _ = runs["twin"]
    assert twin_curve == eager_curve
    assert any(score > 0 for _, score in eager_curve), "no game scored: compare something that can differ"
    assert (twin["mean_return"], twin["episodes"]) == (eager["mean_return"], eager["episodes"])
    for key, value in eager["losses"].items():
        assert twin["losses"][key] == pytest.approx(value, rel=1e-3, abs=1e-6), key


def test_compiled_twin_plays_like_the_twin(runs):
    """Compiled, the policy samples with the same generator (multinomial stays an aten call), the convolutions and
    matmuls are the same kernels: the same games end with the same scores; the losses agree to float32 rounding."""
    (_, plain, plain_curve), _ = runs["twin"]
    (_, compiled, compiled_curve), _ = runs["twin --compile"]
    assert compiled_curve == plain_curve
    for key, value in plain["losses"].items():
        assert compiled["losses"][key] == pytest.approx(value, rel=1e-3, abs=1e-6), key


@pytest.mark.parametrize("variant", ["eager", "twin --compile"])
def test_checkpoint_plays_full_games(runs, variant):
    name = VARIANTS[variant][0]
    tmp, line, _ = runs[variant][0]
    checkpoint = tmp / line["run_name"] / f"{name}.pt"
    proc, lines = run_script(name, "--eval-checkpoint", str(checkpoint), "--eval-episodes", "1", tmp_path=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    evaluation = lines[-1]
    assert evaluation["mode"] == "eval" and evaluation["status"] == "ok"
    assert evaluation["episodes"] == 1 and math.isfinite(evaluation["mean_return"])
    assert evaluation["steps"] > 0 and evaluation["env_id"] == "Breakout-v5"
    summary = assert_summary_matches(proc.stdout, evaluation, tmp / "results.jsonl")
    assert Path(summary["run_dir"]) == checkpoint.parent  # an evaluation reports the checkpoint's folder


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_diverged_run_stops_with_a_strict_json_line(name, tmp_path):
    # a learning rate of 1e3 really diverges: Adam moves every weight by about 1e3 a step and the value head's output
    # overflows float32 within two minibatches
    flags = ("--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--total-timesteps", "64")
    proc, lines = run_script(name, *flags, "--learning-rate", "1e3", tmp_path=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    (line,) = lines  # run_script parsed it with a strict JSON parser: no NaN, no Infinity
    assert line["status"] == "diverged" and line["steps"] == 32
    assert line["sps"] is None  # it stopped inside its first iteration: no speed to report (not 0 steps/s)
    match = re.fullmatch(r"loss diverged at step 32: (\w+)=(nan|inf|-inf)", line["message"])
    assert match, line["message"]
    assert f"{name}.py: {line['message']}" in proc.stderr
    assert line["losses"][match[1]] is None  # the non-finite loss is written as null
    assert_summary_matches(proc.stdout, line, tmp_path / "results.jsonl")


def test_sigterm_stops_the_twin_with_its_line_curve_and_checkpoint(tmp_path):
    """A scheduler's SIGTERM once a game has ended: the twin stops as on Ctrl-C and exits 143 within seconds, with no
    traceback, leaving its results line (status interrupted), its return curve and its --save-model checkpoint, which
    --eval-checkpoint plays."""
    results = tmp_path / "results.jsonl"
    cmd = [sys.executable, str(ROOT / "leanrl" / f"{TWIN}.py"), "--no-cuda", "--results-file", str(results)]
    cmd += [*TINY, "1000000", "--save-model"]
    with started_runs([(cmd, {})], tmp_path) as procs:
        [(stdout, stderr)], seconds = stop(procs, signal.SIGTERM)
    assert procs[0].returncode == 143, stderr[-3000:]
    assert seconds < GRACE, seconds
    line = assert_stopped_run(stdout, stderr, results, signal.SIGTERM, TWIN)
    (tmp_path / "eval").mkdir()
    assert_checkpoint_evaluates(TWIN, tmp_path / line["run_name"] / f"{TWIN}.pt", tmp_path / "eval", episodes=1)


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
    (("--learning-rate", "-1"), "--learning-rate"),
]


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("flags,flag", BAD_INPUTS)
def test_bad_input_exits_2_with_one_line(mods, name, flags, flag, capsys, tmp_path):
    args = args_from_flags(mods[name], flags)
    assert_main_exits_2_with_one_line(mods[name], name, args, flag, capsys, tmp_path)


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("where", ["a folder", "under a file"])
def test_a_results_file_that_cannot_be_written_exits_2_with_one_line(mods, name, where, capsys, tmp_path):
    (tmp_path / "file").write_text("")
    results = tmp_path if where == "a folder" else tmp_path / "file" / "results.jsonl"
    with pytest.raises(SystemExit) as exit_info:
        mods[name].main(mods[name].Args(cuda=False, results_file=str(results)))
    assert exit_info.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith(f"{name}.py: error: --results-file {results}"), err
    assert [path.name for path in tmp_path.iterdir()] == ["file"]  # nothing written: no run folder, no results line


def test_atari_games_other_than_breakout_are_accepted(mods):
    for name in SCRIPTS:
        mods[name].check_args(mods[name].Args(env_id="Pong-v5", cuda=False))  # no exit


@pytest.mark.parametrize(
    "name,flags,flag",
    [
        (TWIN, ("--cudagraphs",), "--cudagraphs"),
        (EAGER, ("--env-id", "HalfCheetah-v4"), "--env-id"),
        (EAGER, ("--env-id", "CartPole-v1"), "--env-id"),  # gymnasium warns as envpool makes its spaces: silenced
    ],
)
def test_bad_input_from_the_command_line(name, flags, flag, tmp_path):
    proc, lines = run_script(name, *TINY, "64", *flags, tmp_path=tmp_path)
    assert proc.returncode == 2
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and flag in err[0] and "Traceback" not in proc.stderr, proc.stderr
    assert lines == []
    if flag == "--cudagraphs":
        assert err[0] == f"{name}.py: error: --cudagraphs needs CUDA, and none is available"


# ---------------------------------------------------------------- the GPU path, the steps/s window, the logs


def tiny_flags(*drop):
    """The tiny flags of tests/regression.py (10 iterations of 2 envs x 32 steps, 4 minibatches each), less `drop`."""
    from regression import PAIRS

    flags = list(PAIRS[EAGER])
    for flag in drop:
        i = flags.index(flag)
        del flags[i : i + 2]
    return flags


@pytest.fixture
def twin_settings():
    """The twin switches argument validation off and TF32 on for the process: leave the other tests as they were."""
    validate, precision = torch.distributions.Distribution._validate_args, torch.get_float32_matmul_precision()
    yield
    torch.distributions.Distribution.set_default_validate_args(validate)
    torch.set_float32_matmul_precision(precision)


# Every read of a tensor to the host in a tiny run of the twin (10 iterations of 32 env steps), by script line:
# - the action of each env step, to step the envs: 320 (.cpu(), then .numpy() of the host copy, which reads nothing
#   more but is counted on the same line);
# - the logged numbers once per iteration, in one read (the last minibatch's losses, the mean clipped fraction,
#   the explained variance), where the losses are checked: 10;
# - Adam's constructor checks its tensor lr (0 <= lr) once, before the loop: 1;
# - numpy's view of the step upload's pinned host buffer, made once (.numpy() of a host tensor: no sync): 1.
TWIN_HOST_READS = {
    "cpu at ppo_atari_envpool_torchcompile.py: env_groups[group].send(action.cpu().numpy())": 320,
    "numpy at ppo_atari_envpool_torchcompile.py: env_groups[group].send(action.cpu().numpy())": 320,
    "tolist at ppo_atari_envpool_torchcompile.py: *logged, explained_var = torch.cat(logged).tolist()": 10,
    "__bool__ at ppo_atari_envpool_torchcompile.py: optimizer = optim.Adam(": 1,
    "numpy at ppo_atari_envpool_torchcompile.py: host = staging.numpy()  # numpy's views of it, made once (a host "
    "tensor's: no sync)": 1,
}

# The twin's copies of host data to the device in that run, by line (tests/gpu_standin.py uploads()), the same with
# --cudagraphs and --compile --cudagraphs (a CUDA graph's input copies are tensordict's, not the script's): issue 40,
# one copy a (group's) env step, 320 (numpy writes the step's obs, reward and done into the group's rows of one host
# buffer, pinned on a GPU, laid out as the storage's rows, sent straight into row step + 1 non_blocking); the reset's
# obs, 1.
STEP_UPLOAD = (
    f"non_blocking copy_ at {TWIN}.py: received[step + 1, columns].copy_(staging[columns], non_blocking=True) from "
    f"the buffer made at {TWIN}.py: staging = torch.zeros(received.shape[1:], dtype=torch.uint8, "
    'pin_memory=device.type == "cuda")'
)
UPLOADS = {
    STEP_UPLOAD: 320,
    f"from host data at {TWIN}.py: obs[-1] = torch.as_tensor(np.concatenate([envs.reset()[0] for envs in env_groups]),"
    " device=device)": 1,
}


def pinned_uploads(flags):
    """tests/test_gpu_path.py counts the --cudagraphs and --compile --cudagraphs runs."""
    return UPLOADS


@pytest.mark.parametrize("cudagraphs", [False, True], ids=["plain", "cudagraphs"])
def test_host_reads_of_the_twin_are_the_pinned_ones(mods, cudagraphs, tmp_path, twin_settings):
    """A new read of a tensor to the host (a sync on a GPU) fails here, naming its line; so does a new copy of host data
    to the device (issue 40: the env step went up in two copies)."""
    from gpu_standin import host_reads, run_main, uploads

    with host_reads() as reads, uploads() as copies:
        line, _ = run_main(mods[TWIN], tiny_flags(), tmp_path, cudagraphs=cudagraphs)
    assert line["status"] == "ok" and line["steps"] == 640
    assert dict(reads) == TWIN_HOST_READS
    assert dict(copies) == UPLOADS


def test_step_functions_of_the_twin_run_on_the_meta_device(mods, twin_settings):
    """The policy step, GAE with the bootstrap value, the update and the logged statistics on `meta` tensors: a host
    read raises there ("cannot be called on meta tensors"), and a tensor made without device= lands on the CPU and
    cannot mix with them. The optimizer is SGD: fused Adam refuses meta tensors ("supported devices: cuda, cpu...")
    and Adam's other forms read their step count to the host, so Adam's step is not checked here."""
    from gpu_standin import host_reads

    twin = mods[TWIN]
    meta = torch.device("meta")
    torch.distributions.Categorical.set_default_validate_args(False)  # as the twin runs (a check is a host read)
    agent = twin.Agent(4).to(meta)
    T, B = 5, 3
    obs = torch.zeros((T + 1, B, 4, 84, 84), dtype=torch.uint8, device=meta)
    env_out = torch.zeros((T + 1, 2, B), device=meta)
    actions = torch.zeros((T, B), dtype=torch.long, device=meta)
    logprobs, values, advantages, returns = (torch.zeros((T, B), device=meta) for _ in range(4))
    optimizer = torch.optim.SGD(agent.parameters(), lr=0.1)
    with host_reads() as reads:
        action = twin.policy_step(agent, obs, actions, logprobs, values, torch.arange(T, device=meta)[2:3])
        twin.advantages_and_returns(agent, obs, env_out, values, advantages, returns, 0.99, 0.95)
        flat = (obs[:-1].flatten(0, 1), actions.view(-1), logprobs.view(-1), advantages.view(-1))
        flat += (returns.view(-1), values.view(-1))
        stats = twin.update(agent, optimizer, *flat, torch.arange(8, device=meta), **HYPER)
        explained = twin.explained_variance(values, returns)
    assert reads == {}
    assert (action.device, action.shape) == (meta, (B,))
    assert (stats.device, stats.shape, explained.device) == (meta, (len(twin.LOSSES),), meta)


class Stop(Exception):
    """Raised by a stand-in for optim.Adam once it has seen the optimizer's arguments."""


def adam_arguments(module, flags, monkeypatch, tmp_path):
    """The keyword arguments main() gives optim.Adam on a (pretended) CUDA machine with these flags."""
    seen = {}

    def adam(params, **kwargs):
        seen.update(kwargs)
        raise Stop

    real_tensor = torch.tensor
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "pretended GPU")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(torch.nn.Module, "to", lambda self, *args, **kwargs: self)  # the agent stays on the CPU
    monkeypatch.setattr(torch, "tensor", lambda data, device=None, **kwargs: real_tensor(data, **kwargs))
    monkeypatch.setattr(torch.optim, "Adam", adam)
    args = args_from_flags(module, ("--num-envs", "2", "--num-steps", "16", "--total-timesteps", "64", *flags))
    args.results_file = str(tmp_path / "results.jsonl")
    with pytest.raises(Stop):
        module.main(args)
    return seen


CUDA_FLAGS = {
    "plain": (),
    "compile": ("--compile", "True"),
    "cudagraphs": ("--cudagraphs", "True"),
    "compile-cudagraphs": ("--compile", "True", "--cudagraphs", "True"),
}


@pytest.mark.parametrize("flags", CUDA_FLAGS.values(), ids=CUDA_FLAGS)
def test_adam_is_capturable_on_cuda_whatever_the_flags(mods, flags, monkeypatch, tmp_path, twin_settings):
    """Issue 16 item 8: on CUDA the twin's Adam is capturable with or without --compile (torch.compile switches it on
    for the steps it compiles, not for a step taken before, eager, or for a loaded optimizer state)."""
    seen = adam_arguments(mods[TWIN], flags, monkeypatch, tmp_path)
    assert seen["capturable"] is True and seen["fused"] is True


class FakeClock:
    """bookkeeping's clock: moves only when told to."""

    def __init__(self):
        self.now = 1000.0

    def time(self):
        return self.now


def env_steps_cost(module, clock, seconds, monkeypatch):
    """Each env step of the script moves the clock by `seconds`: envpool's recv, which its step (the eager script)
    calls after send (the twin calls both itself), and its reset too (not timed)."""
    make_env = module.make_env

    def timed_make_env(*args, **kwargs):
        envs = make_env(*args, **kwargs)
        recv = envs.recv

        def timed_recv(*args, reset=False, **kwargs):
            clock.now += 0.0 if reset else seconds
            return recv(*args, reset=reset, **kwargs)

        envs.recv = timed_recv
        return envs

    monkeypatch.setattr(module, "make_env", timed_make_env)


def test_steps_per_second_leave_out_the_twins_compiling_and_capturing(mods, monkeypatch, tmp_path, twin_settings):
    """--measure-burnin at its default: every warm-up call (compiling, with --compile) and capture of the twin's CUDA
    graphs (the GAE graph's in iteration 3) made to take 1000 s, every env step 0.01 s: steps/s is 2 envs / 0.01 s
    exactly, none of the slow calls inside the window."""
    from gpu_standin import run_main
    from tensordict.nn import CudaGraphModule

    clock = FakeClock()
    monkeypatch.setattr(bk, "time", clock)
    env_steps_cost(mods[TWIN], clock, 0.01, monkeypatch)
    slow_calls = []

    class SlowWarmUps(CudaGraphModule):
        def __call__(self, *args, **kwargs):
            if self.counter < self._warmup:  # a warm-up call or the capture
                clock.now += 1000.0
                slow_calls.append(self)
            return super().__call__(*args, **kwargs)

    monkeypatch.setattr(mods[TWIN], "CudaGraphModule", SlowWarmUps)
    line, _ = run_main(mods[TWIN], tiny_flags("--measure-burnin"), tmp_path, cudagraphs=True)
    assert len(slow_calls) == 9  # three graphs, warmup=3 calls each (the last the capture)
    assert line["sps"] == pytest.approx(2 / 0.01)


@pytest.mark.parametrize("name", SCRIPTS)
def test_steps_per_second_leave_out_the_burnin_iterations(mods, name, monkeypatch, tmp_path, twin_settings):
    """--measure-burnin 2 with the first two iterations' updates made to take 1000 s each: steps/s is counted from the
    end of iteration 2 (2 envs / 0.01 s per env step); the run's speed figure never includes them."""
    clock = FakeClock()
    monkeypatch.setattr(bk, "time", clock)
    env_steps_cost(mods[name], clock, 0.01, monkeypatch)
    update, calls = mods[name].update, []

    def slow_early_update(*args, **kwargs):
        calls.append(1)
        clock.now += 1000.0 if len(calls) <= 8 else 0.0  # 4 minibatches an iteration
        return update(*args, **kwargs)

    monkeypatch.setattr(mods[name], "update", slow_early_update)
    line, _ = main_in_process(mods[name], [*tiny_flags("--measure-burnin"), "--measure-burnin", "2"], tmp_path)
    assert len(calls) == 40 and line["sps"] == pytest.approx(2 / 0.01)


CLEANRL_KEYS = {  # what CleanRL's ppo_atari_envpool.py logs each iteration, and the results line's name for it
    "charts/learning_rate": None,
    "losses/value_loss": "value",
    "losses/policy_loss": "policy",
    "losses/entropy": "entropy",
    "losses/old_approx_kl": "old_approx_kl",
    "losses/approx_kl": "approx_kl",
    "losses/clipfrac": "clipfrac",
    "losses/explained_variance": None,
}


@pytest.mark.parametrize("name", SCRIPTS)
def test_track_logs_cleanrls_keys_with_cleanrls_meanings(mods, name, fake_wandb, monkeypatch, tmp_path, twin_settings):
    """With --track: CleanRL's keys once an iteration, with CleanRL's meanings (the last minibatch's losses, the
    clipped fraction averaged over all the iteration's minibatches, the batch's explained variance), and the values
    of the results line."""
    module, per_minibatch, explained = mods[name], [], []
    update, explained_variance = module.update, module.explained_variance

    def recorded_update(*args, **kwargs):
        out = update(*args, **kwargs)
        named = dict(zip(module.LOSSES, out)) if name == TWIN else out
        per_minibatch.append({key: float(value) for key, value in named.items()})
        return out

    def recorded_explained_variance(values, returns):
        explained.append(explained_variance(values, returns))
        return explained[-1]

    monkeypatch.setattr(module, "update", recorded_update)
    monkeypatch.setattr(module, "explained_variance", recorded_explained_variance)
    # a clip range narrow enough for some ratios, not all, to leave it after the first minibatch
    flags = [*tiny_flags("--total-timesteps"), "--total-timesteps", "192", "--learning-rate", "0.003", "--track"]
    flags += ["--clip-coef", "0.002"]
    line, _ = main_in_process(module, flags, tmp_path)
    logs = [data for _, data in fake_wandb.logs if "losses/value_loss" in data]
    assert len(logs) == 3 and len(per_minibatch) == 12 and len(explained) == 3
    for iteration, data in enumerate(logs):
        assert set(data) == set(CLEANRL_KEYS) | {"charts/SPS"}
        minibatches = per_minibatch[4 * iteration : 4 * iteration + 4]
        last = minibatches[-1]
        for key, short in CLEANRL_KEYS.items():
            if short and short != "clipfrac":
                assert data[key] == pytest.approx(last[short], rel=1e-6, abs=1e-9), key
        mean_clipfrac = sum(m["clipfrac"] for m in minibatches) / 4
        assert data["losses/clipfrac"] == pytest.approx(mean_clipfrac, rel=1e-6, abs=1e-9)
        assert data["losses/explained_variance"] == pytest.approx(float(explained[iteration]), rel=1e-6)
        assert data["charts/learning_rate"] == pytest.approx(0.003 * (1 - iteration / 3))
    assert len({m["clipfrac"] for m in per_minibatch[-4:]}) > 2, "the clipped fraction must vary to test its mean"
    for key, short in CLEANRL_KEYS.items():  # the results line reports the last iteration's numbers
        if short:
            assert line["losses"][short] == pytest.approx(logs[-1][key], rel=1e-6, abs=1e-9), key
    assert fake_wandb.finished
