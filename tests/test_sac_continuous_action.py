"""SAC continuous-action pair: the math against float64 references, the replay buffer (wrap-around, filled rows only,
true final observations with several envs), the twin against the eager script (vmap over stacked Q-parameters, fused
target update, compiled update, graph breaks, no recompile), the scripts as subprocesses on CPU (smoke, save and
evaluate, determinism, divergence, bad input) and learning on InvertedPendulum-v4. The checks it shares with
tests/test_td3_continuous_action.py are in tests/off_policy_checks.py."""

import copy
import math
from functools import partial

import numpy as np
import off_policy_checks as checks
import pytest
import torch
from conftest import (
    args_from_flags,
    assert_finite_results_line,
    assert_summary_matches,
    load_script,
    main_in_process,
    strict_json,
)
from gpu_standin import host_reads, run_main
from off_policy_checks import QUICK, random_batch
from regression import PAIRS
from tensordict import TensorDict

from leanrl import bookkeeping as bk

EAGER, TWIN = "sac_continuous_action", "sac_continuous_action_torchcompile"
SCRIPTS = (EAGER, TWIN)
eager, twin = load_script(EAGER), load_script(TWIN)
MODULES = {EAGER: eager, TWIN: twin}


# ---------------------------------------------------------------- float64 references


def squashed_gaussian_reference(mean, log_std, noise, scale, bias):
    """Element by element: u = mean + exp(log_std) * noise, a = tanh(u) * scale + bias, log N(u; mean, std) minus
    log(scale * (1 - tanh(u)^2) + 1e-6), summed over action dims."""
    actions, log_probs, modes = [], [], []
    for m_row, s_row, n_row in zip(mean.double().tolist(), log_std.double().tolist(), noise.double().tolist()):
        a_row, mode_row, total = [], [], 0.0
        for j, (m, s, n) in enumerate(zip(m_row, s_row, n_row)):
            std = math.exp(s)
            u = m + std * n
            a_row.append(math.tanh(u) * scale[j] + bias[j])
            mode_row.append(math.tanh(m) * scale[j] + bias[j])
            normal_log_density = -((u - m) ** 2) / (2 * std * std) - math.log(std) - 0.5 * math.log(2 * math.pi)
            total += normal_log_density - math.log(scale[j] * (1 - math.tanh(u) ** 2) + 1e-6)
        actions.append(a_row)
        modes.append(mode_row)
        log_probs.append([total])
    return tuple(torch.tensor(x, dtype=torch.float64) for x in (actions, log_probs, modes))


def soft_q_target_reference(rewards, terminated, next_q1, next_q2, next_log_pi, alpha, gamma):
    out = []
    for r, term, q1, q2, lp in zip(
        *(x.double().tolist() for x in (rewards, terminated, next_q1, next_q2, next_log_pi))
    ):
        soft_value = min(q1, q2) - alpha * lp
        out.append(r if term else r + gamma * soft_value)  # a truncated transition still bootstraps
    return torch.tensor(out, dtype=torch.float64)


# ---------------------------------------------------------------- math


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("batch,act_dim", [(1, 1), (7, 3), (256, 6)])
def test_squashed_gaussian_matches_float64_reference(name, batch, act_dim):
    g = torch.Generator().manual_seed(batch + act_dim)
    mean = torch.randn(batch, act_dim, generator=g) * 2
    log_std = torch.rand(batch, act_dim, generator=g) * 7 - 5  # CleanRL's range [-5, 2]
    noise = torch.randn(batch, act_dim, generator=g)
    low = -torch.rand(act_dim, generator=g) * 3 - 0.5
    high = torch.rand(act_dim, generator=g) * 2 + 0.5  # asymmetric boxes: scale and bias both matter
    scale, bias = (high - low) / 2, (high + low) / 2
    action, log_prob, mode = MODULES[name].squashed_gaussian(mean, log_std, noise, scale, bias)
    want_action, want_log_prob, want_mode = squashed_gaussian_reference(
        mean, log_std, noise, scale.double().tolist(), bias.double().tolist()
    )
    assert action.shape == (batch, act_dim) and log_prob.shape == (batch, 1) and mode.shape == (batch, act_dim)
    # float32 results against float64 references: float32 tolerances
    torch.testing.assert_close(action, want_action.float())
    torch.testing.assert_close(mode, want_mode.float())
    # log(scale * (1 - tanh(u)^2) + 1e-6) is float32 rounding noise once tanh(u) is within ~1e-7 of +-1 (|u| > ~8):
    # compare the rows whose |u| < 3 at 1e-4, and only ask the saturated ones to stay finite
    u = mean + log_std.exp() * noise
    moderate = (u.abs() < 3).all(1)
    assert moderate.float().mean() > 0.2 or batch == 1
    torch.testing.assert_close(log_prob[moderate], want_log_prob.float()[moderate], rtol=1e-4, atol=1e-4)
    assert torch.isfinite(log_prob).all()
    assert ((action >= low - 1e-6) & (action <= high + 1e-6)).all()  # tanh = +-1 may round a ulp past the box


@pytest.mark.parametrize("name", SCRIPTS)
def test_actor_log_std_within_cleanrl_bounds_and_actions_in_the_box(name):
    torch.manual_seed(0)
    actor = MODULES[name].Actor(5, np.array([-2.0, 0.0]), np.array([2.0, 1.0]))
    obs = torch.randn(512, 5) * 100  # extreme inputs drive the tanh to its ends
    mean, log_std = actor(obs)
    assert log_std.min() >= -5 and log_std.max() <= 2 and log_std.min() < -4 and log_std.max() > 1
    action, log_prob, mode = actor.get_action(obs)
    assert torch.equal(actor.action_scale, torch.tensor([2.0, 0.5])) and torch.equal(
        actor.action_bias, torch.tensor([0.0, 0.5])
    )
    assert (action[:, 0].abs() <= 2).all() and ((action[:, 1] >= 0) & (action[:, 1] <= 1)).all()
    torch.testing.assert_close(mode, torch.tanh(mean) * actor.action_scale + actor.action_bias)


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("batch", [1, 9, 256])
@pytest.mark.parametrize("alpha,gamma", [(0.2, 0.99), (0.05, 0.9), (0.0, 0.99)])  # 0: no entropy bonus
def test_soft_q_target_matches_float64_reference(name, batch, alpha, gamma):
    g = torch.Generator().manual_seed(batch)
    b = random_batch(batch, batch)
    next_q1, next_q2 = torch.randn(batch, generator=g) * 5, torch.randn(batch, generator=g) * 5
    next_log_pi = torch.randn(batch, generator=g)
    got = MODULES[name].soft_q_target(b["rewards"], b["terminations"], next_q1, next_q2, next_log_pi, alpha, gamma)
    want = soft_q_target_reference(b["rewards"], b["terminations"], next_q1, next_q2, next_log_pi, alpha, gamma)
    assert got.shape == (batch,) and got.dtype == torch.float32
    torch.testing.assert_close(got, want.float())
    # a tensor alpha (the autotuned one) gives the same
    got_t = MODULES[name].soft_q_target(
        b["rewards"], b["terminations"], next_q1, next_q2, next_log_pi, torch.tensor([alpha]), gamma
    )
    torch.testing.assert_close(got_t, got)


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("batch", [1, 64])
def test_actor_and_temperature_losses_match_float64_reference(name, batch):
    g = torch.Generator().manual_seed(batch)
    log_pi, q1, q2 = torch.randn(batch, generator=g), torch.randn(batch, generator=g), torch.randn(batch, generator=g)
    alpha, log_alpha, target_entropy = 0.3, torch.tensor([-0.7]), -6.0
    want_actor = sum(alpha * lp - min(a, b) for lp, a, b in zip(log_pi.tolist(), q1.tolist(), q2.tolist())) / batch
    want_alpha = sum(-math.exp(-0.7) * (lp + target_entropy) for lp in log_pi.tolist()) / batch
    module = MODULES[name]
    torch.testing.assert_close(module.actor_loss_fn(log_pi, q1, q2, alpha), torch.tensor(want_actor))
    got_alpha = module.alpha_loss_fn(log_alpha, log_pi, target_entropy)
    torch.testing.assert_close(got_alpha, torch.tensor(want_alpha))
    # the temperature's gradient: d/dlog_alpha = -alpha * mean(log_pi + target entropy)
    log_alpha.requires_grad_(True)
    module.alpha_loss_fn(log_alpha, log_pi, target_entropy).backward()
    torch.testing.assert_close(log_alpha.grad, torch.tensor([want_alpha]))


# ---------------------------------------------------------------- twin against eager


networks = partial(checks.networks, eager.Actor, eager.SoftQNetwork)
stacked = partial(checks.stacked, twin.SoftQNetwork)


def test_vmap_over_stacked_q_params_equals_the_two_networks():
    checks.vmap_over_stacked_q_params_equals_the_two_networks(twin, networks, stacked)


def test_fused_target_update_equals_the_per_parameter_one():
    _, qf1, qf2 = networks()
    _, t1, t2 = networks(seed=1)
    params, _ = stacked(qf1, qf2)
    target = TensorDict.from_modules(t1, t2).data.clone()
    update = torch.compile(twin.update_targets, fullgraph=True)
    for _ in range(3):
        eager.update_targets(
            list(t1.parameters()) + list(t2.parameters()), list(qf1.parameters()) + list(qf2.parameters()), 0.005
        )
        update(list(target.values(True, True)), list(params.data.values(True, True)), torch.tensor(0.005))
    torch.testing.assert_close(target["fc2", "weight"][0], t1.fc2.weight, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(target["fc3", "bias"][1], t2.fc3.bias, rtol=1e-6, atol=1e-7)
    assert not torch.allclose(t1.fc2.weight, networks(seed=1)[1].fc2.weight), "the targets moved"
    before = target.clone()
    with torch._dynamo.config.patch(error_on_recompile=True):  # a new tau value is data, not a new graph
        update(list(target.values(True, True)), list(params.data.values(True, True)), torch.tensor(0.0))
    assert (target == before).all(), "tau 0 (the steps without a target update) leaves the targets exactly"


def test_twin_updates_equal_eager_updates():
    """Same weights, same batch, same noise: the twin's critic, actor and temperature steps (vmapped Q, detached Q in
    the actor loss, torch.autograd.grad and Adam as tensor ops, fused target lerp) move every parameter as the eager
    ones (backward() and torch.optim.Adam) do."""
    actor, qf1, qf2 = networks()
    t_actor = copy.deepcopy(actor)
    qf1_target, qf2_target = copy.deepcopy(qf1), copy.deepcopy(qf2)
    params, qnet = stacked(qf1, qf2)
    target = params.data.clone()
    q_opt = torch.optim.Adam(list(qf1.parameters()) + list(qf2.parameters()), lr=1e-3)
    t_q_opt = twin.make_adam(list(params.parameters()), lr=1e-3)
    a_opt, t_a_opt = torch.optim.Adam(actor.parameters(), lr=3e-4), twin.make_adam(list(t_actor.parameters()), lr=3e-4)
    log_alpha, t_log_alpha = torch.zeros(1, requires_grad=True), torch.zeros(1, requires_grad=True)
    al_opt, t_al_opt = torch.optim.Adam([log_alpha], lr=1e-3), twin.make_adam([t_log_alpha], lr=1e-3)
    for step in range(3):
        b = random_batch(32, step)
        alpha = log_alpha.detach().exp()
        torch.manual_seed(step)
        want = eager.critic_update(actor, qf1, qf2, qf1_target, qf2_target, q_opt, b, alpha, 0.99)
        want["actor_loss"] = eager.actor_update(actor, qf1, qf2, a_opt, b["obs"], alpha)
        want["alpha_loss"] = eager.alpha_update(actor, log_alpha, al_opt, b["obs"], -3.0)
        torch.manual_seed(step)
        got = twin.critic_update(t_actor, qnet, params, target, t_q_opt, b, t_log_alpha.detach().exp(), 0.99)
        got["actor_loss"] = twin.actor_update(t_actor, qnet, params, t_a_opt, b["obs"], t_log_alpha.detach().exp())
        got["alpha_loss"] = twin.alpha_update(t_actor, t_log_alpha, t_al_opt, b["obs"], -3.0)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        eager.update_targets(
            list(qf1_target.parameters()) + list(qf2_target.parameters()),
            list(qf1.parameters()) + list(qf2.parameters()),
            0.005,
        )
        twin.update_targets(list(target.values(True, True)), list(params.data.values(True, True)), torch.tensor(0.005))
    torch.testing.assert_close(t_actor.state_dict(), actor.state_dict(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(t_log_alpha, log_alpha)
    for i, (qf, qf_target) in enumerate(((qf1, qf1_target), (qf2, qf2_target))):
        for key in ("fc1", "fc2", "fc3"):
            torch.testing.assert_close(params[key, "weight"][i], getattr(qf, key).weight, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(target[key, "bias"][i], getattr(qf_target, key).bias, rtol=1e-5, atol=1e-6)
    assert log_alpha.item() != 0.0 and not torch.allclose(qf1.fc1.weight, networks()[1].fc1.weight)


def twin_learner(seed=0):
    actor, qf1, qf2 = networks(obs_dim=4, act_dim=1, seed=seed)
    params, qnet = stacked(qf1, qf2, 4, 1)
    log_alpha = torch.zeros(1, requires_grad=True)
    return dict(
        actor=actor,
        qnet=qnet,
        params=params,
        target=params.data.clone(),
        q_opt=twin.make_adam(list(params.parameters()), lr=1e-3),
        a_opt=twin.make_adam(list(actor.parameters()), lr=3e-4),
        log_alpha=log_alpha,
        al_opt=twin.make_adam([log_alpha], lr=1e-3),
        buffer=twin.make_buffer(1000, 4, 1, "cpu"),
    )


def call_train_step(fn, learner, count, transition, policy_update, call):
    """train_step in the call-th step of the compiled check; its third step updates no target (tau 0), and reuses the
    same graph."""
    L, tau = learner, torch.tensor(0.0 if call == 2 else 0.005)
    return fn(
        L["actor"], L["qnet"], L["params"], L["target"], L["q_opt"], L["a_opt"], L["log_alpha"], L["al_opt"],
        L["buffer"], count, transition, tau, policy_update=policy_update,
        batch_size=32, gamma=0.99, policy_frequency=2, autotune=True, target_entropy=-1.0,
    )  # fmt: skip


# aot_eager: Dynamo's graphs and AOTAutograd's functionalized in-place writes, run with eager's kernels; inductor's
# own kernels for the update are built and run by the twin's --compile learning run, and compared here with -m slow
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_train_step_equals_the_uncompiled_one_without_recompiles(backend):
    """SAC's update: critic, actor and temperature steps (8 statistics with the actor, 6 without), the temperature
    compared too. With inductor (-m slow) it took 94 s in a cold run on a 2-core EPYC, with aot_eager 10 s or less."""
    compared = ("actor", "params"), ("target", "log_alpha")
    ref = checks.compiled_train_step_equals_the_uncompiled_one(
        twin, twin_learner, call_train_step, backend, {False: 6, True: 8}, compared
    )
    assert ref["log_alpha"].item() < 0, "the temperature moved"


def test_policy_step_compiles_whole():
    torch.manual_seed(0)
    actor = twin.Actor(4, np.array([-3.0]), np.array([3.0]))
    policy = torch.compile(twin.act, fullgraph=True)
    obs = torch.randn(8, 4)
    with torch._dynamo.config.patch(error_on_recompile=False):
        first = policy(actor, obs)
    with torch._dynamo.config.patch(error_on_recompile=True):
        draws = torch.stack([policy(actor, obs) for _ in range(200)])
    assert first.shape == (8, 1) and draws.abs().max() <= 3
    mean, log_std = actor(obs)
    # sampled, not the mean: the draws spread around tanh(mean) * 3 by about the policy's std
    assert draws.std(0).min() > 0.1 * log_std.exp().min().clamp(max=1)
    torch.testing.assert_close(draws.mean(0), (torch.tanh(mean) * 3).detach(), atol=0.3, rtol=0)


def test_twin_step_functions_run_on_the_meta_device():
    """The policy step, the buffer write, the sampler, the soft Q target and the whole update (both graphs) run on the
    meta device, where tensors have no data: a host read (.item(), bool()...) raises there, and so does a tensor made
    without device= (it lands on the CPU and cannot mix with meta ones). The update returns its statistics as one
    stacked tensor (a CUDA graph clones each output on every replay)."""
    meta = torch.device("meta")
    actor = twin.Actor(4, np.array([-3.0]), np.array([3.0])).to(meta)
    params = TensorDict.from_modules(twin.SoftQNetwork(4, 1).to(meta), twin.SoftQNetwork(4, 1).to(meta), as_module=True)
    qnet, target = twin.SoftQNetwork(4, 1).to(meta), params.data.clone()
    log_alpha = torch.zeros(1, device=meta, requires_grad=True)
    buffer, count = twin.make_buffer(1000, 4, 1, meta), torch.zeros((), dtype=torch.long, device=meta)
    transition = {key: torch.empty(2, *value.shape[1:], device=meta) for key, value in buffer.items()}
    with host_reads() as reads:
        assert twin.act(actor, transition["obs"]).shape == (2, 1)
        count = twin.buffer_add(buffer, count, transition)
        batch = twin.buffer_sample(buffer, count, 32)
        assert {key: value.shape[0] for key, value in batch.items()} == dict.fromkeys(buffer, 32)
        target_q = twin.soft_q_target(*(batch[k] for k in ("rewards", "terminations", "rewards", "rewards", "rewards")),
                                      log_alpha.detach().exp(), 0.99)  # fmt: skip
        assert target_q.shape == (32,)
        for policy_update, n_stats in ((False, 6), (True, 8)):
            count, stats = twin.train_step(
                actor, qnet, params, target, twin.make_adam(list(params.parameters()), 1e-3),
                twin.make_adam(list(actor.parameters()), 3e-4), log_alpha, twin.make_adam([log_alpha], 1e-3), buffer,
                count, transition, torch.tensor(0.005, device=meta), policy_update=policy_update, batch_size=32,
                gamma=0.99, policy_frequency=2, autotune=True, target_entropy=-1.0,
            )  # fmt: skip
            assert count.device == stats.device == meta and stats.shape == (n_stats,)
    assert reads == {}


@pytest.fixture
def in_process():
    """A script's main() in this process: one torch thread (beside the subprocess tests on 2 cores), and the float32
    matmul precision the twin sets for the whole process restored after."""
    precision, threads = torch.get_float32_matmul_precision(), torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_float32_matmul_precision(precision)
    torch.set_num_threads(threads)


TINY_RUN = list(PAIRS[EAGER])  # tests/regression.py's: Pendulum-v1, 500 steps, learning from the 102nd, batch 32
STEP_LINE = "next_obs, rewards, terminations, truncations, infos = envs.step(actions.cpu().numpy())"


@pytest.mark.parametrize("cudagraphs", [False, True], ids=["plain", "cudagraphs"])
def test_twin_host_reads_are_the_pinned_ones(cudagraphs, tmp_path, in_process):
    """Every host read of a tiny twin run (500 steps, 400 of them learning), by line, also with --cudagraphs (on the
    CPU stand-in): a new read fails this test, naming its line. (tests/test_gpu_path.py does not count SAC's runs:
    the counting slows SAC's many small ops by about what this run costs.)"""
    with host_reads() as reads:
        run_main(twin, TINY_RUN, tmp_path, cudagraphs=cudagraphs)
    assert dict(reads) == {
        # the env steps on the host: one read of the actions per step (the first 100 random actions too: the twin
        # uploads them for the buffer and reads them back), .numpy() of that host copy counted with it
        f"cpu at {TWIN}.py: {STEP_LINE}": 500,
        f"numpy at {TWIN}.py: {STEP_LINE}": 500,
        # the logged statistics, one read per log point that has them: iterations 200, 300, 400 and the last
        "tolist at bookkeeping.py: values = torch.stack([v.detach().float() for v in values]).tolist()": 4,
    }


CLEANRL_SAC_LOSSES = ["qf1_values", "qf2_values", "qf1_loss", "qf2_loss", "qf_loss", "actor_loss", "alpha"]


@pytest.mark.parametrize(
    "name,flags", [(EAGER, ()), (TWIN, ()), (TWIN, ("--no-autotune",))], ids=["eager", "twin", "twin-fixed-alpha"]
)
def test_track_logs_cleanrl_sac_keys_every_100_iterations(name, flags, tmp_path, fake_wandb, in_process):
    """With --track: CleanRL's sac_continuous_action keys with its meanings (qf_loss the mean of the two Q losses,
    alpha the temperature after the update, alpha_loss only when autotuned), every 100 iterations once learning
    started (and at the last), read in one go; the results line reports the values of the last log point."""
    line, curve = main_in_process(MODULES[name], [*TINY_RUN, "--track", *flags], tmp_path)
    assert fake_wandb.config["name"] == line["run_name"] and fake_wandb.finished
    logged = [(step, data) for step, data in fake_wandb.logs if "losses/qf_loss" in data]
    assert [step for step, _ in logged] == [201, 301, 401, 500]  # iterations 200, 300, 400, 499: env steps done
    keys = {f"losses/{key}" for key in CLEANRL_SAC_LOSSES + ["alpha_loss"] * (flags == ())}
    for _, data in logged:
        assert set(data) == keys | {"charts/SPS"}
        assert data["losses/qf_loss"] == pytest.approx((data["losses/qf1_loss"] + data["losses/qf2_loss"]) / 2, 1e-6)
        assert data["losses/alpha"] == pytest.approx(0.2) if flags else 0 < data["losses/alpha"] < 1
    assert {key: data for key, data in logged[-1][1].items() if key != "charts/SPS"} == {
        f"losses/{key}": value for key, value in line["losses"].items()
    }
    episodes = [data for _, data in fake_wandb.logs if "charts/episodic_return" in data]
    assert [data["charts/episodic_return"] for data in episodes] == [ret for _, ret in curve] and len(curve) == 2
    assert [data["charts/episodic_length"] for data in episodes] == [200, 200]


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("burnin", [0, 1])
def test_steps_per_second_leave_out_measure_burnin_iterations_after_learning_starts(
    name, burnin, tmp_path, monkeypatch, in_process
):
    """A fake clock: every iteration takes 1 s, the first update 1000 s more (a compile, say). The steps/s window opens
    after the 101 iterations before learning starts (the first learns at global_step 101 > --learning-starts 100) and
    --measure-burnin more: 1 leaves the slow update out (1 step/s), 0 keeps it in."""
    module, clock, updates = MODULES[name], [1000.0], []
    monkeypatch.setattr(bk.time, "time", lambda: clock[0])
    tick, train_step = bk.Run.tick, module.train_step

    def tick_a_second_later(run, step):
        clock[0] += 1.0
        tick(run, step)

    def first_update_is_slow(*args, **kwargs):
        clock[0] += 0.0 if updates else 1000.0
        updates.append(len(updates))
        return train_step(*args, **kwargs)

    monkeypatch.setattr(bk.Run, "tick", tick_a_second_later)
    monkeypatch.setattr(module, "train_step", first_update_is_slow)
    flags = [*TINY_RUN[: TINY_RUN.index("--measure-burnin")], "--measure-burnin", str(burnin)]
    line, _ = main_in_process(module, flags, tmp_path)
    assert len(updates) == 500 - 101
    window = 500 - (101 + burnin)  # iterations (of one env step) after the burn-in
    assert line["sps"] == pytest.approx(window / (window + (1000 if burnin == 0 else 0)))


# ---------------------------------------------------------------- scripts as subprocesses


# the twin with --compile runs end to end in the determinism and learning tests below
@pytest.mark.parametrize(
    "name,flags",
    [(EAGER, ()), (TWIN, ("--num-envs", "2", "--no-autotune", "--alpha", "0.1"))],
    ids=["eager", "twin-2envs-fixed-alpha"],
)
def test_smoke_tiny_budget(name, flags, tmp_path):
    losses = checks.smoke_tiny_budget(name, flags, tmp_path)["losses"]
    assert {"qf_loss", "qf1_values", "qf2_values", "actor_loss", "alpha"} <= set(losses)
    if "--no-autotune" in flags:
        assert losses["alpha"] == pytest.approx(0.1, rel=1e-6) and "alpha_loss" not in losses
    else:
        assert losses["alpha"] < 1.0 and "alpha_loss" in losses  # the temperature was tuned down from 1


@pytest.mark.parametrize("name", SCRIPTS)
def test_fixed_alpha_zero_trains_without_an_entropy_bonus(name, tmp_path, capsys):
    """--no-autotune --alpha 0 is a valid fixed temperature (no entropy bonus): a tiny run in-process finishes with
    temperature 0 and finite losses (taking its log with math.log crashed the scripts before their first step)."""
    flags = ("--env-id", "InvertedPendulum-v4", "--learning-starts", "50", "--total-timesteps", "101")
    flags += ("--batch-size", "32", "--buffer-size", "1000", "--measure-burnin", "10", "--autotune", "False")
    args = args_from_flags(MODULES[name], (*flags, "--alpha", "0"))
    args.results_file, args.cuda = str(tmp_path / "results.jsonl"), False
    # one thread, as the subprocesses have: beside another process, two OpenMP threads on 2 cores crawl
    precision, threads = torch.get_float32_matmul_precision(), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        MODULES[name].main(args)
    finally:
        torch.set_float32_matmul_precision(precision)  # the twin sets it for the whole process
        torch.set_num_threads(threads)
    [line] = [strict_json(text) for text in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert_finite_results_line(line, name)
    assert_summary_matches(capsys.readouterr().out, line, tmp_path / "results.jsonl")
    assert line["steps"] == 101 and line["losses"]["alpha"] == 0.0 and "alpha_loss" not in line["losses"]
    assert "actor_loss" in line["losses"]  # step 100 updated the actor (and logged)


# the twin uncompiled: its --compile path is checked against eager update by update (fallback_random, above) and
# learns (below); each compiled run here would build inductor's kernels once more than the learning test does
@pytest.mark.parametrize("name", SCRIPTS)
def test_runs_are_deterministic_and_the_checkpoint_evaluates(name, tmp_path):
    checks.runs_are_deterministic_and_the_checkpoint_evaluates(
        name, eager.SoftQNetwork(4, 1), "fc_logstd.weight", tmp_path
    )


@pytest.mark.parametrize("name", SCRIPTS)
def test_non_finite_loss_stops_the_run_as_diverged(name, tmp_path):
    checks.non_finite_loss_stops_the_run_as_diverged(name, "--q-lr", tmp_path)


# ---------------------------------------------------------------- bad input


BAD_INPUTS = [
    (("--env-id", "CartPole-v1"), "--env-id"),  # discrete actions
    (("--env-id", "NoSuchEnv-v0"), "--env-id"),
    (("--env-id", "Breakout-v5"), "--env-id"),  # an Atari (envpool) id
    (("--batch-size", "2000", "--buffer-size", "1000"), "--batch-size"),
    (("--num-envs", "8", "--buffer-size", "4", "--batch-size", "4"), "--num-envs"),  # a step would overwrite its rows
    (("--learning-starts", "10000000"), "--learning-starts"),
    (("--total-timesteps", "1000", "--learning-starts", "1000"), "--learning-starts"),
    (("--buffer-size", "0"), "--buffer-size"),
    (("--batch-size", "-1"), "--batch-size"),
    (("--num-envs", "0"), "--num-envs"),
    (("--policy-frequency", "0"), "--policy-frequency"),
    (("--target-network-frequency", "0"), "--target-network-frequency"),
    (("--tau", "1.5"), "--tau"),
    (("--alpha", "-0.1"), "--alpha"),
    (("--policy-lr", "-1"), "--policy-lr"),
    (("--q-lr", "-1"), "--q-lr"),
    (("--q-lr", "0"), "--q-lr"),
]
VARIANT_IDS = ["eager", "twin", "twin-compile"]


# the twin with --compile too: it checks its input before it compiles anything
@pytest.mark.parametrize("name,extra", [(EAGER, ()), (TWIN, ()), (TWIN, ("--compile", "True"))], ids=VARIANT_IDS)
@pytest.mark.parametrize("flags,flag", BAD_INPUTS, ids=[" ".join(f) for f, _ in BAD_INPUTS])
def test_bad_input_exits_2_with_one_line(name, extra, flags, flag, capsys, tmp_path):
    checks.bad_input_exits_2_with_one_line(MODULES[name], name, flags, extra, flag, capsys, tmp_path)


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("where", ["a-folder", "under-a-file"])
def test_bad_results_file_exits_2_with_one_line(name, where, capsys, tmp_path):
    checks.results_file_that_cannot_be_written_exits_2(MODULES[name], name, (), where, capsys, tmp_path)


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
    episodes 94.9, 97.1, 92.1 (eager, seeds 1-3) and 87.5, 75.7 (twin --compile, seeds 1-2); 80-300 s per run on that
    loaded machine (20-50 steps/s), ~60 s of it compiling the twin (the file's only run of the script compiled by
    inductor)."""
    _, last10 = checks.learn(name, [*QUICK, *flags], tmp_path)
    assert last10 >= 40, last10


@pytest.mark.slow
@pytest.mark.parametrize("name,flags", [(EAGER, ()), (TWIN, ("--compile",))], ids=["eager", "twin-compile"])
def test_balances_inverted_pendulum_within_30k_steps(name, flags, tmp_path):
    """Task: InvertedPendulum-v4. Budget: 30k env steps with CleanRL's defaults (the first 5000 random, batch 256).
    Bar: the last 10 episodes balance (mean episodic return >= 900 of 1000).
    Measured (seed 1, a 2-core CPU, one torch thread, two such runs side by side): eager 1000.0 over its last 10
    episodes, 424 s; twin --compile 1000.0, 547 s (compiling included)."""
    line, last10 = checks.learn(name, ["--learning-starts", "5000", "--total-timesteps", "30000", *flags], tmp_path)
    assert last10 >= 900, last10
