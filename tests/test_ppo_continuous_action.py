"""PPO continuous-action pair: the math against float64 references, the twin against the eager script, the twin's
compiled pieces (whole graphs, pinned breaks, no recompiles), the scripts as subprocesses on CPU (smoke, save and
evaluate, bad input, a real divergence, determinism) and learning on InvertedPendulum-v4."""

import copy
import csv
import math
import re
import signal
import sys
import types
from functools import partial
from pathlib import Path

import gymnasium as gym
import pytest
import torch
import tyro
from conftest import (
    EXIT_CODES,
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
)
from gpu_standin import CONTRACTS, host_reads, run_main
from reference import gae_reference, ppo_loss_reference, random_ppo_minibatch, random_rollout
from regression import PAIRS
from test_gpu_path import MAX_BYTES_IN, same_run

from leanrl import bookkeeping as bk

EAGER, TWIN = "ppo_continuous_action", "ppo_continuous_action_torchcompile"
SCRIPTS = [EAGER, TWIN]
eager, twin = load_script(EAGER), load_script(TWIN)
MODULES = {EAGER: eager, TWIN: twin}

# a few iterations of a few steps: enough to run every part of a script
TINY = ["--num-steps", "64", "--num-minibatches", "2", "--update-epochs", "2", "--total-timesteps", "192"]


@pytest.fixture(autouse=True)
def one_torch_thread(monkeypatch):
    # the MLPs are tiny: a second intra-op thread only adds synchronisation, and on a busy 2-core machine it
    # makes every matmul wait for a core (about 50x slower); one thread keeps the subprocess runs quick and steady
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


# ---------------------------------------------------------------- GAE


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("shape", [(1, 16), (2, 8), (2048, 1), (128, 8)])
@pytest.mark.parametrize("gamma,gae_lambda", [(0.99, 0.95), (0.9, 1.0)])
def test_gae_matches_float64_reference(name, shape, gamma, gae_lambda):
    T, B = shape
    rewards, values, dones, next_value, next_done = random_rollout(T, B, seed=T * 1000 + B, done_prob=0.3)
    # episode ends that the recursion reads: dones[1:] inside the rollout, next_done at its end
    assert dones[1:].sum() + next_done.sum() > 0
    got = MODULES[name].gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda)
    want = gae_reference(rewards, values, dones, next_value, next_done, gamma, gae_lambda)
    assert got.shape == (T, B) and got.dtype == torch.float32
    # float32 against float64: over T=2048 the sums (about 1 / (1 - gamma * lambda) terms of size ~1) are
    # accumulated in a different order by the doubling scan, so allow 1e-4 absolute and relative
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(2048, 4), (128, 8), (5, 3)])
def test_twin_gae_equals_eager_gae(shape):
    T, B = shape
    inputs = random_rollout(T, B, seed=7 + T)
    got = twin.gae(*inputs, 0.99, 0.95)
    want = eager.gae(*inputs, 0.99, 0.95)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_twin_gae_compiles_whole_once_to_the_same_values():
    """fullgraph=True: the doubling scan is one graph; a new rollout of the same shape runs it again, no recompile."""
    compiled = torch.compile(twin.gae, fullgraph=True)
    for iteration in range(2):
        inputs = random_rollout(2048, 1, seed=3 + iteration)
        with torch._dynamo.config.patch(error_on_recompile=iteration > 0):
            got = compiled(*inputs, 0.99, 0.95)
        torch.testing.assert_close(got, twin.gae(*inputs, 0.99, 0.95), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- PPO loss


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("n", [64, 7])
@pytest.mark.parametrize("norm_adv", [True, False])
@pytest.mark.parametrize("clip_vloss", [True, False])
def test_ppo_loss_matches_float64_reference(name, n, norm_adv, clip_vloss):
    newlogprob, oldlogprob, entropy, newvalue, oldvalue, advantages, returns = random_ppo_minibatch(n, seed=n)
    clip_coef, ent_coef, vf_coef = 0.2, 0.01, 0.5
    ratio = (newlogprob - oldlogprob).exp()
    assert 0 < ((ratio - 1).abs() > clip_coef).float().mean() < 1, "want clipped and unclipped ratios"
    assert 0 < ((newvalue - oldvalue).abs() > clip_coef).float().mean() < 1, "want clipped and unclipped values"
    loss, stats = MODULES[name].ppo_loss(
        newlogprob, oldlogprob, entropy, newvalue[:, None], oldvalue, advantages, returns,
        clip_coef, ent_coef, vf_coef, norm_adv, clip_vloss,
    )  # fmt: skip
    want = ppo_loss_reference(
        newlogprob, oldlogprob, entropy, newvalue, oldvalue, advantages, returns,
        clip_coef, ent_coef, vf_coef, norm_adv, clip_vloss,
    )  # fmt: skip
    # CleanRL also logs old_approx_kl, the mean of -log(ratio) (the shared reference predates it)
    want["old_approx_kl"] = sum(old - new for old, new in zip(oldlogprob.tolist(), newlogprob.tolist())) / n
    assert want["clipfrac"] > 0 and want["old_approx_kl"] != 0
    got = {"loss": loss, **stats}
    assert set(got) == set(want)
    for key, value in want.items():
        assert isinstance(got[key], torch.Tensor), key
        torch.testing.assert_close(got[key].double(), torch.tensor(value, dtype=torch.float64), msg=key)


def test_twin_ppo_loss_equals_eager_ppo_loss():
    inputs = random_ppo_minibatch(64, seed=11)
    for norm_adv in (True, False):
        for clip_vloss in (True, False):
            got_loss, got = twin.ppo_loss(*inputs, 0.2, 0.01, 0.5, norm_adv, clip_vloss)
            want_loss, want = eager.ppo_loss(*inputs, 0.2, 0.01, 0.5, norm_adv, clip_vloss)
            torch.testing.assert_close(got_loss, want_loss)
            torch.testing.assert_close(got, want)


# ---------------------------------------------------------------- update


SPACES = types.SimpleNamespace(
    single_observation_space=gym.spaces.Box(-10, 10, (5,)), single_action_space=gym.spaces.Box(-1, 1, (2,))
)
HYPER = dict(clip_coef=0.2, ent_coef=0.01, vf_coef=0.5, norm_adv=True, clip_vloss=True, max_grad_norm=0.5)


FIELDS = ("obs", "actions", "logprobs", "advantages", "returns", "values")  # the twin's update takes them in this order


def flat_batch(n, seed):
    """A random flat batch of n samples: the tensors the twin's update is bound to, in FIELDS order."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(n, generator=g)
    return (
        torch.randn(n, 5, generator=g),
        torch.randn(n, 2, generator=g),
        torch.randn(n, generator=g) - 2.0,
        torch.randn(n, generator=g),
        values + torch.randn(n, generator=g),
        values,
    )


def minibatches(n, size, seed):
    """The shuffled minibatch indices of one epoch, as the twin draws them: views of one permutation."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed)).split(size)


@pytest.mark.parametrize("max_grad_norm", [1e-3, 1e6], ids=["clipped", "unclipped"])
def test_twin_update_equals_eager_update(float64, max_grad_norm):
    """Same weights, same minibatches: the twin's update, which gathers its minibatch from the whole flat batch by
    index, takes its gradients with torch.autograd.grad, clips them with tensor ops and steps Adam as tensor ops
    (tensor lr, annealed in place), moves the weights as the eager one (backward(), clip_grad_norm_, torch.optim.Adam)
    does on the minibatch gathered for it. In float64, as TD3's test: in float32 Adam's two orders of operations round
    apart on near-zero gradients."""
    torch.manual_seed(0)
    agent_e = eager.Agent(SPACES)
    agent_t = twin.Agent(SPACES)
    agent_t.load_state_dict(agent_e.state_dict())
    opt_e = torch.optim.Adam(agent_e.parameters(), lr=3e-4, eps=1e-5)
    opt_t = twin.make_adam(list(agent_t.parameters()), lr=torch.tensor(3e-4), eps=1e-5)
    hyper = {**HYPER, "max_grad_norm": max_grad_norm}
    batch = [x.double() if x.is_floating_point() else x for x in flat_batch(256, 0)]
    for i, mb_inds in enumerate(minibatches(256, 64, 1)):
        if i == 2:  # the annealing: the eager script sets a float, the twin fills its lr tensor in place
            opt_e.param_groups[0]["lr"] = 1e-4
            opt_t["lr"].fill_(1e-4)
        want = eager.update(agent_e, opt_e, {k: x[mb_inds] for k, x in zip(FIELDS, batch)}, **hyper)
        got = twin.update(agent_t, opt_t, *batch, mb_inds, **hyper)
        # the twin returns the same statistics as one stacked tensor (one output for a CUDA graph to clone)
        assert got.shape == (len(twin.LOGGED),) and set(twin.LOGGED) == set(want)
        # (clipfrac: a float32 mean of a .float() mask in both, which the twin's stack makes float64)
        torch.testing.assert_close(dict(zip(twin.LOGGED, got)), want, check_dtype=False)
        torch.testing.assert_close(agent_t.state_dict(), agent_e.state_dict())
    # Adam's moments: the clipped gradients themselves, averaged (1e-3 clips every step, 1e6 none)
    for key in ("exp_avg", "exp_avg_sq"):
        torch.testing.assert_close(opt_t[key], [opt_e.state[p][key] for p in agent_e.parameters()])
    # the minibatch matters: the same step on other rows of the batch gives other losses
    agent_o, opt_o = copy.deepcopy((agent_t, opt_t))  # one copy: the copied Adam holds the copied parameters
    other = twin.update(agent_o, opt_o, *batch, minibatches(256, 64, 2)[0], **hyper)
    assert other[0] != got[0]


# aot_eager in CI: Dynamo's graphs and AOTAutograd's functionalized update, run with eager's kernels. Inductor's
# kernels, which the twin's --compile runs in this file build and run, are compared with -m slow (32 s in a cold CI run)
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_update_equals_eager_update(backend):
    """torch.compile(update) on CPU: same losses and the same new parameters as the eager update, step by step."""
    torch.manual_seed(0)
    agent = twin.Agent(SPACES)
    agent_c = copy.deepcopy(agent)
    opt = twin.make_adam(list(agent.parameters()), lr=torch.tensor(3e-4), eps=1e-5)
    opt_c = twin.make_adam(list(agent_c.parameters()), lr=torch.tensor(3e-4), eps=1e-5)
    batch = flat_batch(256, 0)
    mb_inds = minibatches(256, 64, 0) + minibatches(256, 64, 1)
    compiled = torch.compile(twin.update, backend=backend, fullgraph=True)  # fullgraph: one graph, no break
    for i in range(6):
        if i == 3:  # the annealing writes the tensor lr in place: no recompile, and the step uses the new value
            opt["lr"].fill_(1e-4)
            opt_c["lr"].fill_(1e-4)
        # other minibatches (views at other offsets of a permutation), the same bound batch: the one graph
        want = twin.update(agent, opt, *batch, mb_inds[i], **HYPER)
        # trace_autograd_ops as the twin's main sets it with --compile: torch.autograd.grad traced into the graph
        with torch._dynamo.config.patch(error_on_recompile=i > 0, trace_autograd_ops=True):
            got = compiled(agent_c, opt_c, *batch, mb_inds[i], **HYPER)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(agent_c.state_dict(), agent.state_dict(), rtol=1e-5, atol=1e-6)
    assert not torch.equal(agent.actor_logstd, torch.zeros_like(agent.actor_logstd)), "the update did nothing"


def rollout_storage(T, B, seed):
    """The twin's rollout storage with random contents: env_out (T + 1, B, 5 + 2) holds rows of (obs, reward, done),
    with episode ends; returns env_out, its obs, rewards and dones views, and actions, logprobs, values."""
    g = torch.Generator().manual_seed(seed)
    env_out = torch.randn(T + 1, B, 5 + 2, generator=g)
    env_out[..., -1] = (torch.rand(T + 1, B, generator=g) < 0.3).float()
    obs, rewards, dones = env_out[..., :5], env_out[..., 5], env_out[..., 6]
    return env_out, obs, rewards, dones, torch.zeros(T, B, 2), torch.zeros(T, B), torch.zeros(T, B)


def test_twin_policy_step_compiles_whole_once_and_samples_as_eager():
    """The policy step as the twin compiles it on CPU (fullgraph=True here, aten's RNG): one graph for every step (the
    step is an index tensor), and with the same seed it writes into the storage the actions, log-probs and values the
    eager script's policy gives for obs[step]; what the env returned is left as it was."""
    torch.manual_seed(0)
    agent = twin.Agent(SPACES)
    T, B = 4, 3
    env_out, obs, _, _, actions, logprobs, values = rollout_storage(T, B, seed=1)
    before = env_out.clone()
    compiled = torch.compile(twin.policy_step, fullgraph=True, options={"fallback_random": True})
    steps = torch.arange(T)
    for step in range(T):
        torch.manual_seed(step)
        with torch.no_grad():
            want = eager.Agent.get_action_and_value(agent, obs[step])
        torch.manual_seed(step)
        with torch._dynamo.config.patch(error_on_recompile=step > 0):
            action = compiled(agent, obs, actions, logprobs, values, steps[step : step + 1])
        torch.testing.assert_close(action, want[0])
        torch.testing.assert_close(actions[step], want[0])
        torch.testing.assert_close(logprobs[step], want[1])
        torch.testing.assert_close(values[step], want[3].flatten())
    assert torch.equal(env_out, before)
    assert (logprobs != 0).all() and (values != 0).all(), "a step was not written"


def test_twin_bootstrap_and_gae_compile_whole_to_the_float64_reference():
    """The bootstrap value of obs[T] and GAE, one function of the storage compiled with fullgraph=True: the advantages
    and returns it writes equal the float64 reference with next_value = V(obs[T]), and the next rollout (new numbers,
    same storage) runs the same graph."""
    torch.manual_seed(0)
    agent = twin.Agent(SPACES)
    T, B = 16, 3
    env_out, obs, rewards, dones, _, _, values = rollout_storage(T, B, seed=2)
    values.copy_(torch.randn(T, B, generator=torch.Generator().manual_seed(3)))
    advantages, returns = torch.zeros(T, B), torch.zeros(T, B)
    compiled = torch.compile(twin.advantages_and_returns, fullgraph=True)
    for iteration in range(2):
        with torch._dynamo.config.patch(error_on_recompile=iteration > 0):
            compiled(agent, obs, rewards, dones, values, advantages, returns, 0.99, 0.95)
        with torch.no_grad():
            next_value = agent.get_value(obs[T]).flatten()
        # rewards and dones as the eager script keeps them: row t of each is what step t returned
        assert dones[1:T].sum() > 0 and 0 < dones[T].sum() < B and next_value.abs().min() > 0
        want = gae_reference(rewards[1:], values, dones[:T], next_value, dones[T], 0.99, 0.95)
        torch.testing.assert_close(advantages.double(), want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(returns.double(), want + values.double(), rtol=1e-5, atol=1e-5)
        env_out[..., :6] += 0.5  # the next rollout's observations and rewards: same graph, new numbers


def test_the_twin_update_compiles_to_one_graph():
    """With trace_autograd_ops (the twin's --compile), the update, its gradients, their clipping and Adam's step
    included, is one graph: no break (fullgraph=True would raise at one), no frame resumed in Python, and nothing
    recompiles over other minibatches (other indices, at other offsets) and an annealed lr (a tensor written in
    place). With backward() and torch.optim.Adam's step it was 4 graphs at 3 breaks."""
    torch.manual_seed(0)
    agent = twin.Agent(SPACES)
    optimizer = twin.make_adam(list(agent.parameters()), lr=torch.tensor(3e-4), eps=1e-5)
    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    update = torch.compile(twin.update, backend=counting_backend, fullgraph=True)
    update = partial(update, agent, optimizer, *flat_batch(256, 0))
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        update(minibatches(256, 64, 0)[0], **HYPER)
        assert len(graphs) == 1
        with torch._dynamo.config.patch(error_on_recompile=True):
            for i in range(1, 5):
                optimizer["lr"].fill_(3e-4 / (i + 1))
                update(minibatches(256, 64, i)[i % 4], **HYPER)
    assert len(graphs) == 1 and optimizer["step"] == 5


# ---------------------------------------------------------------- the GPU path, on the CPU (tests/gpu_standin.py)

# the tiny settings of tests/regression.py: Pendulum-v1, 7 iterations of 64 steps, 2 epochs of 2 minibatches of 32
REGRESSION = list(PAIRS[EAGER])
ITERATIONS, STEPS, UPDATES = 7, 64, 4  # iterations, env steps and minibatch updates per iteration

STEP = "next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())"
HOST_READS = {  # by "method at file: line"; the same with and without --compile --cudagraphs
    # the env steps on the host: the action is read once per env step (.cpu() is the sync; .numpy() of its result,
    # already on the host, is counted too)
    f"cpu at {TWIN}.py: {STEP}": ITERATIONS * STEPS,
    f"numpy at {TWIN}.py: {STEP}": ITERATIONS * STEPS,
    # the log point, once per iteration: the losses, clipfrac, explained variance and lr in one stacked read
    # (--target-kl, off by default, adds CleanRL's early-stop test of approx_kl: one read per epoch)
    "tolist at bookkeeping.py: values = torch.stack([v.detach().float() for v in values]).tolist()": ITERATIONS,
    # setup, once: the numpy view of the storage's host copy
    f"numpy at {TWIN}.py: host_np = host.numpy()": 1,
}


def pinned_host_reads(flags):
    """The host reads of a twin run at the regression flags and these flags (tests/test_gpu_path.py counts its
    --cudagraphs and --compile --cudagraphs runs)."""
    return HOST_READS


def test_host_reads_of_the_twin_are_the_pinned_ones(tmp_path):
    """Every read of a tensor to the host in a twin run, counted by line: a new one fails here, naming its line. The
    runs with --cudagraphs and --compile --cudagraphs are counted in tests/test_gpu_path.py."""
    with host_reads() as reads:
        line, _ = run_main(twin, REGRESSION, tmp_path)
    assert line["status"] == "ok" and line["steps"] == ITERATIONS * STEPS
    assert dict(reads) == pinned_host_reads([])


@pytest.mark.parametrize("flags", [[], ["--compile"]], ids=["cudagraphs", "compile-cudagraphs"])
def test_the_twins_own_optimizer_is_captured(flags, tmp_path):
    """Issue 16 item 8: the Adam the twin makes (not one the stand-in forces capturable) is capturable under
    --cudagraphs, with or without --compile: the update is captured, and the run gives the numbers of the run without
    CUDA graphs. A non-capturable Adam reads its step count to the host in step(), which a capture refuses."""
    want = run_main(twin, REGRESSION + flags, tmp_path / "plain")
    got = run_main(twin, REGRESSION + flags, tmp_path / "graphs", cudagraphs=True, force_capturable=False)
    same_run(got, want)
    assert {contract.name for contract in CONTRACTS} == {"policy_step", "advantages_and_returns", "update"}
    for contract in CONTRACTS:
        assert contract.captured_at is not None and contract.violations(MAX_BYTES_IN[TWIN]) == []


def test_twin_steps_run_on_the_meta_device():
    """The policy step, GAE with its bootstrap value, the loss and the update (Adam as tensor ops) on the meta
    device, which has no data: a host read (.item(), a data-dependent branch) raises there, and so does a tensor made
    on the CPU (without device=) meeting the storage. Not here: the explained variance and the clipfrac mean of the log
    point (a few ops inline in main)."""
    meta = torch.device("meta")
    agent = twin.Agent(SPACES).to(meta)
    T, B = 8, 3
    env_out, obs, rewards, dones, actions, logprobs, values = (x.to(meta) for x in rollout_storage(T, B, seed=0))
    advantages, returns = torch.zeros(T, B, device=meta), torch.zeros(T, B, device=meta)
    action = twin.policy_step(agent, obs, actions, logprobs, values, torch.arange(T, device=meta)[2:3])
    assert action.device == meta and action.shape == (B, 2)
    twin.advantages_and_returns(agent, obs, rewards, dones, values, advantages, returns, 0.99, 0.95)
    gae = twin.gae(rewards[1:], values, dones[:-1], values[0], dones[-1], 0.99, 0.95)
    assert gae.device == meta and gae.shape == (T, B)
    loss, stats = twin.ppo_loss(*(x.to(meta) for x in random_ppo_minibatch(16, seed=0)), 0.2, 0.01, 0.5, True, True)
    assert loss.device == meta and all(v.device == meta for v in stats.values())
    optimizer = twin.make_adam(list(agent.parameters()), lr=torch.tensor(3e-4, device=meta), eps=1e-5)
    flat = (obs[:-1].flatten(0, 1), actions.flatten(0, 1), logprobs.view(-1), advantages.view(-1), returns.view(-1))
    for mb_inds in torch.randperm(T * B, device=meta).split(T * B // 2):
        got = twin.update(agent, optimizer, *flat, values.view(-1), mb_inds, **HYPER)
        assert got.device == meta and got.shape == (len(twin.LOGGED),)
    assert all(t.device == meta for key in ("exp_avg", "exp_avg_sq") for t in optimizer[key])
    assert optimizer["step"].device == meta


# the iteration in which each CUDA graph of the twin is captured at the default flags (2048 steps per iteration,
# 10 epochs of 32 minibatches): its warmup-th call, at these calls per iteration
CALLS_PER_ITERATION = {"policy_step": 2048, "advantages_and_returns": 1, "update": 320}


def test_default_measure_burnin_leaves_compilation_and_capture_out(tmp_path):
    """--measure-burnin's default covers every warm-up and capture of the twin at the default flags, with a margin:
    GAE, called once an iteration, is captured at its warmup-th call."""
    run_main(twin, REGRESSION, tmp_path, cudagraphs=True)
    captured_in = {c.name: math.ceil(c.captured_at / CALLS_PER_ITERATION[c.name]) for c in CONTRACTS}
    assert set(captured_in) == set(CALLS_PER_ITERATION)
    assert max(captured_in.values()) + 2 <= twin.Args.measure_burnin == eager.Args.measure_burnin, captured_in
    # one meaning in every script (issue 16 item 6), in its flag's docstring
    meaning = "iterations after learning starts left out of steps/s (compilation and CUDA-graph capture happen in them)"
    for name in SCRIPTS:
        source = (ROOT / "leanrl" / f"{name}.py").read_text()
        assert f'measure_burnin: int = {twin.Args.measure_burnin}\n    """{meaning}"""' in source, name


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
    """With --track, each iteration logs CleanRL's keys: the last minibatch's losses, the mean clipfrac of all the
    iteration's minibatches, the explained variance of the values against the returns and the annealed lr; the last
    log point's values are the ones in the results line. Checked against the updates and GAE calls of the run."""
    module = MODULES[name]
    updates, rollouts = [], []

    def recorded_update(*args, **kwargs):
        out = module_update(*args, **kwargs)
        updates.append(out if isinstance(out, dict) else dict(zip(module.LOGGED, out)))
        return out

    def recorded_gae(rewards, values, *args):
        advantages = module_gae(rewards, values, *args)
        rollouts.append((values.double().clone(), (advantages + values).double()))
        return advantages

    module_update, module_gae = module.update, module.gae
    monkeypatch.setattr(module, "update", recorded_update)
    monkeypatch.setattr(module, "gae", recorded_gae)
    line, _ = main_in_process(module, REGRESSION + ["--track"], tmp_path)
    logs = [(step, data) for step, data in fake_wandb.logs if "losses/value_loss" in data]
    assert fake_wandb.keys() == {
        "charts/episodic_return", "charts/episodic_length", "charts/SPS", "charts/learning_rate",
        "losses/value_loss", "losses/policy_loss", "losses/entropy", "losses/old_approx_kl", "losses/approx_kl",
        "losses/clipfrac", "losses/explained_variance",
    }  # fmt: skip
    assert [step for step, _ in logs] == [STEPS * i for i in range(1, ITERATIONS + 1)]
    assert len(updates) == ITERATIONS * UPDATES and len(rollouts) == ITERATIONS
    short = {"value_loss": "value", "policy_loss": "policy"}
    for i, (_, data) in enumerate(logs):
        minibatches, (values, returns) = updates[UPDATES * i : UPDATES * (i + 1)], rollouts[i]
        for key in ("value_loss", "policy_loss", "entropy", "old_approx_kl", "approx_kl"):
            assert data[f"losses/{key}"] == pytest.approx(minibatches[-1][short.get(key, key)].item(), rel=1e-6), key
        clipfracs = [stats["clipfrac"].item() for stats in minibatches]
        assert data["losses/clipfrac"] == pytest.approx(sum(clipfracs) / UPDATES, rel=1e-6, abs=1e-9)
        explained = 1 - (returns - values).var(correction=0) / returns.var(correction=0)
        assert data["losses/explained_variance"] == pytest.approx(explained.item(), rel=1e-4, abs=1e-5)
        assert data["charts/learning_rate"] == pytest.approx(3e-4 * (1 - i / ITERATIONS), rel=1e-6)
    # the results line reports the last log point, under its short names
    last = logs[-1][1]
    losses = {**line["losses"], "value_loss": line["losses"]["value"], "policy_loss": line["losses"]["policy"]}
    for key, value in last.items():
        if key.startswith("losses/"):
            assert losses[key.removeprefix("losses/")] == value, key
    assert line["losses"]["learning_rate"] == last["charts/learning_rate"]


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
    """--eval-checkpoint of a file that holds no weights and statistics: one line naming the flag, exit 2."""
    path = tmp_path / "other.pt"
    torch.save({"args": {}, "model": {}}, path)  # no obs_rms: another script's checkpoint
    for name in SCRIPTS:
        args = args_from_flags(MODULES[name], ["--eval-checkpoint", str(path)])
        assert_main_exits_2_with_one_line(MODULES[name], name, args, "--eval-checkpoint", capsys, tmp_path)


# ---------------------------------------------------------------- scripts as subprocesses


def check_returns_csv(line, tmp_path, name="returns.csv"):
    path = tmp_path / line["run_name"] / name
    rows = list(csv.reader(path.open()))
    assert rows[0] == ["step", "wall_s", "return"]
    assert len(rows) - 1 == line["episodes"]


VARIANTS = [(EAGER, []), (TWIN, []), (TWIN, ["--compile"])]


@pytest.mark.parametrize("name,flags", VARIANTS, ids=["eager", "twin", "twin-compile"])
def test_smoke_halfcheetah_twice_the_same(name, flags, tmp_path):
    """The default env runs, writes its results, prints its summary; and the same seed on CPU gives the same numbers
    twice (the twin with and without --compile too). No episode of HalfCheetah ends in 192 steps, but the last
    losses depend on every observation, action and reward of the three rollouts and on every update before them."""
    runs = []
    for d in "ab":
        (tmp_path / d).mkdir()
        runs.append(run_script(name, *TINY, *flags, tmp_path=tmp_path / d))
    for d, (proc, lines) in zip("ab", runs):
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert len(lines) == 1
        line = lines[0]
        assert_finite_results_line(line, name)
        assert line["env_id"] == "HalfCheetah-v4" and line["mode"] == "train"
        assert line["steps"] == 192 and line["compile"] == ("--compile" in flags) and line["cudagraphs"] is False
        check_returns_csv(line, tmp_path / d)
        assert_summary_matches(proc.stdout, line, tmp_path / d / "results.jsonl")
        # HalfCheetah-v4's XML uses MuJoCo 4's deprecated settotalmass: the scripts drop exactly that warning
        assert "settotalmass" not in proc.stderr + proc.stdout and not (tmp_path / d / "MUJOCO_LOG.TXT").exists()
    (_, [first]), (_, [second]) = runs
    for key in ("losses", "mean_return", "episodes", "steps"):
        assert first[key] == second[key], key


@pytest.mark.parametrize("name", SCRIPTS)
def test_save_model_then_evaluate_checkpoint(name, tmp_path):
    args = ["--env-id", "InvertedPendulum-v4", *TINY, "--save-model"]
    proc, lines = run_script(name, *args, tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    checkpoint_path = tmp_path / lines[0]["run_name"] / f"{name}.pt"
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    assert checkpoint["args"]["env_id"] == "InvertedPendulum-v4"
    # the observation statistics that evaluation needs were saved, and training did move them
    rms = checkpoint["obs_rms"]
    assert rms["count"] > 100 and not torch.allclose(rms["var"], torch.ones_like(rms["var"]))

    eval_args = ["--eval-checkpoint", str(checkpoint_path), "--eval-episodes", "3", "--seed", "5"]
    proc, lines = run_script(name, *eval_args, tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = lines[-1]
    assert line["mode"] == "eval" and line["status"] == "ok" and line["env_id"] == "InvertedPendulum-v4"
    assert line["episodes"] == 3
    summary = assert_summary_matches(proc.stdout, line, tmp_path / "results.jsonl")
    assert Path(summary["run_dir"]) == checkpoint_path.parent.resolve()
    # the evaluation's return curve is in the checkpoint's folder, next to the training's
    assert line["run_name"] == checkpoint_path.parent.name
    check_returns_csv(line, tmp_path, "eval_returns.csv")
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
    obs, _ = envs.reset(seed=seed)
    returns, steps = [], 0
    while len(returns) < episodes:
        with torch.no_grad():
            action = agent.actor_mean(torch.as_tensor(obs, dtype=torch.float32))
        obs, _, _, _, infos = envs.step(action.numpy())
        steps += 1
        returns += [r for r, _ in bk.gym_episodes(infos)]
    envs.close()
    return returns, steps


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
    check_bad_input(EAGER, args, flag, tmp_path)


@pytest.mark.parametrize("args,flag", [(["--cudagraphs"], "--cudagraphs"), BAD_INPUTS[2], BAD_INPUTS[4]])
def test_twin_bad_input_exits_2_with_one_line(args, flag, tmp_path):
    check_bad_input(TWIN, args, flag, tmp_path)


def check_bad_input(name, args, flag, tmp_path):
    (tmp_path / "a_file").write_text("")  # runs in tmp_path: the folder that --results-file a_file/... cannot be
    proc, lines = run_script(name, *args, tmp_path=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    stderr_lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(stderr_lines) == 1, proc.stderr
    assert stderr_lines[0].startswith(f"{name}.py: error: ") and flag in stderr_lines[0], stderr_lines[0]
    assert "Traceback" not in proc.stderr
    assert lines == [], "a bad input must not write a results line"


@pytest.mark.parametrize("args,flag", BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_twin_check_args_rejects_bad_input(args, flag, capsys, tmp_path, monkeypatch):
    """The twin's checks in-process (a subprocess each would only repeat the eager script's runs above)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("")
    cli = tyro.cli(twin.Args, args=args)
    with pytest.raises(SystemExit) as exit_info:
        twin.check_args(cli)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"{TWIN}.py: error: ") and flag in err, err


@pytest.mark.parametrize("name", SCRIPTS)
def test_non_finite_loss_stops_the_run_as_diverged(name, tmp_path):
    # a NaN value coefficient is the most direct way to make the loss non-finite
    args = ["--env-id", "InvertedPendulum-v4", *TINY, "--vf-coef", "nan"]
    proc, lines = run_script(name, *args, tmp_path=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert f"{name}.py: loss diverged at step 64: loss=nan" in proc.stderr
    assert "Traceback" not in proc.stderr
    [line] = lines  # run_script parsed it as strict JSON
    assert line["status"] == "diverged" and line["message"] == "loss diverged at step 64: loss=nan"
    assert line["steps"] == 64 and line["losses"]["loss"] is None  # non-finite values are written as null
    assert_summary_matches(proc.stdout, line, tmp_path / "results.jsonl")


# what each script reports when a huge learning rate wrecks the policy in its first update: the twin (no argument
# checks) computes a NaN loss; the eager script's Normal refuses the collapsed std before a loss exists
DIVERGED_MESSAGE = {
    EAGER: r"loss diverged at step 64: the policy's Normal got invalid parameters",
    TWIN: r"loss diverged at step 64: (loss|policy|value|entropy|approx_kl)=(nan|inf|-inf)",
}


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_real_divergence_is_reported_in_strict_json(name, tmp_path):
    """A learning rate of 1e6 really diverges: the run stops in its first iteration, exit 1, status diverged, a
    message naming the step and the loss, and a results line that a strict JSON parser reads."""
    args = ["--env-id", "InvertedPendulum-v4", *TINY, "--learning-rate", "1e6"]
    proc, lines = run_script(name, *args, tmp_path=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    [line] = lines  # run_script parsed it as strict JSON
    assert line["status"] == "diverged" and line["steps"] == 64
    assert re.fullmatch(DIVERGED_MESSAGE[name], line["message"]), line["message"]
    assert f"{name}.py: {line['message']}" in proc.stderr
    assert_summary_matches(proc.stdout, line, tmp_path / "results.jsonl")


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
    proc, lines = run_script(name, *args, tmp_path=tmp_path, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = lines[0]
    assert_finite_results_line(line, name)
    returns = [score for _, score in curve_points(line, tmp_path)]
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
