"""The checks that both MLP PPO pairs share (tests/test_ppo.py: CartPole's discrete actions, and
tests/test_ppo_continuous_action.py: a Gaussian policy): each test file calls them with its pair and what is its own
(shapes, bad inputs, envs, learning bars), and asserts what only its pair has."""

import copy
import csv
import math
import re
from functools import partial
from pathlib import Path

import conftest
import pytest
import torch
import tyro
from conftest import (
    ROOT,
    args_from_flags,
    assert_finite_results_line,
    assert_main_exits_2_with_one_line,
    assert_summary_matches,
    curve_points,
    load_script,
    main_in_process,
    run_script,
)
from gpu_standin import CONTRACTS, host_reads, run_main
from reference import gae_reference, ppo_loss_reference, random_ppo_minibatch, random_rollout
from regression import PAIRS
from test_gpu_path import MAX_BYTES_IN, same_run

from leanrl import bookkeeping as bk


class Pair:
    """An eager script and its twin, and the spaces their Agent is built for (action_shape () for discrete actions)."""

    def __init__(self, eager_name, spaces, action_shape, lr):
        self.EAGER, self.TWIN = eager_name, f"{eager_name}_torchcompile"
        self.SCRIPTS = [self.EAGER, self.TWIN]
        self.eager, self.twin = load_script(self.EAGER), load_script(self.TWIN)
        self.MODULES = {self.EAGER: self.eager, self.TWIN: self.twin}
        self.spaces, self.action_shape, self.lr = spaces, action_shape, lr  # lr: the scripts' default
        self.obs_dim = spaces.single_observation_space.shape[0]
        self.REGRESSION = list(PAIRS[eager_name])  # tests/regression.py's tiny run of the pair


# both pairs' regression runs: 7 iterations of 64 env steps, each 2 epochs of 2 minibatches of 32
ITERATIONS, STEPS, UPDATES = 7, 64, 4  # iterations, env steps and minibatch updates per iteration


# ---------------------------------------------------------------- GAE


def gae_matches_float64_reference(module, shape, gamma, gae_lambda):
    T, B = shape
    rewards, values, dones, next_value, next_done = random_rollout(T, B, seed=T * 1000 + B, done_prob=0.3)
    # episode ends that the recursion reads: dones[1:] inside the rollout, next_done at its end
    assert dones[1:].sum() + next_done.sum() > 0
    got = module.gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda)
    want = gae_reference(rewards, values, dones, next_value, next_done, gamma, gae_lambda)
    assert got.shape == (T, B) and got.dtype == torch.float32
    # float32 against float64: over T=2048 the sums (about 1 / (1 - gamma * lambda) terms of size ~1) are
    # accumulated in a different order by the doubling scan, so allow 1e-4 absolute and relative
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def twin_gae_equals_eager_gae(pair, shape):
    inputs = random_rollout(*shape, seed=7 + shape[0])
    got = pair.twin.gae(*inputs, 0.99, 0.95)
    torch.testing.assert_close(got, pair.eager.gae(*inputs, 0.99, 0.95), rtol=1e-4, atol=1e-5)


def twin_gae_compiles_whole_once_to_the_same_values(twin, shape):
    """fullgraph=True: the doubling scan is one graph; a new rollout of the same shape runs it again, no recompile."""
    compiled = torch.compile(twin.gae, fullgraph=True)
    for iteration in range(2):
        inputs = random_rollout(*shape, seed=3 + iteration)
        with torch._dynamo.config.patch(error_on_recompile=iteration > 0):
            got = compiled(*inputs, 0.99, 0.95)
        torch.testing.assert_close(got, twin.gae(*inputs, 0.99, 0.95), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- PPO loss


def ppo_loss_matches_float64_reference(module, n, norm_adv, clip_vloss):
    newlogprob, oldlogprob, entropy, newvalue, oldvalue, advantages, returns = random_ppo_minibatch(n, seed=n)
    clip_coef, ent_coef, vf_coef = 0.2, 0.01, 0.5
    ratio = (newlogprob - oldlogprob).exp()
    assert 0 < ((ratio - 1).abs() > clip_coef).float().mean() < 1, "want clipped and unclipped ratios"
    assert 0 < ((newvalue - oldvalue).abs() > clip_coef).float().mean() < 1, "want clipped and unclipped values"
    loss, stats = module.ppo_loss(
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


def twin_ppo_loss_equals_eager_ppo_loss(pair):
    inputs = random_ppo_minibatch(64, seed=11)
    for norm_adv in (True, False):
        for clip_vloss in (True, False):
            got_loss, got = pair.twin.ppo_loss(*inputs, 0.2, 0.01, 0.5, norm_adv, clip_vloss)
            want_loss, want = pair.eager.ppo_loss(*inputs, 0.2, 0.01, 0.5, norm_adv, clip_vloss)
            torch.testing.assert_close(got_loss, want_loss)
            torch.testing.assert_close(got, want)


# ---------------------------------------------------------------- update


HYPER = dict(clip_coef=0.2, ent_coef=0.01, vf_coef=0.5, norm_adv=True, clip_vloss=True, max_grad_norm=0.5)
FIELDS = ("obs", "actions", "logprobs", "advantages", "returns", "values")  # the twin's update takes them in this order


def flat_batch(pair, n, seed):
    """A random flat batch of n samples: the tensors the twin's update is bound to, in FIELDS order."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(n, generator=g)
    obs = torch.randn(n, pair.obs_dim, generator=g)
    if pair.action_shape:  # Gaussian actions and their log-densities
        actions, logprobs = torch.randn(n, *pair.action_shape, generator=g), torch.randn(n, generator=g) - 2.0
    else:  # log-probabilities of two actions
        actions, logprobs = torch.randint(0, 2, (n,), generator=g), -torch.rand(n, generator=g) - 0.2
    return obs, actions, logprobs, torch.randn(n, generator=g), values + torch.randn(n, generator=g), values


def minibatches(n, size, seed):
    """The shuffled minibatch indices of one epoch, as the twin draws them: views of one permutation."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed)).split(size)


def twin_update_equals_eager_update(pair, max_grad_norm):
    """Same weights, same minibatches: the twin's update, which gathers its minibatch from the whole flat batch by
    index, takes its gradients with torch.autograd.grad, clips them with tensor ops and steps Adam as tensor ops
    (tensor lr, annealed in place), moves the weights as the eager one (backward(), clip_grad_norm_, torch.optim.Adam)
    does on the minibatch gathered for it. Run under the float64 fixture, as TD3's test: in float32 Adam's two orders
    of operations round apart on near-zero gradients."""
    eager, twin = pair.eager, pair.twin
    torch.manual_seed(0)
    agent_e = eager.Agent(pair.spaces)
    agent_t = twin.Agent(pair.spaces)
    agent_t.load_state_dict(agent_e.state_dict())
    opt_e = torch.optim.Adam(agent_e.parameters(), lr=pair.lr, eps=1e-5)
    opt_t = twin.make_adam(list(agent_t.parameters()), lr=torch.tensor(pair.lr), eps=1e-5)
    hyper = {**HYPER, "max_grad_norm": max_grad_norm}
    batch = [x.double() if x.is_floating_point() else x for x in flat_batch(pair, 256, 0)]
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


def compiled_update_equals_eager_update(pair, backend):
    """torch.compile(update) on CPU: same losses and the same new parameters as the eager update, step by step, also
    after the lr tensor is annealed in place (no recompile). Returns the updated agent."""
    twin = pair.twin
    torch.manual_seed(0)
    agent = twin.Agent(pair.spaces)
    agent_c = copy.deepcopy(agent)
    opt = twin.make_adam(list(agent.parameters()), lr=torch.tensor(pair.lr), eps=1e-5)
    opt_c = twin.make_adam(list(agent_c.parameters()), lr=torch.tensor(pair.lr), eps=1e-5)
    batch = flat_batch(pair, 256, 0)
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
    return agent


def twin_update_compiles_to_one_graph(pair):
    """With trace_autograd_ops (the twin's --compile), the update, its gradients, their clipping and Adam's step
    included, is one graph: no break (fullgraph=True would raise at one), no frame resumed in Python, and nothing
    recompiles over other minibatches (other indices, at other offsets) and an annealed lr (a tensor written in
    place). With backward() and torch.optim.Adam's step it was 4 graphs at 3 breaks."""
    twin = pair.twin
    torch.manual_seed(0)
    agent = twin.Agent(pair.spaces)
    optimizer = twin.make_adam(list(agent.parameters()), lr=torch.tensor(pair.lr), eps=1e-5)
    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    update = torch.compile(twin.update, backend=counting_backend, fullgraph=True)
    update = partial(update, agent, optimizer, *flat_batch(pair, 256, 0))
    with torch._dynamo.config.patch(trace_autograd_ops=True):
        update(minibatches(256, 64, 0)[0], **HYPER)
        assert len(graphs) == 1
        with torch._dynamo.config.patch(error_on_recompile=True):
            for i in range(1, 5):
                optimizer["lr"].fill_(pair.lr / (i + 1))
                update(minibatches(256, 64, i)[i % 4], **HYPER)
    assert len(graphs) == 1 and optimizer["step"] == 5


def rollout_storage(pair, T, B, seed):
    """The twin's rollout storage with random contents: env_out (T + 1, B, obs_dim + 2) holds rows of (obs, reward,
    done), with episode ends; returns env_out, its obs, rewards and dones views, and actions, logprobs, values."""
    g = torch.Generator().manual_seed(seed)
    n = pair.obs_dim
    env_out = torch.randn(T + 1, B, n + 2, generator=g)
    env_out[..., -1] = (torch.rand(T + 1, B, generator=g) < 0.3).float()
    obs, rewards, dones = env_out[..., :n], env_out[..., n], env_out[..., n + 1]
    actions = torch.zeros(T, B, *pair.action_shape, dtype=torch.float32 if pair.action_shape else torch.long)
    return env_out, obs, rewards, dones, actions, torch.zeros(T, B), torch.zeros(T, B)


def twin_policy_step_compiles_whole_once_and_samples_as_eager(pair, T, B):
    """The policy step as the twin compiles it on CPU (fullgraph=True here, aten's RNG): one graph for every step (the
    step is an index tensor), and with the same seed it writes into the storage the actions, log-probs and values the
    eager script's policy gives for obs[step]; what the env returned is left as it was. Returns the actions drawn."""
    torch.manual_seed(0)
    agent = pair.twin.Agent(pair.spaces)
    env_out, obs, _, _, actions, logprobs, values = rollout_storage(pair, T, B, seed=1)
    before = env_out.clone()
    compiled = torch.compile(pair.twin.policy_step, fullgraph=True, options={"fallback_random": True})
    steps = torch.arange(T)
    for step in range(T):
        torch.manual_seed(step)
        with torch.no_grad():
            want = pair.eager.Agent.get_action_and_value(agent, obs[step])
        torch.manual_seed(step)
        with torch._dynamo.config.patch(error_on_recompile=step > 0):
            action = compiled(agent, obs, actions, logprobs, values, steps[step : step + 1])
        torch.testing.assert_close(action, want[0])
        torch.testing.assert_close(actions[step], want[0])
        torch.testing.assert_close(logprobs[step], want[1])
        torch.testing.assert_close(values[step], want[3].flatten())
    assert torch.equal(env_out, before)
    assert (logprobs != 0).all() and (values != 0).all(), "a step was not written"
    return actions


def twin_bootstrap_and_gae_compile_whole_to_the_float64_reference(pair, B):
    """The bootstrap value of obs[T] and GAE, one function of the storage compiled with fullgraph=True: the advantages
    and returns it writes equal the float64 reference with next_value = V(obs[T]), and the next rollout (new numbers,
    same storage) runs the same graph."""
    torch.manual_seed(0)
    agent = pair.twin.Agent(pair.spaces)
    T = 16
    env_out, obs, rewards, dones, _, _, values = rollout_storage(pair, T, B, seed=2)
    values.copy_(torch.randn(T, B, generator=torch.Generator().manual_seed(3)))
    advantages, returns = torch.zeros(T, B), torch.zeros(T, B)
    compiled = torch.compile(pair.twin.advantages_and_returns, fullgraph=True)
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
        env_out[..., : pair.obs_dim + 1] += 0.5  # the next rollout's observations and rewards: same graph, new numbers


# ---------------------------------------------------------------- the GPU path, on the CPU (tests/gpu_standin.py)


def pinned_host_reads(twin_name, vector_steps):
    """The host reads of a twin run at the regression flags, by "method at file: line"; the same with and without
    --compile --cudagraphs (tests/test_gpu_path.py counts those runs). vector_steps: vector-env steps in the run."""
    step = "next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())"
    return {
        # the env steps on the host: the action is read once per vector-env step (.cpu() is the sync; .numpy() of its
        # result, already on the host, is counted too)
        f"cpu at {twin_name}.py: {step}": vector_steps,
        f"numpy at {twin_name}.py: {step}": vector_steps,
        # the log point, once per iteration: the losses, clipfrac, explained variance and lr in one stacked read
        # (--target-kl, off by default, adds CleanRL's early-stop test of approx_kl: one read per epoch)
        "tolist at bookkeeping.py: values = torch.stack([v.detach().float() for v in values]).tolist()": ITERATIONS,
        # setup, once: the numpy view of the storage's host copy
        f"numpy at {twin_name}.py: host_np = host.numpy()": 1,
    }


def host_reads_of_the_twin_are_the_pinned_ones(pair, pinned, tmp_path):
    """Every read of a tensor to the host in a twin run, counted by line: a new one fails here, naming its line. The
    runs with --cudagraphs and --compile --cudagraphs are counted in tests/test_gpu_path.py."""
    with host_reads() as reads:
        line, _ = run_main(pair.twin, pair.REGRESSION, tmp_path)
    assert line["status"] == "ok" and line["steps"] == ITERATIONS * STEPS and line["episodes"] > 0
    assert dict(reads) == pinned


def the_twins_own_optimizer_is_captured(pair, flags, tmp_path):
    """Issue 16 item 8: the Adam the twin makes (not one the stand-in forces capturable) is capturable under
    --cudagraphs, with or without --compile: the update is captured, and the run gives the numbers of the run without
    CUDA graphs. A non-capturable Adam reads its step count to the host in step(), which a capture refuses."""
    want = run_main(pair.twin, pair.REGRESSION + flags, tmp_path / "plain")
    got = run_main(pair.twin, pair.REGRESSION + flags, tmp_path / "graphs", cudagraphs=True, force_capturable=False)
    same_run(got, want)
    assert {contract.name for contract in CONTRACTS} == {"policy_step", "advantages_and_returns", "update"}
    for contract in CONTRACTS:
        assert contract.captured_at is not None and contract.violations(MAX_BYTES_IN[pair.TWIN]) == []


def twin_steps_run_on_the_meta_device(pair, B):
    """The policy step, GAE with its bootstrap value, the loss and the update (Adam as tensor ops) on the meta
    device, which has no data: a host read (.item(), a data-dependent branch) raises there, and so does a tensor made
    on the CPU (without device=) meeting the storage. Not here: the explained variance and the clipfrac mean of the log
    point (a few ops inline in main)."""
    twin, meta = pair.twin, torch.device("meta")
    agent = twin.Agent(pair.spaces).to(meta)
    T = 8
    env_out, obs, rewards, dones, actions, logprobs, values = (x.to(meta) for x in rollout_storage(pair, T, B, seed=0))
    advantages, returns = torch.zeros(T, B, device=meta), torch.zeros(T, B, device=meta)
    action = twin.policy_step(agent, obs, actions, logprobs, values, torch.arange(T, device=meta)[2:3])
    assert action.device == meta and action.shape == (B, *pair.action_shape)
    twin.advantages_and_returns(agent, obs, rewards, dones, values, advantages, returns, 0.99, 0.95)
    gae = twin.gae(rewards[1:], values, dones[:-1], values[0], dones[-1], 0.99, 0.95)
    assert gae.device == meta and gae.shape == (T, B)
    loss, stats = twin.ppo_loss(*(x.to(meta) for x in random_ppo_minibatch(16, seed=0)), 0.2, 0.01, 0.5, True, True)
    assert loss.device == meta and all(v.device == meta for v in stats.values())
    optimizer = twin.make_adam(list(agent.parameters()), lr=torch.tensor(pair.lr, device=meta), eps=1e-5)
    flat = (obs[:-1].flatten(0, 1), actions.flatten(0, 1), logprobs.view(-1), advantages.view(-1), returns.view(-1))
    for mb_inds in torch.randperm(T * B, device=meta).split(T * B // 2):
        got = twin.update(agent, optimizer, *flat, values.view(-1), mb_inds, **HYPER)
        assert got.device == meta and got.shape == (len(twin.LOGGED),)
    assert all(t.device == meta for key in ("exp_avg", "exp_avg_sq") for t in optimizer[key])
    assert optimizer["step"].device == meta


def default_measure_burnin_leaves_compilation_and_capture_out(pair, calls_per_iteration, tmp_path):
    """--measure-burnin's default covers every warm-up and capture of the twin at the default flags, with a margin
    (calls_per_iteration: each CUDA graph's calls in an iteration at those flags; GAE, called once an iteration, is
    captured at its warmup-th call); and the flag means one thing in every script, in its docstring."""
    twin = pair.twin
    run_main(twin, pair.REGRESSION, tmp_path, cudagraphs=True)
    captured_in = {c.name: math.ceil(c.captured_at / calls_per_iteration[c.name]) for c in CONTRACTS}
    assert set(captured_in) == set(calls_per_iteration)
    assert max(captured_in.values()) + 2 <= twin.Args.measure_burnin == pair.eager.Args.measure_burnin, captured_in
    # one meaning in every script (issue 16 item 6), in its flag's docstring
    meaning = "iterations after learning starts left out of steps/s (compilation and CUDA-graph capture happen in them)"
    for name in pair.SCRIPTS:
        source = (ROOT / "leanrl" / f"{name}.py").read_text()
        assert f'measure_burnin: int = {twin.Args.measure_burnin}\n    """{meaning}"""' in source, name


def track_logs_cleanrl_keys_with_cleanrl_meanings(pair, module, tmp_path, monkeypatch, fake_wandb):
    """With --track, each iteration logs CleanRL's keys: the last minibatch's losses, the mean clipfrac of all the
    iteration's minibatches, the explained variance of the values against the returns and the annealed lr; the last
    log point's values are the ones in the results line. Checked against the updates and GAE calls of the run."""
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
    line, _ = main_in_process(module, pair.REGRESSION + ["--track"], tmp_path)
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
        minibatches_i, (values, returns) = updates[UPDATES * i : UPDATES * (i + 1)], rollouts[i]
        for key in ("value_loss", "policy_loss", "entropy", "old_approx_kl", "approx_kl"):
            assert data[f"losses/{key}"] == pytest.approx(minibatches_i[-1][short.get(key, key)].item(), rel=1e-6), key
        clipfracs = [stats["clipfrac"].item() for stats in minibatches_i]
        assert data["losses/clipfrac"] == pytest.approx(sum(clipfracs) / UPDATES, rel=1e-6, abs=1e-9)
        explained = 1 - (returns - values).var(correction=0) / returns.var(correction=0)
        assert data["losses/explained_variance"] == pytest.approx(explained.item(), rel=1e-4, abs=1e-5)
        assert data["charts/learning_rate"] == pytest.approx(pair.lr * (1 - i / ITERATIONS), rel=1e-6)
    # the results line reports the last log point, under its short names
    last = logs[-1][1]
    losses = {**line["losses"], "value_loss": line["losses"]["value"], "policy_loss": line["losses"]["policy"]}
    for key, value in last.items():
        if key.startswith("losses/"):
            assert losses[key.removeprefix("losses/")] == value, key
    assert line["losses"]["learning_rate"] == last["charts/learning_rate"]


# ---------------------------------------------------------------- scripts as subprocesses


def check_returns_csv(line, folder, name="returns.csv"):
    rows = list(csv.reader((Path(folder) / line["run_name"] / name).open()))
    assert rows[0] == ["step", "wall_s", "return"] and len(rows) - 1 == line["episodes"]


def runs_twice_the_same(name, args, env_id, tmp_path):
    """Smoke and determinism: a tiny run (args: its flags, 192 steps) on the default env writes a strict-JSON results
    line with finite numbers and its return curve and prints its summary; the same seed on CPU gives the same losses
    and episodes twice. Returns [(process, results line, its folder)] of the two runs."""
    runs = []
    for d in "ab":
        (tmp_path / d).mkdir()
        proc, lines = run_script(name, *args, tmp_path=tmp_path / d)
        assert proc.returncode == 0, proc.stderr[-3000:]
        [line] = lines
        assert_finite_results_line(line, name)
        assert line["env_id"] == env_id and line["mode"] == "train"
        assert line["steps"] == 192 and line["compile"] == ("--compile" in args) and line["cudagraphs"] is False
        check_returns_csv(line, tmp_path / d)
        assert_summary_matches(proc.stdout, line, tmp_path / d / "results.jsonl")
        runs.append((proc, line, tmp_path / d))
    (_, first, _), (_, second, _) = runs
    for key in ("losses", "mean_return", "episodes", "steps"):
        assert first[key] == second[key], key
    return runs


def saved_then_evaluated(name, args, tmp_path):
    """--save-model writes the weights (args: a tiny training run's flags); --eval-checkpoint plays 3 episodes with
    seed 5 and reports them in its results line, its summary and eval_returns.csv in the checkpoint's run folder.
    Returns (checkpoint path, the checkpoint, the evaluation's results line)."""
    proc, lines = run_script(name, *args, "--save-model", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    checkpoint_path = tmp_path / lines[0]["run_name"] / f"{name}.pt"
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    eval_args = ["--eval-checkpoint", str(checkpoint_path), "--eval-episodes", "3", "--seed", "5"]
    proc, lines = run_script(name, *eval_args, tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = lines[-1]
    assert line["mode"] == "eval" and line["status"] == "ok" and line["episodes"] == 3
    summary = assert_summary_matches(proc.stdout, line, tmp_path / "results.jsonl")
    assert Path(summary["run_dir"]) == checkpoint_path.parent.resolve()
    # the evaluation's return curve is in the checkpoint's folder, next to the training's
    assert line["run_name"] == checkpoint_path.parent.name
    check_returns_csv(line, tmp_path, "eval_returns.csv")
    return checkpoint_path, checkpoint, line


def play(envs, policy, episodes, seed):
    """(returns, steps) of `episodes` episodes of envs played by policy (observations -> actions, no gradients)."""
    obs, _ = envs.reset(seed=seed)
    returns, steps = [], 0
    while len(returns) < episodes:
        with torch.no_grad():
            action = policy(torch.as_tensor(obs, dtype=torch.float32))
        obs, _, _, _, infos = envs.step(action.numpy())
        steps += 1
        returns += [r for r, _ in bk.gym_episodes(infos)]
    return returns, steps


def not_a_checkpoint_exits_2(pair, content, capsys, tmp_path):
    """--eval-checkpoint of a file that is not the script's checkpoint (content: what it holds instead): one line
    naming the flag, exit 2."""
    path = tmp_path / "other.pt"
    torch.save(content, path)
    for name in pair.SCRIPTS:
        args = args_from_flags(pair.MODULES[name], ["--eval-checkpoint", str(path)])
        assert_main_exits_2_with_one_line(pair.MODULES[name], name, args, "--eval-checkpoint", capsys, tmp_path)


def check_bad_input(name, args, flag, tmp_path):
    """conftest's check, with a file in tmp_path first: the folder that --results-file a_file/... cannot be."""
    (tmp_path / "a_file").write_text("")
    conftest.check_bad_input(name, args, flag, tmp_path)


def twin_check_args_rejects_bad_input(pair, args, flag, capsys, tmp_path, monkeypatch):
    """The twin's checks in-process (a subprocess each would only repeat the eager script's runs)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("")
    cli = tyro.cli(pair.twin.Args, args=args)
    with pytest.raises(SystemExit) as exit_info:
        pair.twin.check_args(cli)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"{pair.TWIN}.py: error: ") and flag in err, err


def non_finite_loss_stops_the_run_as_diverged(name, args, tmp_path):
    """A NaN value coefficient (in args), the most direct way to make the loss non-finite: the run stops at its first
    loss, exit 1, status diverged, the message naming the step and the loss, non-finite values written as null."""
    proc, lines = run_script(name, *args, "--vf-coef", "nan", tmp_path=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert f"{name}.py: loss diverged at step 64: loss=nan" in proc.stderr
    assert "Traceback" not in proc.stderr
    [line] = lines  # run_script parsed it as strict JSON
    assert line["status"] == "diverged" and line["message"] == "loss diverged at step 64: loss=nan"
    assert line["steps"] == 64 and line["losses"]["loss"] is None
    assert_summary_matches(proc.stdout, line, tmp_path / "results.jsonl")


def a_real_divergence_is_reported_in_strict_json(name, args, message, tmp_path):
    """A learning rate that really diverges (in args): the run stops in its first iteration, exit 1, status diverged,
    a message (matching the pattern `message`) naming the step and the loss, and a results line that a strict JSON
    parser reads."""
    proc, lines = run_script(name, *args, tmp_path=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    [line] = lines  # run_script parsed it as strict JSON
    assert line["status"] == "diverged" and line["steps"] == 64
    assert re.fullmatch(message, line["message"]), line["message"]
    assert f"{name}.py: {line['message']}" in proc.stderr
    assert_summary_matches(proc.stdout, line, tmp_path / "results.jsonl")


def learn(name, args, tmp_path):
    """A training run with args; returns (results line, its episodic returns)."""
    proc, lines = run_script(name, *args, tmp_path=tmp_path, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = lines[0]
    assert_finite_results_line(line, name)
    return line, [score for _, score in curve_points(line, tmp_path)]
