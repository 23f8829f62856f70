"""TD3 continuous-action pair: the math against float64 references, the replay buffer (wrap-around, filled rows only,
true final observations with several envs), the twin against the eager script (vmap over stacked Q-parameters, fused
target update, compiled update, graph breaks, no recompile), uniform replay sampling at 1M rows, the GPU path on the CPU
(meta-device step functions, pinned host reads, CUDA-graph outputs, the steps/s window, CleanRL's wandb keys), the
scripts as subprocesses on CPU (smoke, save and evaluate, determinism, divergence, bad input) and learning on
InvertedPendulum-v4. The checks it shares with tests/test_sac_continuous_action.py are in tests/off_policy_checks.py."""

import copy
from functools import partial

import numpy as np
import off_policy_checks as checks
import pytest
import torch
import torch.utils._python_dispatch
import torch.utils._pytree
from conftest import (
    load_script,
    main_in_process,
)
from gpu_standin import run_main
from off_policy_checks import QUICK, random_batch
from tensordict import TensorDict

EAGER, TWIN = "td3_continuous_action", "td3_continuous_action_torchcompile"
SCRIPTS = (EAGER, TWIN)
eager, twin = load_script(EAGER), load_script(TWIN)
MODULES = {EAGER: eager, TWIN: twin}

# ---------------------------------------------------------------- math


def clipped_double_q_reference(rewards, terminated, next_q1, next_q2, gamma):
    out = []
    columns = (x.double().tolist() for x in (rewards, terminated, next_q1, next_q2))
    for r, term, q1, q2 in zip(*columns):
        out.append(r if term else r + gamma * min(q1, q2))  # a truncated transition still bootstraps
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("batch", [1, 9, 256])
@pytest.mark.parametrize("gamma", [0.99, 0.9])
def test_clipped_double_q_target_matches_float64_reference(name, batch, gamma):
    g = torch.Generator().manual_seed(batch)
    b = random_batch(batch, batch)
    next_q1, next_q2 = torch.randn(batch, generator=g) * 5, torch.randn(batch, generator=g) * 5
    got = MODULES[name].clipped_double_q_target(b["rewards"], b["terminations"], next_q1, next_q2, gamma)
    want = clipped_double_q_reference(b["rewards"], b["terminations"], next_q1, next_q2, gamma)
    assert got.shape == (batch,) and got.dtype == torch.float32
    torch.testing.assert_close(got, want.float())


def box(act_dim, seed):
    g = torch.Generator().manual_seed(seed)
    low = -torch.rand(act_dim, generator=g) * 3 - 0.5
    high = torch.rand(act_dim, generator=g) * 2 + 0.5  # asymmetric boxes: scale and bias both matter
    return low, high, (high - low) / 2


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("batch,act_dim", [(1, 1), (64, 6)])
@pytest.mark.parametrize("policy_noise,noise_clip", [(0.2, 0.5), (1.0, 0.3)])
def test_target_policy_smoothing_matches_float64_reference(name, batch, act_dim, policy_noise, noise_clip):
    low, high, scale = box(act_dim, batch)
    g = torch.Generator().manual_seed(act_dim)
    next_actions = low + (high - low) * torch.rand(batch, act_dim, generator=g)
    noise = torch.randn(batch, act_dim, generator=g) * 2  # some beyond the clip
    got = MODULES[name].target_policy_smoothing(next_actions, noise, policy_noise, noise_clip, scale, low, high)
    want = []
    for a_row, n_row in zip(next_actions.double().tolist(), noise.double().tolist()):
        row = []
        for j, (a, n) in enumerate(zip(a_row, n_row)):
            eps = min(max(n * policy_noise, -noise_clip), noise_clip) * float(scale[j])
            row.append(min(max(a + eps, float(low[j])), float(high[j])))
        want.append(row)
    torch.testing.assert_close(got, torch.tensor(want).float())
    if batch > 1:
        assert (got == high).any() or (got == low).any(), "want actions clipped at the box"


@pytest.mark.parametrize("name", SCRIPTS)
def test_exploration_action_and_actor_loss_match_float64_reference(name):
    low, high, scale = box(3, 5)
    g = torch.Generator().manual_seed(0)
    actions = low + (high - low) * torch.rand(128, 3, generator=g)
    noise = torch.randn(128, 3, generator=g) * 3
    got = MODULES[name].exploration_action(actions, noise, 0.1, scale, low, high)
    want = [
        [min(max(a + n * float(scale[j]) * 0.1, float(low[j])), float(high[j])) for j, (a, n) in enumerate(zip(ar, nr))]
        for ar, nr in zip(actions.double().tolist(), noise.double().tolist())
    ]
    torch.testing.assert_close(got, torch.tensor(want).float())
    q1 = torch.randn(128, 1, generator=g)
    torch.testing.assert_close(MODULES[name].actor_loss_fn(q1), torch.tensor(-sum(q1.view(-1).tolist()) / 128))


@pytest.mark.parametrize("name", SCRIPTS)
def test_actor_acts_inside_the_box(name):
    torch.manual_seed(0)
    actor = MODULES[name].Actor(5, np.array([-2.0, 0.0]), np.array([2.0, 1.0]))
    assert actor.action_scale.tolist() == [2.0, 0.5] and actor.action_bias.tolist() == [0.0, 0.5]
    actions = actor(torch.randn(512, 5) * 100)  # extreme inputs drive the tanh to its ends
    assert (actions[:, 0].abs() <= 2).all() and ((actions[:, 1] >= 0) & (actions[:, 1] <= 1)).all()
    assert actions[:, 0].max() > 1.9 and actions[:, 0].min() < -1.9


# ---------------------------------------------------------------- twin against eager


networks = partial(checks.networks, eager.Actor, eager.QNetwork)
stacked = partial(checks.stacked, twin.QNetwork)


def params_of(*modules):
    return [p for module in modules for p in module.parameters()]


def test_vmap_over_stacked_q_params_equals_the_two_networks():
    checks.vmap_over_stacked_q_params_equals_the_two_networks(twin, networks, stacked)


def test_fused_target_update_equals_the_per_parameter_one():
    actor, qf1, qf2 = networks()
    actor_target, t1, t2 = networks(seed=1)
    t_actor_target = copy.deepcopy(actor_target)
    params, _ = stacked(qf1, qf2)
    target = TensorDict.from_modules(t1, t2).data.clone()
    update = torch.compile(twin.update_targets, fullgraph=True)
    for _ in range(3):
        eager.update_targets(params_of(actor_target, t1, t2), params_of(actor, qf1, qf2), 0.005)
        update(
            params_of(t_actor_target) + list(target.values(True, True)),
            params_of(actor) + list(params.data.values(True, True)),
            0.005,
        )
    torch.testing.assert_close(target["fc2", "weight"][0], t1.fc2.weight, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(target["fc3", "bias"][1], t2.fc3.bias, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(t_actor_target.state_dict(), actor_target.state_dict(), rtol=1e-6, atol=1e-7)
    assert not torch.allclose(t1.fc2.weight, networks(seed=1)[1].fc2.weight), "the targets moved"


def test_twin_updates_equal_eager_updates(float64):
    """Same weights, same batch, same noise: the twin's critic and actor steps (vmapped Q, Q1 sliced from the stack
    and detached in the actor loss, torch.autograd.grad and Adam as tensor ops, fused target lerp) move every
    parameter as the eager ones (backward() and torch.optim.Adam) do. In float64: in float32, Adam's step on a
    near-zero gradient (m / (sqrt(v) + eps), both tiny) differs by a rounding between the two orders of operations,
    and which element that hits depends on the CPU's vector width."""
    actor, qf1, qf2 = networks()
    actor_target, t_actor = copy.deepcopy(actor), copy.deepcopy(actor)
    t_actor_target = copy.deepcopy(actor)
    qf1_target, qf2_target = copy.deepcopy(qf1), copy.deepcopy(qf2)
    params, qnet = stacked(qf1, qf2)
    target = params.data.clone()
    q_opt = torch.optim.Adam(params_of(qf1, qf2), lr=3e-4)
    t_q_opt = twin.make_adam(list(params.parameters()), lr=3e-4)
    a_opt, t_a_opt = torch.optim.Adam(actor.parameters(), lr=3e-4), twin.make_adam(list(t_actor.parameters()), lr=3e-4)
    for step in range(3):
        b = random_batch(32, step)
        torch.manual_seed(step)
        want = eager.critic_update(actor_target, qf1, qf2, qf1_target, qf2_target, q_opt, b, 0.99, 0.2, 0.5)
        want["actor_loss"] = eager.actor_update(actor, qf1, a_opt, b["obs"])
        torch.manual_seed(step)
        got = twin.critic_update(t_actor_target, qnet, params, target, t_q_opt, b, 0.99, 0.2, 0.5)
        got["actor_loss"] = twin.actor_update(t_actor, qnet, params, t_a_opt, b["obs"])
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        assert list(got) == list(want) == list(twin.STATS), "the twin's train_step stacks them in STATS order"
        eager.update_targets(params_of(actor_target, qf1_target, qf2_target), params_of(actor, qf1, qf2), 0.005)
        twin.update_targets(
            params_of(t_actor_target) + list(target.values(True, True)),
            params_of(t_actor) + list(params.data.values(True, True)),
            0.005,
        )
    torch.testing.assert_close(t_actor.state_dict(), actor.state_dict(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(t_actor_target.state_dict(), actor_target.state_dict(), rtol=1e-5, atol=1e-6)
    for i, (qf, qf_target) in enumerate(((qf1, qf1_target), (qf2, qf2_target))):
        for key in ("fc1", "fc2", "fc3"):
            torch.testing.assert_close(params[key, "weight"][i], getattr(qf, key).weight, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(target[key, "bias"][i], getattr(qf_target, key).bias, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(qf1.fc1.weight, networks()[1].fc1.weight)


def twin_learner(seed=0):
    actor, qf1, qf2 = networks(obs_dim=4, act_dim=1, seed=seed)
    params, qnet = stacked(qf1, qf2, 4, 1)
    return dict(
        actor=actor,
        actor_target=copy.deepcopy(actor),
        qnet=qnet,
        params=params,
        target=params.data.clone(),
        q_opt=twin.make_adam(list(params.parameters()), lr=3e-4),
        a_opt=twin.make_adam(list(actor.parameters()), lr=3e-4),
        buffer=twin.make_buffer(1000, 4, 1, "cpu"),
    )


def call_train_step(fn, learner, count, transition, policy_update, call=None):
    """train_step on the learner (call: the step's number in the compiled check, where SAC's tau depends on it; TD3's
    is fixed)."""
    L = learner
    return fn(
        L["actor"], L["actor_target"], L["qnet"], L["params"], L["target"], L["q_opt"], L["a_opt"],
        L["buffer"], count, transition, policy_update=policy_update,
        batch_size=32, gamma=0.99, tau=0.005, policy_noise=0.2, noise_clip=0.5,
    )  # fmt: skip


# aot_eager: Dynamo's graphs and AOTAutograd's functionalized in-place writes, run with eager's kernels; inductor's
# own kernels for the update are built and run by the twin's --compile learning run, and compared here with -m slow
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_train_step_equals_the_uncompiled_one_without_recompiles(backend):
    """TD3's update: critic and actor steps (6 statistics with the actor, 5 without), the actor's target compared too.
    With inductor (-m slow) it took 64 s in a cold run on a 2-core EPYC, with aot_eager 10 s or less."""
    compared = ("actor", "actor_target", "params"), ("target",)
    checks.compiled_train_step_equals_the_uncompiled_one(
        twin, twin_learner, call_train_step, backend, {False: 5, True: 6}, compared
    )


def test_policy_step_compiles_whole():
    torch.manual_seed(0)
    actor = twin.Actor(4, np.array([-3.0]), np.array([3.0]))
    policy = torch.compile(twin.act, fullgraph=True)
    obs = torch.randn(8, 4)
    with torch._dynamo.config.patch(error_on_recompile=False):
        first = policy(actor, obs, 0.1)
    with torch._dynamo.config.patch(error_on_recompile=True):
        draws = torch.stack([policy(actor, obs, 0.1) for _ in range(400)])
    assert first.shape == (8, 1) and draws.abs().max() <= 3
    # the actor's action plus N(0, (3 * 0.1)^2) noise
    torch.testing.assert_close(draws.mean(0), actor(obs).detach(), atol=0.06, rtol=0)
    assert ((draws.std(0) - 0.3).abs() < 0.05).all(), draws.std(0)


# ---------------------------------------------------------------- replay sampling


@pytest.mark.parametrize("name", SCRIPTS)
def test_replay_sampling_is_uniform_over_a_million_rows(name):
    """Issue 16 item 7: a chi-square test of 32M draws from a full 1M-row buffer. The twin's old sampler scaled
    float32 uniforms by the size: a float32 in [0, 1) has 2**24 values, so 16 of them fall on some rows and 17 on
    others (6% more draws): at 32 draws a row, its statistic came out 13-15 standard deviations above its degrees of
    freedom. Exact integers give one within a few standard deviations."""
    size, draws, calls = 10**6, 4 * 10**6, 8
    # only the row numbers are stored: the sampler indexes every field, and a (size, 0) obs costs nothing
    buffer = dict(obs=torch.empty(size, 0), rewards=torch.arange(size, dtype=torch.int32))
    count = size if name == EAGER else torch.tensor(size)
    torch.manual_seed(0)
    counts = torch.zeros(size, dtype=torch.long)
    for _ in range(calls):
        counts += torch.bincount(MODULES[name].buffer_sample(buffer, count, draws)["rewards"].long(), minlength=size)
    expected = draws * calls / size
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    # Poisson counts: each term has mean 1 and variance 2 + 1 / expected
    z = (chi2 - size) / (size * (2 + 1 / expected)) ** 0.5
    assert abs(z) < 5, z


# ---------------------------------------------------------------- the GPU path on the CPU (tests/gpu_standin.py)


class OffMeta(torch.utils._python_dispatch.TorchDispatchMode):
    """Records every op whose output is not on the meta device (a tensor made without device= lands on the CPU)."""

    def __init__(self):
        super().__init__()
        self.found = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        leaves = torch.utils._pytree.tree_flatten(out)[0]
        self.found += [str(func) for t in leaves if isinstance(t, torch.Tensor) and t.device.type != "meta"]
        return out


def test_twin_step_functions_run_on_the_meta_device():
    """Issue 16 item 4: the twin's pure step functions (policy step, buffer write, sampler, target smoothing and
    target, the critic and actor updates with Adam as tensor ops, the fused target update, and train_step, both
    variants) run on the `meta` device: a meta tensor has no data, so a host read raises; a tensor made without
    device= lands on the CPU, which OffMeta records. Every function runs: each op has a meta kernel."""
    meta = torch.device("meta")
    actor, qf1, qf2 = (module.to(meta) for module in networks(4, 1))
    actor_target = copy.deepcopy(actor)
    params, qnet = stacked(qf1, qf2, 4, 1)
    target = params.data.clone()
    transition = {key: value.to(meta) for key, value in random_batch(3, 0, 4, 1).items()}
    with OffMeta() as off_meta:
        torch.zeros(1)
        assert off_meta.found == ["aten.zeros.default"], "the check sees a tensor made on the CPU"
        off_meta.found.clear()
        q_opt, a_opt = twin.make_adam(list(params.parameters()), 3e-4), twin.make_adam(list(actor.parameters()), 3e-4)
        buffer, count = twin.make_buffer(100, 4, 1, meta), torch.zeros((), dtype=torch.long, device=meta)
        with torch.no_grad():
            actions = twin.act(actor, transition["obs"], 0.1)
        count = twin.buffer_add(buffer, count, dict(transition, actions=actions))
        batch = twin.buffer_sample(buffer, count, 32)
        next_actions = twin.target_policy_smoothing(
            actor_target(batch["next_obs"]), torch.randn_like(batch["actions"]), 0.2, 0.5, actor.action_scale,
            actor.action_low, actor.action_high,
        )  # fmt: skip
        next_q1, next_q2 = twin.q_values(qnet, target, batch["next_obs"], next_actions)
        y = twin.clipped_double_q_target(batch["rewards"], batch["terminations"], next_q1, next_q2, 0.99)
        stats = twin.critic_update(actor_target, qnet, params, target, q_opt, batch, 0.99, 0.2, 0.5)
        stats["actor_loss"] = twin.actor_update(actor, qnet, params, a_opt, batch["obs"])
        twin.update_targets(list(target.values(True, True)), list(params.data.values(True, True)), 0.005)
        learner = dict(actor=actor, actor_target=actor_target, qnet=qnet, params=params, target=target)
        learner.update(q_opt=q_opt, a_opt=a_opt, buffer=buffer)
        steps = [call_train_step(twin.train_step, learner, count, transition, update) for update in (False, True)]
    assert off_meta.found == []
    outputs = [actions, count, *batch.values(), y, *stats.values(), *q_opt["exp_avg"], a_opt["step"]]
    assert all(t.device == meta for t in outputs + [t for step in steps for t in step])
    assert [tuple(step_stats.shape) for _, step_stats in steps] == [(5,), (6,)] and batch["obs"].shape == (32, 4)


# what the twin reads to the host over the tiny regression run (500 steps, the first 100 with random actions, a
# log point every 100 iterations), line by line: a new read fails here, naming its line
ENV_ACTIONS = "env_actions = actions.cpu().numpy()"
HOST_READS = {
    # the actions of each of the 400 policy steps, to step the env (.numpy() of the host copy is counted too; it
    # reads no GPU). The 100 random steps read nothing: the env takes their numpy actions as they are
    f"cpu at td3_continuous_action_torchcompile.py: {ENV_ACTIONS}": 400,
    f"numpy at td3_continuous_action_torchcompile.py: {ENV_ACTIONS}": 400,
    # the logged statistics, in one read per log point with an update behind it: iterations 200, 300, 400 and the last
    "tolist at bookkeeping.py: values = torch.stack([v.detach().float() for v in values]).tolist()": 4,
}
# with --compile the compiler reads the 0-d int64 count while it traces the update's two variants: it reads 0-d CPU
# tensors only (it specializes on their value), never a GPU's
COMPILE_READS = {
    "item at td3_continuous_action_torchcompile.py: count, stats = train_fns[iteration % args.policy_frequency == 0]"
    "(count, transition)": 4
}


def pinned_host_reads(flags):
    """The host reads of a twin run at the tiny regression flags and these flags (tests/test_gpu_path.py counts its
    --cudagraphs and --compile --cudagraphs runs)."""
    return {**HOST_READS, **(COMPILE_READS if "--compile" in flags else {})}


def test_twin_host_reads_are_the_pinned_ones(tmp_path):
    """Issue 16 item 3: the twin's main() at the tiny regression flags, in this process (tests/gpu_standin.py: Adam
    capturable as on CUDA); the runs with --cudagraphs (on the CPU stand-in) and --compile --cudagraphs (the aot_eager
    backend) are counted in tests/test_gpu_path.py."""
    from gpu_standin import host_reads
    from regression import OFF_POLICY

    with host_reads() as reads:
        line, _ = run_main(twin, list(OFF_POLICY), tmp_path)
    assert line["status"] == "ok" and line["steps"] == 500
    assert dict(reads) == pinned_host_reads([])


def test_cuda_graph_replays_return_two_tensors(tmp_path, monkeypatch):
    """Issue 16 item 10: a CudaGraphModule replay clones every tensor it returns. The update returns the new count
    and its statistics stacked in one tensor (it returned one tensor per statistic), the buffer write the count, the
    policy step the actions."""
    from gpu_standin import run_main
    from regression import OFF_POLICY
    from tensordict.nn import CudaGraphModule

    returned, call = {}, CudaGraphModule.__call__

    def counting(self, *args, **kwargs):
        out = call(self, *args, **kwargs)
        name = self.module.func.__name__  # every graph of the twin wraps a functools.partial
        returned.setdefault(name, set()).add(
            sum(isinstance(t, torch.Tensor) for t in torch.utils._pytree.tree_flatten(out)[0])
        )
        return out

    monkeypatch.setattr(CudaGraphModule, "__call__", counting)
    line, _ = run_main(twin, OFF_POLICY, tmp_path, cudagraphs=True)
    assert line["status"] == "ok"
    assert returned == {"act": {1}, "buffer_add": {1}, "train_step": {2}}


@pytest.mark.parametrize("name,flags", [(EAGER, []), (TWIN, ["--cudagraphs"])], ids=["eager", "twin-cudagraphs"])
def test_steps_per_second_leave_out_learning_start_and_the_burnin(name, flags, tmp_path, monkeypatch):
    """--measure-burnin N: "iterations after learning starts left out of steps/s". A fake clock: every iteration
    takes 1 s, and each update that runs Python takes 1000 s more: in the eager script the first two (the first calls
    of an update, where a twin compiles), in the twin with CUDA graphs every call before the replays (warm-up and
    capture; a replay runs no Python). The tiny regression run learns from iteration 101 on and takes N = 10: both
    update variants are captured at their 5th call, by iteration 110, so steps/s is exactly 1 per second. With the
    window opened at learning start, or at N = 0, the slow calls are in it."""
    from types import SimpleNamespace

    from regression import OFF_POLICY

    from leanrl import bookkeeping as bk

    module, clock, slow = MODULES[name], SimpleNamespace(now=0.0, calls=0), []
    monkeypatch.setattr(bk, "time", SimpleNamespace(time=lambda: clock.now))
    tick, train_step = bk.Run.tick, module.train_step

    def timed_tick(run, step):
        clock.now += 1.0
        tick(run, step)

    def timed_train_step(*args, **kwargs):
        clock.calls += 1
        if name == TWIN or clock.calls <= 2:
            clock.now += 1000.0
            slow.append(clock.calls)
        return train_step(*args, **kwargs)

    monkeypatch.setattr(bk.Run, "tick", timed_tick)
    monkeypatch.setattr(module, "train_step", timed_train_step)
    # the twin through the GPU stand-in: Adam capturable as on CUDA, --cudagraphs on the CPU
    in_process = partial(run_main, cudagraphs="--cudagraphs" in flags) if name == TWIN else main_in_process
    line, _ = in_process(module, [*OFF_POLICY, *flags], tmp_path)
    assert line["status"] == "ok" and line["steps"] == 500
    # the twin, each variant: 4 warm-up calls, then the capture call runs it twice (on its static inputs, then captured)
    assert len(slow) == (12 if name == TWIN else 2)
    assert line["sps"] == 1.0
    (tmp_path / "0").mkdir()
    clock.now, clock.calls = 0.0, 0
    flags += ["--measure-burnin", "0"]
    line, _ = in_process(module, [*OFF_POLICY, *flags], tmp_path / "0")
    assert line["sps"] < 0.5


@pytest.mark.parametrize("name", SCRIPTS)
def test_track_logs_cleanrl_keys(name, tmp_path, fake_wandb):
    """Issue 17 item 5: with --track, CleanRL's keys with CleanRL's meanings (its td3_continuous_action.py logs
    losses/qf1_values, qf2_values, qf1_loss, qf2_loss, qf_loss (half their sum), actor_loss and charts/SPS every 100
    steps once learning started; no learning rate: it is fixed), the episodes' charts/episodic_return and
    charts/episodic_length; the values logged last are the results line's losses."""
    from regression import OFF_POLICY

    line, curve = (run_main if name == TWIN else main_in_process)(MODULES[name], [*OFF_POLICY, "--track"], tmp_path)
    losses = ["qf1_values", "qf2_values", "qf1_loss", "qf2_loss", "qf_loss", "actor_loss"]
    assert fake_wandb.keys() == {"charts/SPS", "charts/episodic_return", "charts/episodic_length"} | {
        f"losses/{key}" for key in losses
    }
    episodes = [
        (step, data["charts/episodic_return"]) for step, data in fake_wandb.logs if "charts/episodic_return" in data
    ]
    assert episodes == curve and len(curve) == 2
    logged = [(step, data) for step, data in fake_wandb.logs if "losses/qf_loss" in data]
    # iterations 200, 300, 400 and the last (global steps counted after the step)
    assert [step for step, _ in logged] == [201, 301, 401, 500]
    assert all(set(data) == {"charts/SPS"} | {f"losses/{key}" for key in losses} for _, data in logged)
    assert logged[-1][1] == {
        "charts/SPS": logged[-1][1]["charts/SPS"],
        **{f"losses/{k}": v for k, v in line["losses"].items()},
    }
    values = logged[-1][1]
    assert values["losses/qf_loss"] == pytest.approx((values["losses/qf1_loss"] + values["losses/qf2_loss"]) / 2)


# ---------------------------------------------------------------- scripts as subprocesses


# the twin with --compile runs end to end in the determinism and learning tests below
@pytest.mark.parametrize(
    "name,flags",
    [(EAGER, ()), (TWIN, ("--num-envs", "2"))],
    ids=["eager", "twin-2envs"],
)
def test_smoke_tiny_budget(name, flags, tmp_path):
    line = checks.smoke_tiny_budget(name, flags, tmp_path)
    assert list(line["losses"]) == ["qf1_values", "qf2_values", "qf1_loss", "qf2_loss", "qf_loss", "actor_loss"]


# the twin uncompiled: its --compile path is checked against eager update by update (fallback_random, above) and
# learns (below); each compiled run here would build inductor's kernels once more than the learning test does
@pytest.mark.parametrize("name", SCRIPTS)
def test_runs_are_deterministic_and_the_checkpoint_evaluates(name, tmp_path):
    checks.runs_are_deterministic_and_the_checkpoint_evaluates(name, eager.QNetwork(4, 1), "fc_mu.weight", tmp_path)


@pytest.mark.parametrize("name", SCRIPTS)
def test_non_finite_loss_stops_the_run_as_diverged(name, tmp_path):
    checks.non_finite_loss_stops_the_run_as_diverged(name, "--learning-rate", tmp_path)


# ---------------------------------------------------------------- bad input


BAD_INPUTS = [
    (("--env-id", "CartPole-v1"), "--env-id"),  # discrete actions
    (("--env-id", "NoSuchEnv-v0"), "--env-id"),
    (("--env-id", "Breakout-v5"), "--env-id"),  # an Atari (envpool) id
    (("--batch-size", "2000", "--buffer-size", "1000"), "--batch-size"),
    (("--learning-starts", "10000000"), "--learning-starts"),
    (("--total-timesteps", "1000", "--learning-starts", "1000"), "--learning-starts"),
    (("--buffer-size", "0"), "--buffer-size"),
    (("--batch-size", "-1"), "--batch-size"),
    (("--num-envs", "0"), "--num-envs"),
    # one vector step would overwrite its own rows (a short run: the old scripts trained on instead)
    (
        (
            "--num-envs",
            "8",
            "--buffer-size",
            "4",
            "--batch-size",
            "2",
            "--total-timesteps",
            "64",
            "--learning-starts",
            "8",
        ),
        "--num-envs",
    ),  # fmt: skip
    (("--policy-frequency", "0"), "--policy-frequency"),
    (("--tau", "1.5"), "--tau"),
    (("--noise-clip", "-0.1"), "--noise-clip"),
    (("--learning-rate", "-1"), "--learning-rate"),
]
VARIANT_IDS = ["eager", "twin", "twin-compile"]


# the twin with --compile too: it checks its input before it compiles anything
@pytest.mark.parametrize("name,extra", [(EAGER, ()), (TWIN, ()), (TWIN, ("--compile", "True"))], ids=VARIANT_IDS)
@pytest.mark.parametrize("flags,flag", BAD_INPUTS, ids=[" ".join(f) for f, _ in BAD_INPUTS])
def test_bad_input_exits_2_with_one_line(name, extra, flags, flag, capsys, tmp_path):
    checks.bad_input_exits_2_with_one_line(MODULES[name], name, flags, extra, flag, capsys, tmp_path)


@pytest.mark.parametrize("name,extra", [(EAGER, ()), (TWIN, ()), (TWIN, ("--compile", "True"))], ids=VARIANT_IDS)
@pytest.mark.parametrize("where", ["a-folder", "under-a-file"])
def test_results_file_that_cannot_be_written_exits_2_with_one_line(name, extra, where, capsys, tmp_path):
    checks.results_file_that_cannot_be_written_exits_2(MODULES[name], name, extra, where, capsys, tmp_path)


@pytest.mark.parametrize(
    "name,flags,flag", [(TWIN, ("--cudagraphs",), "--cudagraphs"), (EAGER, ("--env-id", "CartPole-v1"), "--env-id")]
)
def test_bad_input_from_the_command_line(name, flags, flag, tmp_path):
    checks.bad_input_from_the_command_line(name, flags, flag, tmp_path)


# ---------------------------------------------------------------- learning (tests/off_policy_checks.py's QUICK budget)


# CI learns with the twin; the eager script's run is `-m slow` (tests/regression.py pins its numbers for a seed,
# and the twin-equals-eager tests tie the twin's updates to it)
@pytest.mark.parametrize(
    "name,flags",
    [pytest.param(EAGER, (), marks=pytest.mark.slow), (TWIN, ("--compile",))],
    ids=["eager", "twin-compile"],
)
def test_learns_inverted_pendulum_in_4k_steps(name, flags, tmp_path):
    """Task: InvertedPendulum-v4. Budget: 4000 env steps, the first 500 random, then one update of batch 64 per step
    (about 3500), CleanRL's other hyper-parameters. Bar: mean of the last 10 episodic returns >= 40 (5x a random
    policy's 6-8). Measured on this budget (a 2-core CPU shared with other jobs, one torch thread): last 10
    episodes 60.6, 58.1, 64.8 (eager, seeds 1-3) and 59.4 (twin --compile, seed 1); 25-60 s per eager run and 158 s
    for the twin (about 60 s of it compiling; the file's only run of the script compiled by inductor) on that
    machine."""
    _, last10 = checks.learn(name, [*QUICK, *flags], tmp_path)
    assert last10 >= 40, last10


@pytest.mark.slow
@pytest.mark.parametrize("name,flags", [(EAGER, ()), (TWIN, ("--compile",))], ids=["eager", "twin-compile"])
def test_balances_inverted_pendulum_within_50k_steps(name, flags, tmp_path):
    """Task: InvertedPendulum-v4. Budget: 50k env steps with CleanRL's defaults but 10k random steps (not 25k).
    Bar: the last 10 episodes balance (mean episodic return >= 900 of 1000).
    Measured (seed 1, a 2-core CPU, one torch thread, two such runs side by side): eager 1000.0 over its last 10
    episodes, 425 s; twin --compile 1000.0, 554 s (compiling included)."""
    line, last10 = checks.learn(name, ["--learning-starts", "10000", "--total-timesteps", "50000", *flags], tmp_path)
    assert last10 >= 900, last10
