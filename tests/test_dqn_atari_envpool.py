"""DQN Atari (envpool): the frame store against a real env, math against float64 references, twin agreement,
the scripts end to end on CPU."""

import copy
import math
import re
import sys
from pathlib import Path

import envpool
import numpy as np
import pytest
import torch
from conftest import (
    args_from_flags,
    assert_finite_results_line,
    assert_main_exits_2_with_one_line,
    assert_summary_matches,
    load_script,
    main_in_process,
    read_curve,
    run_script,
)
from gpu_standin import host_reads, run_main
from hypothesis import given, settings
from hypothesis import strategies as st
from regression import PAIRS

from leanrl import bookkeeping as bk

EAGER, TWIN = "dqn_atari_envpool", "dqn_atari_envpool_torchcompile"
SCRIPTS = (EAGER, TWIN)
# 600 steps, learning from step 200, one update every 4 steps: 100 updates of batch 8 (the CNN is slow on a CPU)
TINY = ("--buffer-size", "2000", "--learning-starts", "200", "--batch-size", "8", "--measure-burnin", "1")
TINY += ("--target-network-frequency", "100", "--total-timesteps")


@pytest.fixture(scope="module")
def mods():
    return {name: load_script(name) for name in SCRIPTS}


# ---------------------------------------------------------------- DQN target and epsilon


def dqn_target_reference(rewards, next_q, terminations, gamma):
    """r + gamma * max_a Q(s', a), the bootstrap dropped only where the episode terminated (not truncated)."""
    out = []
    for q_row, r, term in zip(next_q.double().tolist(), rewards.double().tolist(), terminations.tolist()):
        best = q_row[0]
        for q in q_row[1:]:
            best = max(best, q)
        out.append(r if term else r + gamma * best)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("batch,n_actions", [(1, 4), (32, 4), (33, 18), (256, 6)])
def test_dqn_target_matches_float64_reference(mods, name, batch, n_actions):
    g = torch.Generator().manual_seed(batch * 100 + n_actions)
    next_q = torch.randn(batch, n_actions, generator=g) * 3
    rewards = torch.randint(-1, 2, (batch,), generator=g).float()
    terminations = torch.rand(batch, generator=g) < 0.3
    if batch > 1:
        terminations[0], terminations[1] = True, False  # a terminated and a truncated (or running) transition
    got = mods[name].dqn_target(rewards, next_q, terminations, 0.99)
    want = dqn_target_reference(rewards, next_q, terminations, 0.99)
    assert got.dtype == torch.float32 and got.shape == (batch,)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
    if batch > 1:  # the terminated one is the bare reward; the other one bootstraps from its best next action
        # floats on both sides: pytest.approx given a 0-d tensor and a tolerance fails in pytest >= 9.2
        bootstrapped = float(rewards[1]) + 0.99 * float(next_q[1].max())
        assert float(got[0]) == float(rewards[0]) and float(got[1]) == pytest.approx(bootstrapped, abs=1e-5)


def test_twin_target_equals_the_eager_one(mods):
    g = torch.Generator().manual_seed(5)
    inputs = (torch.randn(64, generator=g), torch.randn(64, 4, generator=g), torch.rand(64, generator=g) < 0.5)
    torch.testing.assert_close(mods[TWIN].dqn_target(*inputs, 0.97), mods[EAGER].dqn_target(*inputs, 0.97))


@pytest.mark.parametrize("name", SCRIPTS)
def test_epsilon_decays_linearly_over_its_fraction_then_stays(mods, name):
    schedule = mods[name].linear_schedule
    duration = 0.1 * 10_000_000
    for t, want in [(0, 1.0), (250_000, 0.7525), (500_000, 0.505), (990_000, 0.0199), (1_000_000, 0.01)]:
        assert schedule(1.0, 0.01, duration, t) == pytest.approx(want, abs=1e-9), t
    assert schedule(1.0, 0.01, duration, 5_000_000) == 0.01
    assert schedule(1.0, 0.05, 500, 250) == pytest.approx(0.525)
    values = [schedule(1.0, 0.01, 1000, t) for t in range(0, 1001, 10)]
    assert all(a > b for a, b in zip(values, values[1:])), "epsilon must decrease at every step of its fraction"


# ---------------------------------------------------------------- the frame store against envpool


def drive_breakout(module, num_envs, capacity, steps, seed):
    """Random play, every step written to the store as the scripts write it. Returns the store, the env's stacks,
    the firsts and step data per env, and per transition whether it is envpool's reset step after a done one."""
    env = envpool.make(
        "Breakout-v5", env_type="gym", num_envs=num_envs, episodic_life=True, reward_clip=True, seed=seed
    )
    store = module.new_frame_store(num_envs, capacity)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset()
    stacks, firsts = [obs.copy()], [np.ones(num_envs, bool)]
    actions, rewards, terms, dones = [], [], [], []
    zeros = torch.zeros(num_envs)
    module.store_add(store, torch.as_tensor(obs[:, -1]), zeros == 0, zeros.long(), zeros, zeros.bool())
    events = {"lives lost": 0, "game overs": 0}
    game_over = np.zeros(num_envs, bool)
    for _ in range(steps):
        action = rng.integers(0, 4, num_envs)
        obs, reward, term, trunc, info = env.step(action)
        first = info["elapsed_step"] == 0
        assert np.array_equal(first, game_over), "a game begins right after a game over (or truncation), only there"
        game_over = info["terminated"].astype(bool) | trunc
        events["game overs"] += int(game_over.sum())
        events["lives lost"] += int((term & ~game_over).sum())
        module.store_add(
            store,
            torch.as_tensor(obs[:, -1]),
            torch.as_tensor(first),
            torch.as_tensor(action),
            torch.as_tensor(reward, dtype=torch.float32),
            torch.as_tensor(term),
        )
        stacks.append(obs.copy())
        firsts.append(first)
        actions.append(action)
        rewards.append(reward)
        terms.append(term)
        dones.append(term | trunc)
    env.close()
    dones = np.stack(dones, 1)
    reset_steps = np.zeros_like(dones)
    reset_steps[:, 1:] = dones[:, :-1]  # transition a follows a done one (a lost life counts): envpool only resets
    return (
        store,
        np.stack(stacks, 1),
        np.stack(firsts, 1),
        (np.stack(actions, 1), np.stack(rewards, 1), np.stack(terms, 1)),
        reset_steps,
        events,
    )


@pytest.mark.parametrize("name", SCRIPTS)
def test_rebuilt_stacks_equal_the_envs_over_episode_ends_and_wraparound(mods, name):
    module = mods[name]
    num_envs, capacity, steps = 2, 2 * 150, 700
    store, stacks, firsts, (actions, rewards, terms), reset_steps, events = drive_breakout(
        module, num_envs, capacity, steps, seed=3
    )
    slots = store["frames"].shape[1]
    n = steps + 1
    assert int(store["count"]) == n and slots == capacity // num_envs + 4
    assert n > 4 * slots, "the ring must wrap around several times"
    assert events["game overs"] >= 2 and events["lives lost"] >= 6, events
    low = max(0, n - slots + 3)
    # the window holds reset steps after a game over (the next obs begins a game) and after a lost life (it does not)
    window_resets, window_firsts = reset_steps[:, low : n - 1], firsts[:, low + 1 : n]
    assert (window_resets & window_firsts).sum() >= 1 and (window_resets & ~window_firsts).sum() >= 2
    assert firsts[:, low + 1 : n].sum() == (window_resets & window_firsts).sum()
    for e in range(num_envs):  # every stack of the window equals the env's, also around episode ends and starts
        pos = torch.arange(low, n - 1)
        env = torch.full_like(pos, e)
        obs = module.stack_frames(store, env, pos).numpy()
        next_obs = module.stack_frames(store, env, pos + 1).numpy()
        for i, a in enumerate(pos.tolist()):
            np.testing.assert_array_equal(obs[i], stacks[e, a], err_msg=f"obs env {e} step {a}")
            np.testing.assert_array_equal(next_obs[i], stacks[e, a + 1], err_msg=f"next obs env {e} step {a}")
            assert store["actions"][e, a % slots] == actions[e, a]
            assert store["rewards"][e, a % slots] == rewards[e, a]
            assert store["terminations"][e, a % slots] == terms[e, a]

    # the sampler draws every transition of the window but envpool's reset steps, whose action had no effect
    torch.manual_seed(0)
    env, pos = module.sample_indices(store, 20_000)
    want = {(e, a) for e in range(num_envs) for a in range(low, n - 1) if not reset_steps[e, a]}
    assert set(zip(env.tolist(), pos.tolist())) == want

    # sample() returns exactly these stacks for the transitions that sample_indices draws
    torch.manual_seed(0)
    env, pos = module.sample_indices(store, 64)
    torch.manual_seed(0)
    batch = module.sample(store, 64)
    for i, (e, a) in enumerate(zip(env.tolist(), pos.tolist())):
        assert low <= a <= n - 2 and not reset_steps[e, a]
        np.testing.assert_array_equal(batch["obs"][i].numpy(), stacks[e, a])
        np.testing.assert_array_equal(batch["next_obs"][i].numpy(), stacks[e, a + 1])
        assert batch["actions"][i] == actions[e, a] and batch["terminations"][i] == terms[e, a]
        assert batch["rewards"][i] == rewards[e, a]


def test_envpool_ignores_the_action_of_the_step_after_a_lost_life():
    """Why the sampler skips that step: two copies of a game given different actions there stay the same (reward 0,
    not done, the step count unchanged); the step after it does obey its action."""
    copies = [
        envpool.make("Breakout-v5", env_type="gym", num_envs=1, episodic_life=True, reward_clip=True, seed=1)
        for _ in range(2)
    ]
    obs = [game.reset()[0] for game in copies]
    np.testing.assert_array_equal(*obs)
    lives_lost = 0
    for _ in range(2000):
        steps = [game.step(np.array([1])) for game in copies]  # FIRE: the ball is served, the paddle stays
        np.testing.assert_array_equal(steps[0][0], steps[1][0])
        _, _, term, _, info = steps[0]
        if term[0] and not info["terminated"][0]:
            lives_lost += 1
            resets = [game.step(np.array([action])) for game, action in zip(copies, (2, 3))]  # RIGHT, LEFT
            for _, reward, term, trunc, reset_info in resets:
                assert reward[0] == 0 and not term[0] and not trunc[0]
                assert reset_info["elapsed_step"][0] == info["elapsed_step"][0]
            np.testing.assert_array_equal(resets[0][0], resets[1][0])
            after = [game.step(np.array([action])) for game, action in zip(copies, (2, 3))]
            assert not np.array_equal(after[0][0], after[1][0]), "the next step obeys its action"
            break
    assert lives_lost == 1
    for game in copies:
        game.close()


def test_envpool_stacks_behave_as_the_store_assumes():
    """A reset stack repeats its first frame 4 times; a lost life does not restart the stack."""
    env = envpool.make("Breakout-v5", env_type="gym", num_envs=1, episodic_life=True, reward_clip=True, seed=1)
    obs, _ = env.reset()
    assert all((obs[0, i] == obs[0, 3]).all() for i in range(3)) and obs[0, 3].any()
    lives_lost = 0
    for _ in range(300):
        prev = obs
        obs, _, term, _, info = env.step(np.array([1]))
        if info["elapsed_step"][0] == 0:
            assert all((obs[0, i] == obs[0, 3]).all() for i in range(3))
        else:
            np.testing.assert_array_equal(obs[0, :3], prev[0, 1:])
            lives_lost += int(term[0] and not info["terminated"][0])
    assert lives_lost >= 2
    env.close()


# ---------------------------------------------------------------- sampling: property test on a synthetic store


def fill(module, num_envs, capacity, writes, reset_prob, seed, life_prob=0.0):
    """Tiny 2x2 frames that hold their own absolute index: a stale (overwritten) frame would show.

    As envpool plays: a transition ends the game with probability reset_prob (terminated, or truncated one time in
    two) or a life with life_prob (terminated); the transition after a done one is a reset step, never done itself,
    and after a game's end its next obs begins a game. Returns the store, the firsts and the reset steps per env.
    """
    store = module.new_frame_store(num_envs, capacity, frame_shape=(2, 2))
    rng = np.random.default_rng(seed)
    firsts, terminations, reset_steps = (np.zeros((num_envs, writes), bool) for _ in range(3))
    firsts[:, 0] = True
    for a in range(writes - 1):
        draw = rng.random(num_envs)
        game_over = ~reset_steps[:, a] & (draw < reset_prob)
        life_lost = ~reset_steps[:, a] & (reset_prob <= draw) & (draw < reset_prob + life_prob)
        terminations[:, a] = (game_over & (rng.random(num_envs) < 0.5)) | life_lost
        reset_steps[:, a + 1] = game_over | life_lost
        if a + 2 < writes:
            firsts[:, a + 2] = game_over
    for a in range(writes):
        frames = torch.full((num_envs, 2, 2), a % 251, dtype=torch.uint8)
        zeros = torch.zeros(num_envs)
        done = torch.as_tensor(terminations[:, a - 1]) if a else zeros.bool()
        module.store_add(store, frames, torch.as_tensor(firsts[:, a]), zeros.long() + a, zeros + a, done)
    return store, firsts, reset_steps


@settings(max_examples=25, deadline=None)
@given(
    num_envs=st.integers(1, 3),
    per_env=st.integers(1, 40),
    writes=st.integers(2, 120),
    reset_prob=st.sampled_from([0.0, 0.05, 0.3]),
    life_prob=st.sampled_from([0.0, 0.1, 0.3]),
    seed=st.integers(0, 1000),
)
def test_samples_never_straddle_the_write_position(mods, num_envs, per_env, writes, reset_prob, life_prob, seed):
    for module in mods.values():
        store, firsts, reset_steps = fill(module, num_envs, num_envs * per_env, writes, reset_prob, seed, life_prob)
        slots = per_env + 4
        low, high = max(0, writes - slots + 3), writes - 2
        torch.manual_seed(seed)
        env, pos = module.sample_indices(store, 2000)
        assert ((pos >= low) & (pos <= high)).all(), (pos.min(), pos.max(), low, high)
        candidates = ~torch.as_tensor(reset_steps)[:, low : high + 1]
        if candidates.any(dim=1).all():  # every env's window holds a valid transition
            assert not torch.as_tensor(reset_steps)[env, pos].any(), "a reset step after a done one was sampled"
            if high - low < 20:  # every valid transition gets drawn
                assert set(zip(env.tolist(), pos.tolist())) == {
                    (e, a) for e in range(num_envs) for a in range(low, high + 1) if not reset_steps[e, a]
                }
        # the rebuilt stacks hold the right absolute frames: never an overwritten one
        obs = module.stack_frames(store, env, pos)[:, :, 0, 0].long()
        want = torch.stack([pos - 3 + k for k in range(4)], 1)
        for i in range(len(pos)):
            e, a = int(env[i]), int(pos[i])
            start = max(s for s in range(a + 1) if firsts[e, s])  # the game that obs a belongs to
            expect = want[i].clamp(min=start) % 251
            assert torch.equal(obs[i], expect), (e, a, obs[i], expect)


def test_sampling_is_uniform_over_envs_and_positions(mods):
    for module in mods.values():
        store, _, _ = fill(module, 2, 2 * 10, 100, 0.0, seed=1)
        torch.manual_seed(1)
        env, pos = module.sample_indices(store, 40_000)
        counts = torch.bincount(env * 100 + pos, minlength=200)[
            counts_index := torch.tensor([e * 100 + a for e in range(2) for a in range(89, 99)])
        ]
        assert counts.sum() == 40_000 and counts_index.numel() == 20
        assert (counts - 2000).abs().max() < 250  # binomial sd 44: 5.7 sd


@pytest.mark.parametrize("name", SCRIPTS)
def test_bytes_per_transition(mods, name):
    module = mods[name]
    store = module.new_frame_store(4, 4000)
    nbytes = sum(t.nbytes for t in store.values())
    # the memory check counts the store on the meta device (allocating nothing): what it counts is what is allocated
    counted = sum(t.nbytes for t in module.new_frame_store(4, 4000, "meta").values())
    assert nbytes == counted == 4 * (1000 + 4) * (84 * 84 + 14) + 8  # 4 envs of 1000 slots and 4 more
    assert 84 * 84 <= nbytes / 4000 <= 7100, nbytes / 4000  # one frame per transition, plus 14 bytes of step data
    # a 1M buffer: about 7 GB (full stacks of obs and next obs would take 28 GB)
    assert 7.05e9 < sum(t.nbytes for t in module.new_frame_store(1, 1_000_000, "meta").values()) < 7.1e9


# ---------------------------------------------------------------- twin: compiled update and policy


def one_transition_store(twin, seed):
    """A store whose only transition is a game's first step: every draw returns it (the compiled sampler's random
    numbers differ from eager ones, this batch does not). Returns the store and that batch."""
    g = torch.Generator().manual_seed(seed)
    frames = torch.randint(0, 256, (2, 1, 84, 84), generator=g, dtype=torch.uint8)
    action, reward = torch.randint(0, 4, (1,), generator=g), torch.randint(-1, 2, (1,), generator=g).float()
    terminations = torch.rand(1, generator=g) < 0.5
    store = twin.new_frame_store(1, 10)
    zeros = torch.zeros(1)
    twin.store_add(store, frames[0], zeros == 0, zeros.long(), zeros, zeros.bool())
    twin.store_add(store, frames[1], zeros == 1, action, reward, terminations)
    obs = frames[0].expand(4, 84, 84)
    batch = dict(
        obs=obs, actions=action, rewards=reward, next_obs=torch.cat([obs[1:], frames[1]]), terminations=terminations
    )
    return store, {
        key: value.expand(8, *value.shape) if key.endswith("obs") else value.expand(8) for key, value in batch.items()
    }


# aot_eager in CI: Dynamo's graphs and AOTAutograd's functionalized update, run with eager's kernels. Inductor's
# kernels, which the twin's --compile runs in this file build and run, are compared with -m slow (35 s in a cold CI run)
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_update_of_the_twin_equals_the_eager_update(mods, backend):
    """The twin's train_step (sample, target, loss, fused Adam, masked target copy) compiled, against the eager
    update() and CleanRL's target copy on the same batch; no recompile when the batch or the copy flag changes."""
    eager, twin = mods[EAGER], mods[TWIN]
    torch.manual_seed(0)
    q_network = eager.QNetwork(4)
    target_network = eager.QNetwork(4)
    twin_q, twin_target = copy.deepcopy(q_network), copy.deepcopy(target_network)
    eager_optimizer = torch.optim.Adam(q_network.parameters(), lr=1e-4)
    twin_optimizer = torch.optim.Adam(twin_q.parameters(), lr=1e-4, fused=True)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(twin.train_step, backend=backend)
    for call, copy_target in enumerate([False, True, False]):
        store, batch = one_transition_store(twin, seed=call)
        assert batch["obs"].shape == (8, 4, 84, 84) and batch["actions"].shape == (8,)
        want = eager.update(q_network, target_network, eager_optimizer, batch, 0.99)
        if copy_target:
            for target_network_param, q_network_param in zip(target_network.parameters(), q_network.parameters()):
                target_network_param.data.copy_(q_network_param.data)
        with torch._dynamo.config.patch(error_on_recompile=call > 0):
            got = compiled(twin_q, twin_target, twin_optimizer, store, 8, 0.99, torch.tensor(copy_target))
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        for name, module, twin_module in (("q", q_network, twin_q), ("target", target_network, twin_target)):
            for (key, value), twin_value in zip(module.state_dict().items(), twin_module.state_dict().values()):
                torch.testing.assert_close(twin_value, value, rtol=1e-4, atol=1e-6, msg=f"{name} {key} {call}")
    assert not torch.equal(q_network.network[0].weight, target_network.network[0].weight)
    # the only graph breaks are those torch.compile places around zero_grad(), backward() and the optimizer step
    breaks = dict(torch._dynamo.utils.counters["graph_break"])
    assert sum(breaks.values()) == GRAPH_BREAKS, breaks
    for reason in breaks:
        assert any(own in reason for own in PYTORCH_OWN_BREAKS), reason


# torch 2.13: zero_grad (2: traced once, then again after the restart), backward (1), Optimizer.step's own
# graph_break() (2) and the fused Adam kernel, which torch.compile leaves to eager (2)
GRAPH_BREAKS = 7
PYTORCH_OWN_BREAKS = ("Optimizer.zero_grad", "Tensor.backward()", "torch._dynamo.graph_break()", "fused optimizer")


def test_policy_step_compiles_whole_and_explores_as_told(mods):
    twin = mods[TWIN]
    torch.manual_seed(0)
    q_network = twin.QNetwork(4)
    obs = torch.randint(0, 256, (64, 4, 84, 84), dtype=torch.uint8)
    greedy = q_network(obs).argmax(dim=1)
    policy = torch.compile(lambda obs, eps: twin.epsilon_greedy(q_network, obs, eps), fullgraph=True)
    epsilon = torch.tensor(0.0)
    assert torch.equal(policy(obs, epsilon), greedy)
    with torch._dynamo.config.patch(error_on_recompile=True):
        epsilon.fill_(1.0)
        draws = torch.cat([policy(obs, epsilon) for _ in range(20)])
        assert set(draws.tolist()) == {0, 1, 2, 3} and (draws != greedy.repeat(20)).float().mean() > 0.6
        epsilon.fill_(0.5)
        draws = torch.cat([policy(obs, epsilon) for _ in range(20)])
        assert 0.5 < (draws == greedy.repeat(20)).float().mean() < 0.75  # 0.5 + 0.5 / 4


def test_sampler_compiles_whole(mods):
    twin = mods[TWIN]
    store, _, reset_steps = fill(twin, 2, 2 * 30, 150, 0.05, seed=4, life_prob=0.1)
    assert reset_steps[:, 150 - 34 + 3 : 149].sum() >= 4
    env, pos = torch.compile(twin.sample_indices, fullgraph=True)(store, 512)
    assert ((pos >= 150 - 34 + 3) & (pos <= 148)).all()
    assert not torch.as_tensor(reset_steps)[env, pos].any()
    stacks = torch.compile(twin.stack_frames, fullgraph=True)(store, env, pos)
    assert torch.equal(stacks, mods[EAGER].stack_frames(store, env, pos))


# ---------------------------------------------------------------- scripts end to end


@pytest.mark.parametrize("name,flags", [(EAGER, ()), (TWIN, ("--compile",))])
def test_smoke_tiny_budget(name, flags, tmp_path):
    proc, lines = run_script(name, *TINY, "600", *flags, "--save-model", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = lines
    assert_finite_results_line(line, name)
    assert_summary_matches(proc.stdout, line, tmp_path / "results.jsonl")
    assert line["steps"] == 600 and line["mode"] == "train" and line["buffer_device"] == "cpu"
    assert line["compile"] is ("--compile" in flags) and line["cudagraphs"] is False
    assert line["buffer_bytes"] == 2004 * (84 * 84 + 14) + 8
    curve = read_curve(line, tmp_path).splitlines()
    assert curve[0] == "step,wall_s,return" and len(curve) == line["episodes"] + 1 and line["episodes"] >= 1

    if name == EAGER:  # the checkpoint plays full games
        checkpoint = tmp_path / line["run_name"] / f"{name}.pt"
        proc, lines = run_script(name, "--eval-checkpoint", str(checkpoint), "--eval-episodes", "1", tmp_path=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        evaluation = lines[-1]
        assert evaluation["mode"] == "eval" and evaluation["status"] == "ok"
        assert evaluation["episodes"] == 1 and math.isfinite(evaluation["mean_return"])
        assert evaluation["steps"] > 0 and evaluation["env_id"] == "Breakout-v5"
        assert_summary_matches(proc.stdout, evaluation, tmp_path / "results.jsonl")


@pytest.mark.parametrize("name,flags", [(EAGER, ()), (TWIN, ("--compile",))], ids=["eager", "twin-compile"])
def test_runs_are_deterministic(name, flags, tmp_path):
    """Same seed twice, the same numbers (the twin compiled: its runs find the smoke test's kernels in inductor's
    cache)."""
    runs = []
    for i in range(2):
        (tmp_path / str(i)).mkdir()
        proc, lines = run_script(name, *TINY, "300", *flags, tmp_path=tmp_path / str(i))
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert lines[0]["compile"] is ("--compile" in flags) and lines[0]["losses"]
        runs.append(lines[0])
    for key in ("losses", "mean_return", "episodes", "steps"):
        assert runs[0][key] == runs[1][key], key
    curves = [read_curve(line, tmp_path / str(i)) for i, line in enumerate(runs)]
    assert [row.split(",")[::2] for row in curves[0].splitlines()] == [
        row.split(",")[::2] for row in curves[1].splitlines()
    ]


@pytest.mark.parametrize("name", SCRIPTS)
def test_non_finite_loss_stops_the_run_as_diverged(name, tmp_path):
    # a huge step size: the weights blow up after the first steps, the Q-values and the loss overflow
    proc, lines = run_script(name, *TINY, "300", "--learning-rate", "1e30", tmp_path=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    [line] = lines  # parsed strictly: no NaN in the file
    assert line["status"] == "diverged" and line["message"].startswith("loss diverged at step ")
    assert f"{name}.py: {line['message']}" in proc.stderr
    assert line["losses"]["td_loss"] is None
    assert_summary_matches(proc.stdout, line, tmp_path / "results.jsonl")


# ---------------------------------------------------------------- bad input


BAD_INPUTS = [
    (("--env-id", "NotAGame-v5"), "--env-id"),
    (("--env-id", "CartPole-v1"), "--env-id"),
    (("--env-id", "HalfCheetah-v4"), "--env-id"),
    (("--batch-size", "64", "--buffer-size", "32"), "--batch-size"),
    (("--learning-starts", "10000000"), "--learning-starts"),
    (("--total-timesteps", "1000", "--learning-starts", "996"), "--learning-starts"),
    (("--buffer-size", "0"), "--buffer-size"),
    (("--batch-size", "-1"), "--batch-size"),
    (("--num-envs", "0"), "--num-envs"),
    (("--train-frequency", "0"), "--train-frequency"),
    (("--target-network-frequency", "1001"), "--target-network-frequency"),
    (("--exploration-fraction", "0"), "--exploration-fraction"),
    (("--buffer-device", "tpu"), "--buffer-device"),
    (("--buffer-device", "cuda"), "--buffer-device"),
    (("--buffer-size", "100000000000"), "--buffer-size"),  # 700 TB: more than this machine has
    (("--learning-rate", "-1"), "--learning-rate"),
    (("--learning-rate", "0"), "--learning-rate"),
    (("--target-network-frequency", "0"), "--target-network-frequency"),
    (("--learning-starts", "-1"), "--learning-starts"),
    (("--total-timesteps", "1", "--num-envs", "2"), "--total-timesteps"),
    (("--buffer-size", "1", "--num-envs", "2", "--batch-size", "1"), "--buffer-size"),
]


@pytest.mark.parametrize(
    "name,variant", [(EAGER, ()), (TWIN, ()), (TWIN, ("--compile", "True"))], ids=["eager", "twin", "twin-compile"]
)
@pytest.mark.parametrize("flags,flag", BAD_INPUTS)
def test_bad_input_exits_2_with_one_line(mods, name, variant, flags, flag, capsys, tmp_path):
    args = args_from_flags(mods[name], (*flags, *variant))
    assert getattr(args, "compile", False) is bool(variant)
    assert_main_exits_2_with_one_line(mods[name], name, args, flag, capsys, tmp_path)


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("where", ["a folder", "under a file"])
def test_results_file_that_cannot_be_one_exits_2_with_one_line(mods, name, where, capsys, tmp_path):
    """--results-file names a folder, or a path under a file: one line naming the flag, nothing written."""
    (tmp_path / "a_folder").mkdir()
    (tmp_path / "a_file").write_text("kept\n")
    results = tmp_path / ("a_folder" if where == "a folder" else "a_file/results.jsonl")
    args = args_from_flags(mods[name], ("--results-file", str(results)))
    args.cuda = False
    with pytest.raises(SystemExit) as exit_info:
        mods[name].main(args)
    assert exit_info.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith(f"{name}.py: error: --results-file {results}"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "a_folder"]
    assert (tmp_path / "a_file").read_text() == "kept\n" and not any((tmp_path / "a_folder").iterdir())


def test_atari_games_other_than_breakout_are_accepted():
    bk.check_atari_env("dqn_atari_envpool.py", "Pong-v5")  # no exit: the check both scripts make


@pytest.mark.parametrize(
    "name,flags,flag",
    [(TWIN, ("--cudagraphs",), "--cudagraphs"), (EAGER, ("--batch-size", "4000"), "--batch-size")],
)
def test_bad_input_from_the_command_line(name, flags, flag, tmp_path):
    proc, lines = run_script(name, *TINY, "600", *flags, tmp_path=tmp_path)
    assert proc.returncode == 2
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and flag in err[0] and "Traceback" not in proc.stderr, proc.stderr
    assert lines == []
    if flag == "--cudagraphs":
        assert err[0] == f"{name}.py: error: --cudagraphs needs CUDA, and none is available"


def test_scripts_import_without_side_effects():
    for name in SCRIPTS:
        assert name in sys.modules or load_script(name)


@pytest.mark.parametrize("name", SCRIPTS)
def test_eval_checkpoint_that_is_not_one_exits_2_with_one_line(mods, name, capsys, tmp_path):
    (tmp_path / "not_a_checkpoint.pt").write_text("not a checkpoint\n")
    args = args_from_flags(mods[name], ("--eval-checkpoint", str(tmp_path / "not_a_checkpoint.pt")))
    assert_main_exits_2_with_one_line(mods[name], name, args, "--eval-checkpoint", capsys, tmp_path)


# ---------------------------------------------------------------- the GPU path on the CPU, the speed window, the logs

# the tiny regression flags (tests/regression.py): 600 steps of one env, learning after step 200, an update every 4
REGRESSION = list(PAIRS[EAGER])

# Every host read of a twin run at those flags, by line (issue 16 item 3): a new one fails here, naming its line.
HOST_READS = {
    # the actions go to the host once per env step, to step the env (.cpu() waits for the policy step; .numpy() then
    # views the host copy)
    "cpu at dqn_atari_envpool_torchcompile.py: next_obs, rewards, terminations, truncations, info = "
    "envs.step(actions.cpu().numpy())": 600,
    "numpy at dqn_atari_envpool_torchcompile.py: next_obs, rewards, terminations, truncations, info = "
    "envs.step(actions.cpu().numpy())": 600,
    # the two logged scalars, in one read, at each log point with a training step (steps 300, 400 and 500: every
    # 100 steps once learning started), and once more at the end for the results line
    "tolist at bookkeeping.py: values = torch.stack([v.detach().float() for v in values]).tolist()": 4,
}


# with --compile the compiler reads 0-d CPU tensors (the target-copy flags) as it traces the update: it specializes on
# their value, which it does not for a GPU's
COMPILE_READS = {
    "item at dqn_atari_envpool_torchcompile.py: out = update_step(copy_yes if copy and i == len(train_steps) - 1 else "
    "copy_no)": 5
}


def pinned_host_reads(flags):
    """The same with --cudagraphs, and with --compile the compiler's reads (tests/test_gpu_path.py counts those
    runs)."""
    return {**HOST_READS, **(COMPILE_READS if "--compile" in flags else {})}


def test_twin_host_reads_are_the_pinned_ones(mods, tmp_path):
    with host_reads() as reads:
        line, _ = run_main(mods[TWIN], REGRESSION, tmp_path)
    assert line["status"] == "ok" and line["steps"] == 600
    assert dict(reads) == pinned_host_reads([])


def test_twin_step_functions_run_on_the_meta_device(mods):
    """Device hygiene (issue 16 item 4): the policy step, the store write, the sampler, the target and the training
    step run on the meta device, where a host read raises and a tensor made without device= lands on the CPU and
    clashes with the meta ones (a 0-d one passes as a scalar, as on CUDA: every output is checked to be on meta).

    The twin's fused Adam refuses meta parameters at its step (no meta kernel), and a capturable Adam asserts a GPU:
    the training step runs here with PyTorch's plain Adam (its step count a CPU scalar); the rest is the twin's."""
    twin, meta = mods[TWIN], torch.device("meta")
    q_network, target_network = twin.QNetwork(4).to(meta), twin.QNetwork(4).to(meta)
    obs = torch.empty(3, 4, 84, 84, dtype=torch.uint8, device=meta)
    actions = twin.epsilon_greedy(q_network, obs, torch.tensor(0.5, device=meta))
    assert actions.device == meta and actions.shape == (3,) and actions.dtype == torch.long
    store = twin.new_frame_store(3, 30, meta)
    assert all(t.device == meta for t in store.values())
    zeros = torch.zeros(3, device=meta)
    twin.store_add(store, obs[:, -1], zeros.bool(), actions, zeros, zeros.bool())
    env, pos = twin.sample_indices(store, 8)
    assert env.device == pos.device == meta and env.shape == pos.shape == (8,)
    assert twin.stack_frames(store, env, pos).device == meta
    batch = twin.sample(store, 8)
    assert all(value.device == meta for value in batch.values()) and batch["next_obs"].shape == (8, 4, 84, 84)
    target = twin.dqn_target(batch["rewards"], target_network(batch["next_obs"]), batch["terminations"], 0.99)
    assert target.device == meta and target.shape == (8,)
    copy_target = torch.tensor(True, device=meta)
    fused = torch.optim.Adam(q_network.parameters(), lr=1e-4, fused=True)
    with pytest.raises(RuntimeError, match="fused=True"):  # at its step, after the sampler, the loss and backward()
        twin.train_step(q_network, target_network, fused, store, 8, 0.99, copy_target)
    optimizer = torch.optim.Adam(q_network.parameters(), lr=1e-4)
    out = twin.train_step(q_network, target_network, optimizer, store, 8, 0.99, copy_target)
    assert out.device == meta and out.shape == (2,)  # one tensor: td_loss and q_values


def speed_flags(total, measure_burnin):
    """The tiny regression flags with another budget and --measure-burnin (the last of a repeated flag counts)."""
    return [*REGRESSION, "--total-timesteps", str(total), "--measure-burnin", str(measure_burnin)]


@pytest.mark.parametrize("name", SCRIPTS)
def test_steps_per_second_leave_out_the_first_update(mods, name, monkeypatch, tmp_path):
    """Issue 16 item 6: the steps/s window opens --measure-burnin iterations after learning starts, so that the
    update's compilation and CUDA-graph capture stay out of it. A fake clock: every iteration takes one second, and
    the first update (the compile) 1000 more. Counting iterations from 1: learning starts after the 201st (steps
    0-200), the first update is at step 204, in the 205th."""
    module = mods[name]
    clock = type("FakeClock", (), {"now": 1e9, "time": lambda self: self.now})()
    monkeypatch.setattr(bk, "time", clock)
    tick = bk.Run.tick

    def one_second_later(run, step):
        clock.now += 1.0
        tick(run, step)

    monkeypatch.setattr(bk.Run, "tick", one_second_later)
    update, calls = module.update, []

    def slow_first_update(*args, **kwargs):
        calls.append(clock.now)
        clock.now += 1000.0 if len(calls) == 1 else 0.0
        return update(*args, **kwargs)

    monkeypatch.setattr(module, "update", slow_first_update)  # the twin's train_step calls it too
    (tmp_path / "4").mkdir()
    line, _ = main_in_process(module, speed_flags(300, 4), tmp_path / "4")
    assert len(calls) == 24 and line["steps"] == 300
    assert line["sps"] == pytest.approx(1.0)  # iterations 206-300, one second each: the slow update left out
    (tmp_path / "3").mkdir()
    calls.clear()
    line, _ = main_in_process(module, speed_flags(300, 3), tmp_path / "3")
    assert line["sps"] == pytest.approx(96 / 1096)  # one iteration fewer left out: the window has the slow update


def test_default_burnin_covers_the_update_warm_up_and_capture(mods):
    """The update's CudaGraphModule runs `warmup` - 1 warm-up calls, then captures, one call every --train-frequency
    steps from the first training step (at most --train-frequency steps after learning starts)."""
    source = Path(mods[TWIN].__file__).read_text()
    (warmup,) = re.findall(r"CudaGraphModule\(update_step, warmup=(\d+)\)", source)
    for name in SCRIPTS:
        args = mods[name].Args()
        assert args.measure_burnin == 100 and args.num_envs == 1
        # the capture is at most warmup * train_frequency iterations after learning starts; a margin of twice that
        assert args.measure_burnin >= 2 * int(warmup) * args.train_frequency


@pytest.mark.parametrize("name", SCRIPTS)
def test_track_logs_cleanrls_keys(mods, name, fake_wandb, tmp_path):
    """Issue 17 item 5: CleanRL's dqn_atari keys, charts/SPS every 100 steps, the losses every 100 steps once
    learning started (CleanRL logs them at training steps s with s % 100 == 0), a game's score and length per game,
    and the values the results line reports. Steps are env steps done (a step s logs at s + 1)."""
    line, curve = main_in_process(mods[name], [*REGRESSION, "--total-timesteps", "601", "--track"], tmp_path)
    assert fake_wandb.finished and fake_wandb.config["name"] == line["run_name"]
    assert fake_wandb.keys() == {
        "charts/SPS",
        "charts/epsilon",
        "charts/episodic_return",
        "charts/episodic_length",
        "losses/td_loss",
        "losses/q_values",
    }
    steps_of = lambda key: [step for step, data in fake_wandb.logs if key in data]  # noqa: E731
    assert steps_of("charts/SPS") == [1, 101, 201, 301, 401, 501, 601]
    assert steps_of("losses/td_loss") == steps_of("losses/q_values") == [301, 401, 501, 601]
    last = [data for _, data in fake_wandb.logs if "losses/td_loss" in data][-1]
    assert {"td_loss": last["losses/td_loss"], "q_values": last["losses/q_values"]} == line["losses"]
    games = [(step, data) for step, data in fake_wandb.logs if "charts/episodic_return" in data]
    assert len(games) == line["episodes"] >= 2
    assert [(step, data["charts/episodic_return"]) for step, data in games] == curve
    # one env: a game begins right after the previous one ended, and its length counts every step it took
    ends = [0] + [step for step, _ in games]
    assert [data["charts/episodic_length"] for _, data in games] == [b - a for a, b in zip(ends, ends[1:])]
