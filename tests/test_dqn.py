"""CartPole DQN pair: the math against float64 references, the buffer, terminated vs truncated transitions against
an independent replay of the env, the twin against the eager script (compiled update, policy step, graph breaks,
recompiles), the scripts as subprocesses on CPU (smoke, save and evaluate, bad input, divergence, determinism) and
learning on CartPole-v1."""

import contextlib
import copy
import csv
import inspect
import json
import math
import random
from pathlib import Path
from unittest import mock

import gymnasium as gym
import numpy as np
import pytest
import torch
import tyro
from conftest import assert_finite_results_line, assert_summary_matches, check_bad_input, load_script, run_script

EAGER, TWIN = "dqn", "dqn_torchcompile"
SCRIPTS = [EAGER, TWIN]
eager, twin = load_script(EAGER), load_script(TWIN)
MODULES = {EAGER: eager, TWIN: twin}

# every part of a run (random phase, learning, target copies at 500, log points) in 1000 steps
TINY = ["--learning-starts", "200", "--total-timesteps", "1000", "--train-frequency", "10"]


@pytest.fixture(autouse=True)
def one_torch_thread(monkeypatch):
    # tiny MLPs: a second intra-op thread only adds synchronisation on a busy 2-core machine
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def as_input(transition):
    """A transition of tensors as buffer_add takes it: numpy arrays."""
    return {key: value.numpy() for key, value in transition.items()}


def sample(name, buffer, count, batch_size, seed):
    """buffer_sample after seeding the RNG the script draws its rows from: numpy's in eager; torch's in the twin, which
    samples the buffer's memory as tensors (on a CPU the same memory) with a 0-d tensor count."""
    if name == EAGER:
        np.random.seed(seed)
        return eager.buffer_sample(buffer, count, batch_size, "cpu")
    torch.manual_seed(seed)
    return twin.buffer_sample(
        {key: torch.from_numpy(value) for key, value in buffer.items()}, torch.tensor(count), batch_size
    )


# ---------------------------------------------------------------- DQN target


def dqn_target_reference(rewards, next_q_values, terminations, gamma):
    """r + gamma * max_a Q'(s', a), no bootstrap past a terminated s'; float64, one transition at a time."""
    out = []
    for r, q, term in zip(rewards.double().tolist(), next_q_values.double().tolist(), terminations.tolist()):
        out.append(r if term else r + gamma * max(q))
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("shape", [(1, 2), (7, 3), (128, 2), (64, 6)])
@pytest.mark.parametrize("gamma", [0.99, 0.5])
def test_dqn_target_matches_float64_reference(name, shape, gamma):
    B, A = shape
    g = torch.Generator().manual_seed(B * 10 + A)
    rewards = torch.randn(B, generator=g)
    next_q_values = torch.randn(B, A, generator=g) * 5
    terminations = (torch.rand(B, generator=g) < 0.3).float()
    if B > 1:  # both kinds, always
        terminations[0], terminations[1] = 1.0, 0.0
    got = MODULES[name].dqn_target(rewards, next_q_values, terminations, gamma)
    want = dqn_target_reference(rewards, next_q_values, terminations, gamma)
    assert got.shape == (B,) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want)


def test_twin_dqn_target_equals_eager_and_compiles_whole():
    g = torch.Generator().manual_seed(1)
    inputs = (
        torch.randn(32, generator=g),
        torch.randn(32, 2, generator=g),
        (torch.rand(32, generator=g) < 0.5).float(),
    )
    want = eager.dqn_target(*inputs, 0.99)
    torch.testing.assert_close(twin.dqn_target(*inputs, 0.99), want)
    torch.testing.assert_close(torch.compile(twin.dqn_target, fullgraph=True)(*inputs, 0.99), want)


# ---------------------------------------------------------------- epsilon schedule


@pytest.mark.parametrize("name", SCRIPTS)
def test_linear_schedule_decays_over_its_fraction_then_stays(name):
    schedule = MODULES[name].linear_schedule
    # CleanRL's defaults: 1 -> 0.05 over 0.5 * 500k steps
    for t, want in [(0, 1.0), (1, 1.0 - 0.95 / 250000), (50000, 0.81), (125000, 0.525), (200000, 0.24)]:
        assert schedule(1.0, 0.05, 250000.0, t) == pytest.approx(want, abs=1e-12), t
    for t in (250000, 250001, 400000, 10**9):
        assert schedule(1.0, 0.05, 250000.0, t) == pytest.approx(0.05, abs=1e-12), t
    # strictly decreasing inside the window (never stuck at an end)
    values = [schedule(1.0, 0.01, 1000, t) for t in range(0, 1001, 100)]
    assert all(a > b for a, b in zip(values, values[1:])), values
    assert schedule(0.2, 0.2, 10, 5) == pytest.approx(0.2)


# ---------------------------------------------------------------- replay buffer


def numbered(first, n, obs_dim=3):
    """n transitions whose every field encodes its number first, first + 1, ..."""
    k = torch.arange(first, first + n)
    return dict(
        obs=k[:, None].float().expand(n, obs_dim).clone(),
        actions=k % 2,
        rewards=k.float() * 10,
        next_obs=(k[:, None].float() + 0.5).expand(n, obs_dim).clone(),
        terminations=(k % 3 == 0).float(),
    )


@pytest.mark.parametrize("name", SCRIPTS)
def test_buffer_wraps_around_and_samples_only_filled_rows(name):
    mod = MODULES[name]
    buffer = mod.make_buffer(5, 3)
    count = mod.buffer_add(buffer, 0, as_input(numbered(0, 3)))
    assert int(count) == 3
    batch = sample(name, buffer, count, 2000, seed=0)
    assert all(isinstance(value, torch.Tensor) and len(value) == 2000 for value in batch.values())
    numbers = batch["obs"][:, 0]
    assert set(numbers.tolist()) == {0.0, 1.0, 2.0}, "sampled an unfilled row"
    # every field of a sampled row belongs to the same transition
    torch.testing.assert_close(batch["rewards"], numbers * 10)
    torch.testing.assert_close(batch["next_obs"][:, 0], numbers + 0.5)
    torch.testing.assert_close(batch["actions"], numbers.long() % 2)

    # 4 more in one write: rows 3, 4, then 0, 1 (the oldest) are overwritten
    count = mod.buffer_add(buffer, count, as_input(numbered(3, 4)))
    assert int(count) == 7
    assert buffer["obs"][:, 0].tolist() == [5.0, 6.0, 2.0, 3.0, 4.0]
    assert buffer["rewards"].tolist() == [50.0, 60.0, 20.0, 30.0, 40.0]
    assert buffer["terminations"].tolist() == [0.0, 1.0, 0.0, 1.0, 0.0]
    # one by one past a second wrap
    for k in range(7, 12):
        count = mod.buffer_add(buffer, count, as_input(numbered(k, 1)))
    assert int(count) == 12 and buffer["obs"][:, 0].tolist() == [10.0, 11.0, 7.0, 8.0, 9.0]

    # uniform over the 5 full rows: each about 1/5 of 20000 draws (sd ~57 draws)
    numbers = sample(name, buffer, count, 20000, seed=1)["obs"][:, 0]
    freq = torch.bincount(numbers.long() - 7, minlength=5).float() / 20000
    assert freq.shape == (5,) and (freq - 0.2).abs().max() < 0.015, freq


@pytest.mark.parametrize("name", SCRIPTS)
def test_buffer_sample_is_uniform_over_millions_of_rows(name):
    """Issue 16 item 7: the twin drew rows as (torch.rand(n) * size).long(), but a float32 in [0, 1) takes only 2**24
    values, so over millions of rows some rows get one value more than others (at 1M rows 17 against 16, 6% more
    draws; at 5M rows 4 against 3). Pearson's chi-square over 5M rows and 4M draws: for uniform draws it has mean
    M - 1 and sd sqrt(2 (M - 1)) (also at under one draw per row); the old sampler is 26 sd above, both samplers now
    within 5."""
    rows, draws = 5_000_000, 4_000_000
    buffer = {"obs": np.arange(rows, dtype=np.int32)}  # each row holds its own number
    drawn = sample(name, buffer, rows + 7, draws, seed=0)["obs"]
    counts = torch.bincount(drawn.long(), minlength=rows).double()
    chi2 = ((counts - draws / rows) ** 2).sum().item() / (draws / rows)
    assert abs(chi2 - (rows - 1)) < 5 * math.sqrt(2 * (rows - 1)), (chi2 - (rows - 1)) / math.sqrt(2 * (rows - 1))


def test_twin_buffer_is_the_eager_one_and_upload_keeps_the_device_copy_equal():
    """The twin writes the eager script's numpy buffer (the same functions); on CUDA upload() copies the rows written
    since the last upload to the device before each update. Here the device is a second CPU copy: after uploads of
    1, 3, 0 and 7 new rows (past two wraps) and of more rows than the buffer holds, its written rows equal the host
    buffer's."""
    for fn in ("make_buffer", "buffer_add", "epsilon_greedy"):  # epsilon_greedy: the policy on a CPU
        assert inspect.getsource(getattr(twin, fn)) == inspect.getsource(getattr(eager, fn)), fn
    buffer = twin.make_buffer(6, 3)
    pinned = {key: torch.from_numpy(value) for key, value in buffer.items()}
    replay = {key: torch.full_like(value, -1) for key, value in pinned.items()}
    count = uploaded = 0
    for new in (1, 3, 0, 7, 15):
        for _ in range(new):
            count = twin.buffer_add(buffer, count, as_input(numbered(count, 1)))
        uploaded = twin.upload(replay, pinned, uploaded, count)
        assert uploaded == count
        filled = min(count, 6)  # the rows never written are not copied
        for key in buffer:
            torch.testing.assert_close(replay[key][:filled], pinned[key][:filled], msg=f"{key} after {count} writes")
            assert (replay[key][filled:] == -1).all(), key


def test_twin_sampler_compiles_whole_and_the_fill_level_recompiles_nothing():
    buffer = twin.make_buffer(6, 3)
    for k in range(8):
        twin.buffer_add(buffer, k, as_input(numbered(k, 1)))
    replay = {key: torch.from_numpy(value) for key, value in buffer.items()}
    sample = torch.compile(twin.buffer_sample, fullgraph=True)
    with torch._dynamo.config.patch(error_on_recompile=False):
        sample(replay, torch.tensor(4), 256)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for n in (5, 6, 14):  # the fill level changes: no recompile
            rows = sample(replay, torch.tensor(n), 256)["obs"][:, 0]
            assert set(rows.tolist()) <= set(replay["obs"][: min(n, 6), 0].tolist())


# ---------------------------------------------------------------- terminated vs truncated transitions


@pytest.mark.parametrize("name", SCRIPTS)
def test_buffer_holds_true_final_obs_and_only_terminations_stop_the_bootstrap(name, monkeypatch):
    """The script's env (same-step autoreset), its real_next_obs and buffer_add over 400 random steps of CartPole cut
    at 12 steps, against an independent replay of the same actions in a plain env (reset by hand). A truncated
    transition keeps the obs the env really reached (not the reset obs) and bootstraps from it; a terminated one
    does not bootstrap."""
    mod, limit, steps, seed = MODULES[name], 12, 400, 3
    make = gym.make
    with monkeypatch.context() as patch:  # the script's env, its episodes cut at `limit` steps
        patch.setattr(gym, "make", lambda env_id, **kwargs: make(env_id, max_episode_steps=limit, **kwargs))
        envs = mod.make_envs("CartPole-v1", 1)
    buffer, count = mod.make_buffer(steps, 4), 0
    rng = np.random.default_rng(0)
    actions = rng.integers(0, 2, size=steps)
    obs, _ = envs.reset(seed=seed)
    for a in actions:
        next_obs, rewards, terminations, truncations, infos = envs.step(np.array([a]))
        transition = dict(
            obs=torch.as_tensor(obs),
            actions=torch.as_tensor([a]),
            rewards=torch.as_tensor(rewards, dtype=torch.float32),
            next_obs=torch.as_tensor(mod.real_next_obs(next_obs, infos)),
            terminations=torch.as_tensor(terminations, dtype=torch.float32),
        )
        count = mod.buffer_add(buffer, count, as_input(transition))
        obs = next_obs
    buffer = {key: torch.as_tensor(value) for key, value in buffer.items()}

    ref = gym.make("CartPole-v1", max_episode_steps=limit)
    ref_obs, _ = ref.reset(seed=seed)
    kinds = {"terminated": 0, "truncated": 0}
    for t, a in enumerate(actions):
        ref_next, ref_reward, terminated, truncated, _ = ref.step(int(a))
        np.testing.assert_array_equal(buffer["obs"][t].numpy(), ref_obs)
        np.testing.assert_array_equal(buffer["next_obs"][t].numpy(), ref_next)  # the true next obs, also at an end
        assert buffer["terminations"][t].item() == float(terminated)
        assert buffer["rewards"][t].item() == ref_reward
        if terminated or truncated:
            kinds["terminated" if terminated else "truncated"] += 1
            ref_obs, _ = ref.reset()
            assert not np.array_equal(ref_obs, ref_next)
        else:
            ref_obs = ref_next
    assert kinds["terminated"] >= 3 and kinds["truncated"] >= 3, kinds

    # the targets: a truncated transition bootstraps from its final obs, a terminated one is its reward alone
    next_q_values = torch.stack([buffer["next_obs"].sum(1), -buffer["next_obs"].sum(1)], dim=1)
    target = mod.dqn_target(buffer["rewards"], next_q_values, buffer["terminations"], 0.9)
    bootstrap = 0.9 * next_q_values.max(1).values
    term = buffer["terminations"] == 1
    torch.testing.assert_close(target[term], buffer["rewards"][term])
    torch.testing.assert_close(target[~term], buffer["rewards"][~term] + bootstrap[~term])


# ---------------------------------------------------------------- policy step


@pytest.mark.parametrize("name, on_device", [(EAGER, False), (TWIN, False), (TWIN, True)])
def test_epsilon_greedy_explores_at_the_rate_epsilon(name, on_device):
    """The host policy (the eager script's; the twin's on a CPU) and the twin's device policy (CUDA)."""
    torch.manual_seed(0)
    random.seed(0)
    q_network = MODULES[name].QNetwork(4, 3)
    obs = torch.randn(4000, 4)
    with torch.no_grad():
        greedy = q_network(obs).argmax(1).numpy()

    def act(epsilon):
        if not on_device:
            return MODULES[name].epsilon_greedy(q_network, obs.numpy(), epsilon, 3, "cpu")
        with torch.no_grad():
            return twin.device_epsilon_greedy(q_network, obs, torch.tensor(epsilon)).numpy()

    np.testing.assert_array_equal(act(0.0), greedy)
    # a random action differs from the greedy one with probability epsilon * (1 - 1/3); sd ~0.007 at 4000 draws
    for epsilon in (0.3, 1.0):
        actions = act(epsilon)
        assert abs((actions != greedy).mean() - epsilon * 2 / 3) < 0.03, epsilon
        assert set(actions.tolist()) == {0, 1, 2}
    assert abs(np.bincount(act(1.0), minlength=3) / 4000 - 1 / 3).max() < 0.03


def test_twin_policy_step_compiles_whole_and_epsilon_changes_recompile_nothing():
    torch.manual_seed(0)
    q_network = twin.QNetwork(4, 2)
    obs = torch.randn(1, 4)
    policy = torch.compile(twin.device_epsilon_greedy, fullgraph=True)
    epsilon = torch.tensor(1.0)
    with torch.no_grad(), torch._inductor.config.patch(fallback_random=True):
        for step, value in enumerate([1.0, 0.7, 0.05, 0.0]):
            epsilon.fill_(value)  # written in place, as the script does
            torch.manual_seed(step)
            want = twin.device_epsilon_greedy(q_network, obs, epsilon)
            torch.manual_seed(step)
            with torch._dynamo.config.patch(error_on_recompile=step > 0):
                got = policy(q_network, obs, epsilon)
            assert torch.equal(got, want) and got.dtype == torch.long and got.shape == (1,)
        assert policy(q_network, obs, epsilon).item() == q_network(obs).argmax(1).item()  # epsilon 0: greedy


# ---------------------------------------------------------------- update


def random_batch(n, seed, obs_dim=4, n_actions=2):
    g = torch.Generator().manual_seed(seed)
    return dict(
        obs=torch.randn(n, obs_dim, generator=g),
        actions=torch.randint(0, n_actions, (n,), generator=g),
        rewards=torch.rand(n, generator=g),
        next_obs=torch.randn(n, obs_dim, generator=g),
        terminations=(torch.rand(n, generator=g) < 0.2).float(),
    )


def filled_buffer(capacity, filled, seed):
    """The twin's replay memory as its sampler reads it: tensors over the host buffer's arrays."""
    buffer = twin.make_buffer(capacity, 4)
    twin.buffer_add(buffer, 0, as_input(random_batch(filled, seed)))
    return {key: torch.from_numpy(value) for key, value in buffer.items()}


# aot_eager in CI: Dynamo's graphs and AOTAutograd's functionalized update, run with eager's kernels. Inductor's
# kernels, which the twin's --compile runs in this file build and run, are compared with -m slow (19 s in a cold CI run)
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_twin_update_equals_eager_update(backend):
    """Same init, same batches: the eager update (float lr) and the twin's compiled update give the same losses and
    parameters; the target network is read, never written. The scripts never change their lr, but the compiled update
    stays exact and recompiles nothing with a tensor lr changed in place between calls (a schedule would do that)."""
    torch.manual_seed(0)
    q_e, target_e = eager.QNetwork(4, 2), eager.QNetwork(4, 2)
    q_t, target_t = copy.deepcopy(q_e), copy.deepcopy(target_e)
    initial = copy.deepcopy(q_e.state_dict())
    opt_e = torch.optim.Adam(q_e.parameters(), lr=2.5e-4)
    opt_t = torch.optim.Adam(q_t.parameters(), lr=torch.tensor(2.5e-4))
    compiled = torch.compile(twin.update, backend=backend)
    for step in range(4):
        batch = random_batch(128, step)
        want = eager.update(q_e, target_e, opt_e, batch, 0.99)
        with torch._dynamo.config.patch(error_on_recompile=step > 0):
            got = compiled(q_t, target_t, opt_t, batch, 0.99)
        assert got.shape == (2,)  # one stacked output: [TD loss, mean Q]
        torch.testing.assert_close(got, torch.stack(want), rtol=1e-5, atol=1e-6)
        opt_e.param_groups[0]["lr"] = 1e-3 / (step + 1)
        opt_t.param_groups[0]["lr"].fill_(1e-3 / (step + 1))
    for key, value in q_e.state_dict().items():
        torch.testing.assert_close(q_t.state_dict()[key], value, rtol=1e-5, atol=1e-6, msg=key)
        assert not torch.equal(value, initial[key]), f"{key} was not updated"
    torch.testing.assert_close(target_t.state_dict(), target_e.state_dict(), rtol=0, atol=0)


def test_compiled_train_step_equals_eager_and_graph_breaks_are_pytorchs_own():
    """train_step (sample on the device, target, loss, Adam) through Dynamo with a counting backend (inductor's numerics
    are checked by the update test above): the same draws give the same parameters as the twin's eager train_step; no
    recompile as the fill level and the lr change; the only graph breaks are those PyTorch places itself:
    Optimizer.zero_grad (skipped by Dynamo, once in each of the two frames), Tensor.backward, and the two
    torch._dynamo.graph_break() calls in torch/optim/optimizer.py."""
    from torch._dynamo.testing import CompileCounter
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    q, target = twin.QNetwork(4, 2), twin.QNetwork(4, 2)
    q_c, target_c = copy.deepcopy(q), copy.deepcopy(target)
    opt = torch.optim.Adam(q.parameters(), lr=torch.tensor(2.5e-4))
    opt_c = torch.optim.Adam(q_c.parameters(), lr=torch.tensor(2.5e-4))
    buffer = filled_buffer(300, 300, seed=5)
    torch._dynamo.reset()
    counters.clear()
    backend = CompileCounter()
    compiled = torch.compile(twin.train_step, backend=backend)
    for step, filled in enumerate([150, 151, 300, 900]):
        count = torch.tensor(filled)
        torch.manual_seed(step)
        want = twin.train_step(q, target, opt, buffer, count, 64, 0.99)
        torch.manual_seed(step)
        with torch._dynamo.config.patch(error_on_recompile=step > 0):
            got = compiled(q_c, target_c, opt_c, buffer, count, 64, 0.99)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        for o in (opt, opt_c):
            o.param_groups[0]["lr"].fill_(1e-3)
    torch.testing.assert_close(q_c.state_dict(), q.state_dict(), rtol=1e-5, atol=1e-6)
    breaks = {}
    for reason, n in counters["graph_break"].items():
        kind = next(
            k for k in ("Optimizer.zero_grad", "Tensor.backward()", "torch._dynamo.graph_break()") if k in reason
        )
        breaks[kind] = breaks.get(kind, 0) + n
    assert breaks == {"Optimizer.zero_grad": 2, "Tensor.backward()": 1, "torch._dynamo.graph_break()": 2}, breaks
    assert backend.frame_count == 4, backend.frame_count  # the graphs between those breaks, compiled once each


@pytest.mark.parametrize("name", SCRIPTS)
def test_update_target_copies_at_tau_1_and_mixes_below(name):
    mod = MODULES[name]
    torch.manual_seed(0)
    q, target = mod.QNetwork(4, 2), mod.QNetwork(4, 2)
    before = copy.deepcopy(target.state_dict())
    mod.update_target(target, q, 0.25)
    for key, value in target.state_dict().items():
        torch.testing.assert_close(value, 0.25 * q.state_dict()[key] + 0.75 * before[key], msg=key)
    mod.update_target(target, q, 1.0)
    for key, value in target.state_dict().items():
        assert torch.equal(value, q.state_dict()[key]), key  # exactly, CleanRL's hard copy


def test_compiled_twin_update_target_is_one_graph():
    torch.manual_seed(0)
    q, target = twin.QNetwork(4, 2), twin.QNetwork(4, 2)
    update_target = torch.compile(twin.update_target, fullgraph=True)
    update_target(target, q, 1.0)
    assert all(torch.equal(a, b) for a, b in zip(target.parameters(), q.parameters()))


def test_twin_step_functions_run_on_the_meta_device_without_host_reads():
    """Issue 16 item 4: the twin's per-step functions (policy step, upload of the host buffer's new rows, sampler,
    target, the update with capturable Adam as on CUDA, the target-network update) on the `meta` device: a meta tensor
    has no data, so a host
    read raises, and a tensor made without device= lands on the CPU and fails to mix with them. Nothing is read to
    the host, and every output is on meta. Every function runs (each op has a meta kernel)."""
    import importlib

    from gpu_standin import host_reads

    meta = torch.device("meta")
    optimizer_modules = [importlib.import_module(f"torch.optim.{name}") for name in ("optimizer", "adam")]
    supported = optimizer_modules[0]._get_capturable_supported_devices
    with_meta = lambda supports_xla=True: [*supported(supports_xla), "meta"]  # noqa: E731
    q, target = twin.QNetwork(4, 2).to(meta), twin.QNetwork(4, 2).to(meta)
    with host_reads(root=Path(twin.__file__).parent) as reads, contextlib.ExitStack() as stack:
        for module in optimizer_modules:  # capturable Adam (its step count a device tensor) on meta, as on CUDA
            stack.enter_context(mock.patch.object(module, "_get_capturable_supported_devices", with_meta))
        optimizer = torch.optim.Adam(q.parameters(), lr=2.5e-4, capturable=True)
        pinned = filled_buffer(64, 70, seed=0)
        buffer = {key: torch.empty_like(value, device=meta) for key, value in pinned.items()}
        count = torch.zeros((), dtype=torch.long, device=meta).fill_(twin.upload(buffer, pinned, 60, 70))
        with torch.no_grad():
            actions = twin.device_epsilon_greedy(q, torch.zeros(3, 4, device=meta), torch.ones((), device=meta))
        batch = twin.buffer_sample(buffer, count, 32)
        td_target = twin.dqn_target(batch["rewards"], target(batch["next_obs"]), batch["terminations"], 0.99)
        stats = twin.train_step(q, target, optimizer, buffer, count, 32, 0.99)
        twin.update_target(target, q, 1.0)
    outputs = [actions, count, *batch.values(), td_target, stats, *optimizer.state[q.network[0].weight].values()]
    assert all(t.device == meta for t in outputs), [t.device for t in outputs]
    assert stats.shape == (2,) and count.shape == () and batch["obs"].shape == (32, 4)
    assert not reads, reads


# ---------------------------------------------------------------- scripts as subprocesses


def check_run(name, proc, lines, tmp_path, flags=()):
    assert proc.returncode == 0, proc.stderr[-3000:]
    [line] = lines
    assert_finite_results_line(line, name)
    assert_summary_matches(proc.stdout, line, tmp_path / "results.jsonl")
    assert line["compile"] == ("--compile" in flags) and line["cudagraphs"] is False
    rows = list(csv.reader((tmp_path / line["run_name"] / "returns.csv").open()))
    assert rows[0] == ["step", "wall_s", "return"] and len(rows) - 1 == line["episodes"]
    return line


VARIANTS = [(EAGER, []), (TWIN, []), (TWIN, ["--compile"])]


@pytest.mark.parametrize("name,flags", VARIANTS, ids=["eager", "twin", "twin-compile"])
def test_smoke_cartpole(name, flags, tmp_path):
    proc, lines = run_script(name, *TINY, *flags, tmp_path=tmp_path)
    line = check_run(name, proc, lines, tmp_path, flags)
    assert line["env_id"] == "CartPole-v1" and line["mode"] == "train" and line["steps"] == 1000
    assert line["episodes"] > 10 and set(line["losses"]) == {"td_loss", "q_values"}
    # epsilon reached its end value at half the run and stayed there
    assert line["epsilon"] == pytest.approx(0.05)


@pytest.mark.parametrize("name", SCRIPTS)
def test_other_discrete_env_and_epsilon_mid_decay(name, tmp_path):
    """Acrobot-v1 with two envs; over the whole run epsilon is still decaying at the last step (999 of 1000 steps
    done at the last choice: 1 - 0.95 * 998 / 1000)."""
    args = ["--env-id", "Acrobot-v1", "--num-envs", "2", *TINY, "--exploration-fraction", "1.0"]
    proc, lines = run_script(name, *args, tmp_path=tmp_path)
    line = check_run(name, proc, lines, tmp_path)
    assert line["env_id"] == "Acrobot-v1" and line["steps"] == 1000
    assert line["epsilon"] == pytest.approx(1 - 0.95 * 998 / 1000)


@pytest.mark.parametrize("name", SCRIPTS)
def test_save_model_then_evaluate_checkpoint(name, tmp_path):
    proc, lines = run_script(name, *TINY, "--save-model", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    checkpoint_path = tmp_path / lines[0]["run_name"] / f"{name}.pt"
    assert not list(tmp_path.rglob("*.tmp")), "the temporary file was left behind"
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    assert checkpoint["args"]["env_id"] == "CartPole-v1"
    assert checkpoint["q_network"]["network.0.weight"].shape == (120, 4)

    proc, lines = run_script(name, "--eval-checkpoint", str(checkpoint_path), "--eval-episodes", "3", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = lines[-1]
    assert line["mode"] == "eval" and line["status"] == "ok" and line["env_id"] == "CartPole-v1"
    assert line["episodes"] == 3 and line["mean_return"] > 0 and line["steps"] > 0
    assert line["checkpoint"] == str(checkpoint_path) and line["total_timesteps"] == 0
    # the evaluation reports the checkpoint's folder and writes its return curve there (no new run folder)
    summary = assert_summary_matches(proc.stdout, line, tmp_path / "results.jsonl")
    assert (
        Path(summary["run_dir"]) == checkpoint_path.parent.resolve() and line["run_name"] == checkpoint_path.parent.name
    )
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [checkpoint_path.parent.name]
    rows = list(csv.reader((checkpoint_path.parent / "eval_returns.csv").open()))
    assert rows[0] == ["step", "wall_s", "return"] and len(rows) == 4
    returns = [float(row[2]) for row in rows[1:]]
    assert line["mean_return"] == pytest.approx(sum(returns) / 3) and int(rows[-1][0]) == line["steps"]


BAD_INPUTS = [
    (["--env-id", "Pendulum-v1"], "--env-id"),  # continuous actions
    (["--env-id", "FrozenLake-v1"], "--env-id"),  # discrete observations
    (["--env-id", "NoSuchEnv-v0"], "--env-id"),
    (["--env-id", "Breakout-v5"], "--env-id"),  # an Atari (envpool) id
    (["--batch-size", "20000"], "--batch-size"),  # larger than the 10k buffer
    (["--total-timesteps", "5000"], "--learning-starts"),  # learning starts at 10k
    (["--buffer-size", "0"], "--buffer-size"),
    (["--num-envs", "200", "--buffer-size", "150", "--total-timesteps", "400"], "--num-envs"),  # writes over itself
    (["--num-envs", "0"], "--num-envs"),
    (["--train-frequency", "-1"], "--train-frequency"),
    (["--exploration-fraction", "0"], "--exploration-fraction"),
    (["--learning-rate", "-1"], "--learning-rate"),
]


# the whole command-line path for a few (a subprocess costs seconds); every case is checked in-process below
SUBPROCESS_CASES = [
    (EAGER, *BAD_INPUTS[0]),
    (EAGER, *BAD_INPUTS[4]),
    (EAGER, *BAD_INPUTS[5]),
    (TWIN, ["--cudagraphs"], "--cudagraphs"),
    (TWIN, ["--learning-rate", "-1"], "--learning-rate"),
]


@pytest.mark.parametrize("name,args,flag", SUBPROCESS_CASES, ids=[f"{n} {' '.join(a)}" for n, a, _ in SUBPROCESS_CASES])
def test_bad_input_exits_2_with_one_line(name, args, flag, tmp_path):
    check_bad_input(name, args, flag, tmp_path)


@pytest.mark.parametrize("name", SCRIPTS)
def test_results_file_that_is_a_folder_or_under_a_file_exits_2(name, tmp_path):
    """The whole command-line path (run_script names its own --results-file first; the later flag wins)."""
    (tmp_path / "a_file").write_text("")
    for results in (tmp_path, tmp_path / "a_file" / "results.jsonl"):
        check_bad_input(name, ["--results-file", str(results)], "--results-file", tmp_path)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"] and not (tmp_path / "a_file").read_text()


class ImageEnv(gym.Env):
    """Discrete actions, image observations: the wrong family for an MLP (gymnasium registers no such env without
    extras, so the test registers one)."""

    observation_space = gym.spaces.Box(0, 255, (84, 84, 3), np.uint8)
    action_space = gym.spaces.Discrete(4)


@pytest.mark.parametrize("name,flags", VARIANTS, ids=["eager", "twin", "twin-compile"])
@pytest.mark.parametrize(
    "args,flag", [*BAD_INPUTS, (["--env-id", "TestImageEnv-v0"], "--env-id"), (["--cudagraphs"], "--cudagraphs")]
)
def test_main_rejects_bad_input(name, flags, args, flag, capsys, tmp_path):
    """Every script and variant in-process (a subprocess each would only repeat the runs above): main() stops before
    any work, the twin with --compile too, and writes no results line."""
    if name == EAGER and args == ["--cudagraphs"]:
        pytest.skip("the eager script has no --cudagraphs flag")
    if "TestImageEnv-v0" not in gym.registry:
        gym.register("TestImageEnv-v0", entry_point=ImageEnv)
    results = tmp_path / "results.jsonl"
    cli = tyro.cli(MODULES[name].Args, args=[*args, *flags, "--no-cuda", "--results-file", str(results)])
    assert getattr(cli, "compile", False) is ("--compile" in flags)
    with pytest.raises(SystemExit) as exit_info:
        MODULES[name].main(cli)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"{name}.py: error: ") and flag in err, err
    if "TestImageEnv-v0" in args:
        assert "(84, 84, 3)" in err
    assert not list(tmp_path.iterdir()), "a bad input leaves no results line and no run folder"


@pytest.mark.parametrize("name,flags", VARIANTS, ids=["eager", "twin", "twin-compile"])
@pytest.mark.parametrize("where", ["a folder", "under a file"])
def test_main_rejects_bad_results_file(name, flags, where, capsys, tmp_path):
    """--results-file naming a folder, or a path under a file: one line, exit 2, before any work; nothing written."""
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    results = tmp_path if where == "a folder" else blocker / "results.jsonl"
    cli = tyro.cli(MODULES[name].Args, args=[*flags, "--no-cuda", "--results-file", str(results)])
    with pytest.raises(SystemExit) as exit_info:
        MODULES[name].main(cli)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"{name}.py: error: --results-file {results}"), err
    assert [p.name for p in tmp_path.iterdir()] == ["a_file"] and blocker.read_text() == ""


@pytest.mark.parametrize("name", SCRIPTS)
def test_huge_learning_rate_stops_the_run_as_diverged(name, tmp_path):
    proc, lines = run_script(name, *TINY, "--learning-rate", "1e30", tmp_path=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    [line] = lines  # run_script parsed it as strict JSON
    assert line["status"] == "diverged", line
    assert line["message"].startswith("loss diverged at step ") and line["message"] in proc.stderr
    step = int(line["message"].split("step ")[1].split(":")[0])
    assert 200 < step <= 1000 and line["steps"] == step
    assert None in line["losses"].values() or not all(map(math.isfinite, line["losses"].values()))
    assert_summary_matches(proc.stdout, line, tmp_path / "results.jsonl")


@pytest.mark.parametrize("name,flags", [(EAGER, []), (TWIN, ["--compile"])], ids=["eager", "twin-compile"])
def test_same_seed_same_numbers(name, flags, tmp_path):
    """Same seed, same machine, on CPU: the same losses, episodes and return curve twice (the twin compiled; its
    second run finds the first one's kernels in inductor's cache)."""
    for d in "ab":
        (tmp_path / d).mkdir()
    runs = [run_script(name, *TINY, "--seed", "7", *flags, tmp_path=tmp_path / d) for d in "ab"]
    for proc, _ in runs:
        assert proc.returncode == 0, proc.stderr[-3000:]
    (_, [first]), (_, [second]) = runs
    assert first["episodes"] > 10 and first["compile"] is second["compile"] is ("--compile" in flags)
    for key in ("losses", "mean_return", "episodes", "steps", "epsilon"):
        assert first[key] == second[key], key
    curves = [(tmp_path / d / line["run_name"] / "returns.csv").read_text() for d, line in zip("ab", (first, second))]
    assert [row.split(",")[::2] for row in curves[0].splitlines()] == [
        row.split(",")[::2] for row in curves[1].splitlines()
    ], "the step and return columns differ"


# ---------------------------------------------------------------- the run in this process: reads, steps/s, logs

# the host reads of a tiny twin run (tests/regression.py's DQN flags: 1000 steps, learning after step 200, an update
# every 10 steps, a log point every 100), line by line: a new read fails here, naming its line
STEP = "actions = policy(obs_t, epsilon_t.fill_(epsilon)).cpu().numpy()"
CPU_STEP = (
    "tolist at dqn_torchcompile.py: greedy = q_network(torch.as_tensor(obs, dtype=torch.float32, device=device))"
    ".argmax(dim=1).tolist()"
)
HOST_READS = {
    # the actions, once per env step, to step the env (.numpy() of the host copy is counted too; it reads no GPU)
    f"cpu at dqn_torchcompile.py: {STEP}": 1000,
    f"numpy at dqn_torchcompile.py: {STEP}": 1000,
    # the logged losses (one stacked tensor) in one read per log point with an update behind it: 300, ..., 900, last
    "tolist at bookkeeping.py: values = torch.stack([v.detach().float() for v in values]).tolist()": 8,
}
# with --compile the compiler reads the 0-d int64 count as it traces the update, when it compiles (3 times): it
# reads 0-d CPU tensors only (fake_tensor.py specializes on their value), so not on a GPU
COMPILE_READS = {
    "item at dqn_torchcompile.py: stats = train_fn(count_t.fill_(count))  # trick: no .item(): the losses stay on the "
    "device": 3
}


def pinned_host_reads(flags):
    """The host reads of a twin run at the tiny regression flags and these flags (tests/test_gpu_path.py counts its
    --cudagraphs and --compile --cudagraphs runs)."""
    want = {**HOST_READS, **(COMPILE_READS if "--compile" in flags else {})}
    if "--cudagraphs" not in flags:  # on a CPU the host policy: one read per greedy step (Python's coins, any machine)
        want = {key: n for key, n in want.items() if STEP not in key} | {CPU_STEP: 728}
    return want


def test_twin_host_reads_are_the_pinned_ones(tmp_path):
    """Issue 16 item 3: the twin's main() at the tiny regression flags, in this process (tests/gpu_standin.py: Adam
    capturable as on CUDA); the runs with --cudagraphs (the device policy CUDA runs) and --compile --cudagraphs are
    counted in tests/test_gpu_path.py."""
    from gpu_standin import host_reads, run_main
    from regression import DQN

    with host_reads() as reads:
        line, _ = run_main(twin, list(DQN), tmp_path)
    assert line["status"] == "ok" and line["steps"] == 1000
    assert dict(reads) == pinned_host_reads([])


def in_process(name, flags, tmp_path):
    """main() of a script in this process on the CPU; returns its results line."""
    results = tmp_path / "results.jsonl"
    MODULES[name].main(tyro.cli(MODULES[name].Args, args=[*flags, "--no-cuda", "--results-file", str(results)]))
    [line] = [json.loads(text) for text in results.read_text().splitlines()]
    return line


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("burnin,num_envs", [(None, 1), (0, 1), (7, 2)], ids=["default", "0", "7-2envs"])
def test_steps_per_second_leave_out_the_start_and_the_burnin(name, burnin, num_envs, tmp_path, monkeypatch):
    """--measure-burnin N: "iterations after learning starts left out of steps/s". A fake clock: every iteration
    takes 1 s, and the first update (where the twin compiles and captures) 1000 s more. The window opens N iterations
    after the first learning iteration (an update every iteration here), so with N >= 1 steps/s is exactly num_envs
    per second; with N = 0 the slow first update is in it."""
    from types import SimpleNamespace

    from leanrl import bookkeeping as bk

    clock, runs, mod = SimpleNamespace(now=1000.0), [], MODULES[name]
    monkeypatch.setattr(bk, "time", SimpleNamespace(time=lambda: clock.now))
    tick, update = bk.Run.tick, mod.update

    def timed_tick(run, step):
        runs.append(run)
        clock.now += 1.0
        tick(run, step)

    def slow_first_update(*args, **kwargs):
        if not hasattr(clock, "first_update"):
            clock.now += 1000.0
            clock.first_update = runs[-1].ticks  # iterations done before it: the ones before learning starts
        return update(*args, **kwargs)

    monkeypatch.setattr(bk.Run, "tick", timed_tick)
    monkeypatch.setattr(mod, "update", slow_first_update)
    flags = ["--learning-starts", "201", "--total-timesteps", "600", "--train-frequency", "1"]
    flags += ["--num-envs", str(num_envs)] + ([] if burnin is None else ["--measure-burnin", str(burnin)])
    line = in_process(name, flags, tmp_path)
    run, n = runs[-1], 201 // num_envs + 1  # n: the iterations before learning starts (i * num_envs <= 201)
    burnin = mod.Args.measure_burnin if burnin is None else burnin
    assert clock.first_update == n and run.burnin == n + burnin
    assert run.mark[1] == (n + burnin) * num_envs  # the window opens at this step
    assert line["steps"] == 600 // num_envs * num_envs
    if burnin == 0:
        assert line["sps"] < 0.5 * num_envs  # the slow update counted
    else:
        assert line["sps"] == pytest.approx(num_envs)


@pytest.mark.parametrize("name", SCRIPTS)
def test_track_logs_cleanrls_keys_every_100_steps(name, tmp_path, fake_wandb):
    """Issue 17 item 5: with --track, CleanRL's dqn.py keys (losses/td_loss, losses/q_values, charts/SPS every 100
    steps once learning, the episodes' charts/episodic_return and charts/episodic_length), the last losses those of
    the results line."""
    line = in_process(name, [*TINY, "--track"], tmp_path)
    assert fake_wandb.keys() == {
        "losses/td_loss",
        "losses/q_values",
        "charts/SPS",
        "charts/episodic_return",
        "charts/episodic_length",
    }
    logged = [(step, data) for step, data in fake_wandb.logs if "losses/td_loss" in data]
    # log points after iterations 300, 400, ..., 900 (the first update is at iteration 210) and the last one
    assert [step for step, _ in logged] == [301, 401, 501, 601, 701, 801, 901, 1000]
    assert all(set(data) == {"losses/td_loss", "losses/q_values", "charts/SPS"} for _, data in logged)
    assert logged[-1][1]["losses/td_loss"] == line["losses"]["td_loss"]
    assert logged[-1][1]["losses/q_values"] == line["losses"]["q_values"]
    assert all(math.isfinite(data["charts/SPS"]) for _, data in logged) and fake_wandb.finished


# ---------------------------------------------------------------- learning
# CartPole-v1: the best return is 500; a random policy gets about 22.


def learn(name, flags, steps, seed, tmp_path):
    args = ["--total-timesteps", str(steps), "--seed", str(seed), *flags]
    proc, lines = run_script(name, *args, tmp_path=tmp_path, timeout=3600)
    return check_run(name, proc, lines, tmp_path, flags)


# CI budget: CleanRL's settings but 20k steps with learning from step 1000 (epsilon reaches 0.05 at 10k)
QUICK = ["--learning-starts", "1000"]


# CI learns with the twin; the eager script's run is `-m slow` (tests/regression.py pins its numbers for a seed,
# and the twin-equals-eager tests tie the twin's updates to it)
@pytest.mark.parametrize(
    "name,flags",
    [pytest.param(EAGER, [], marks=pytest.mark.slow), (TWIN, ["--compile"])],
    ids=["eager", "twin-compile"],
)
def test_learns_cartpole_in_20k_steps(name, flags, tmp_path):
    """Measured on this budget, mean of the last 100 episodes: eager 119.3, 98.3, 116.7 and twin --compile 108.5,
    92.5, 127.4 with its exact integer sampler (seeds 1, 2, 3; 2-core AMD EPYC, shared and loaded: 33-69 s a run). The
    bar, 60, is nearly 3x a random policy's 22 and well under every measured seed."""
    line = learn(name, [*QUICK, *flags], 20000, 1, tmp_path)
    assert line["mean_return"] >= 60, line["mean_return"]


def first_reach(run_dir, bar, window=100):
    """(step, mean) where the mean of the last `window` episodic returns first reaches bar, else (None, best mean)."""
    rows = list(csv.DictReader((run_dir / "returns.csv").open()))
    returns, best = [float(row["return"]) for row in rows], 0.0
    for i in range(window - 1, len(rows)):
        mean = sum(returns[i - window + 1 : i + 1]) / window
        if mean >= bar:
            return int(rows[i]["step"]), mean
        best = max(best, mean)
    return None, best


@pytest.mark.slow
@pytest.mark.parametrize("name,flags", [(EAGER, []), (TWIN, ["--compile"])], ids=["eager", "twin-compile"])
def test_reaches_475_on_cartpole_within_500k_steps(name, flags, tmp_path):
    """The issue's bar, CleanRL's defaults: the mean of the last 100 episodes reaches 475 within 500k steps.
    Measured (seed 1, 2-core AMD EPYC shared with other jobs, one torch thread): eager first reached 475 at step
    268,406 (peak 500.0 at 423k; 454.4 over the last 100 episodes at 500k, DQN's late dips), 968 s for the 500k
    steps; twin --compile first reached 475 at step 250,448 and ended at 500.0, 960 s."""
    line = learn(name, flags, 500000, 1, tmp_path)
    step, mean = first_reach(tmp_path / line["run_name"], 475)
    assert step is not None and step <= 500000, f"best mean of 100 episodes: {mean}"
