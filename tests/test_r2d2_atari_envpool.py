"""R2D2 (envpool): value rescaling, sequence targets and priorities against float64 loops, the sum tree's sampler by
chi-square, the sequence store and the burn-in against real env streams, twin agreement, the GPU path on the CPU
(meta device, host reads and uploads, the steps/s window, wandb keys), the scripts end to end."""

import contextlib
import copy
import importlib
import math
import sys
from functools import partial

import numpy as np
import pytest
import torch
from conftest import (
    args_from_flags,
    assert_finite_results_line,
    assert_main_exits_2_with_one_line,
    assert_summary_matches,
    curve_points,
    load_script,
    main_in_process,
    read_curve,
    run_script,
)
from gpu_standin import host_reads, run_main, uploads
from regression import PAIRS
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from leanrl import bookkeeping as bk

EAGER, TWIN = "r2d2_atari_envpool", "r2d2_atari_envpool_torchcompile"
SCRIPTS = (EAGER, TWIN)
# masked CartPole, the small-task settings: 8 envs, hidden 64, burn-in 8 + sequences of 16 overlapping by 8, batch 32,
# one gradient step per 16 env steps (2 per iteration), lr 1e-3, gamma 0.99, target copy every 200 steps
CARTPOLE = ("--env-id", "CartPole-v1", "--mask-velocity", "--num-envs", "8", "--hidden-size", "64", "--burn-in", "8")
CARTPOLE += ("--seq-len", "16", "--overlap", "8", "--batch-size", "32", "--train-frequency", "16")
CARTPOLE += ("--learning-rate", "1e-3", "--gamma", "0.99", "--target-network-frequency", "200")
CARTPOLE += ("--buffer-size", "40000", "--learning-starts", "2000", "--measure-burnin", "1")
# Breakout with a tiny network and store: 2 envs, sequences of 4 + 8 steps, 60 gradient steps of batch 4
TINY_ATARI = ("--num-envs", "2", "--hidden-size", "32", "--burn-in", "4", "--seq-len", "8", "--overlap", "4")
TINY_ATARI += ("--batch-size", "4", "--buffer-size", "400", "--learning-starts", "40", "--train-frequency", "4")
TINY_ATARI += ("--target-network-frequency", "20", "--measure-burnin", "1", "--total-timesteps")
# the smallest CartPole run that still trains (compiling the unrolled update dominates: keep the unroll short)
TINY_CARTPOLE = ("--env-id", "CartPole-v1", "--num-envs", "4", "--hidden-size", "16", "--burn-in", "1")
TINY_CARTPOLE += ("--seq-len", "3", "--overlap", "1", "--batch-size", "8", "--train-frequency", "8")
TINY_CARTPOLE += ("--buffer-size", "400", "--learning-starts", "200", "--target-network-frequency", "10")
TINY_CARTPOLE += ("--measure-burnin", "1", "--total-timesteps", "600")


@pytest.fixture(scope="module")
def mods():
    return {name: load_script(name) for name in SCRIPTS}


# ---------------------------------------------------------------- value rescaling


def h_reference(x, eps):
    return [math.copysign(1.0, v) * (math.sqrt(abs(v) + 1) - 1) + eps * v if v else 0.0 for v in x]


def h_inverse_reference(y, eps):
    """The textbook inverse, in float64: sign(y) (((sqrt(1 + 4 eps (|y| + 1 + eps)) - 1) / (2 eps))^2 - 1)."""
    out = []
    for v in y:
        s = (math.sqrt(1 + 4 * eps * (abs(v) + 1 + eps)) - 1) / (2 * eps)
        out.append(math.copysign(1.0, v) * (s * s - 1) if v else 0.0)
    return out


def spread(n, seed):
    """Values over [-1e4, 1e4] at every scale, zero and the ends included."""
    g = torch.Generator().manual_seed(seed)
    x = torch.sign(torch.randn(n, generator=g)) * 10 ** (torch.rand(n, generator=g) * 10 - 6)
    return torch.cat([x.clamp(-1e4, 1e4), torch.tensor([0.0, 1e4, -1e4, 1.0, -1.0, 1e-3])])


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("eps", [1e-3, 1e-2])
def test_value_rescale_and_inverse_match_the_formulas_in_float64(mods, name, eps):
    module = mods[name]
    x = spread(2000, seed=1).double()
    torch.testing.assert_close(module.value_rescale(x, eps), torch.tensor(h_reference(x.tolist(), eps)).double())
    y = module.value_rescale(x, eps)
    want = torch.tensor(h_inverse_reference(y.tolist(), eps), dtype=torch.float64)
    torch.testing.assert_close(module.inverse_value_rescale(y, eps), want, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(module.inverse_value_rescale(y, eps), x, rtol=1e-9, atol=1e-12)
    # float32 as the scripts run it: h against the float64 formula, and the round trip within 1e-5 relative
    x32 = x.float()
    torch.testing.assert_close(module.value_rescale(x32, eps).double(), y, rtol=2e-6, atol=1e-7)
    back = module.inverse_value_rescale(module.value_rescale(x32, eps), eps)
    torch.testing.assert_close(back, x32, rtol=1e-5, atol=1e-7)
    assert module.value_rescale(torch.tensor(1e4), eps) < 1e4 * eps + 100  # it does squash


# ---------------------------------------------------------------- n-step double-Q targets over a sequence


def targets_reference(rewards, q_online, q_target, terminations, truncations, first, gamma, n, eps):
    """A plain loop over time in float64: per (t, b), sum rewards until n of them, the episode's end, or the last
    step; bootstrap from the target net's value of the online net's best action unless the episode terminated."""
    T, B, _ = q_online.shape
    qo, qt = q_online.double().tolist(), q_target.double().tolist()
    r, term, trunc, fst = rewards.double().tolist(), terminations.tolist(), truncations.tolist(), first.tolist()
    targets = torch.zeros(T - 1, B, dtype=torch.float64)
    valid = torch.zeros(T - 1, B, dtype=torch.bool)
    for b in range(B):
        for t in range(T - 1):
            ret, k, bootstrap = 0.0, 0, True
            while True:
                ret += gamma**k * r[t + k][b]
                k += 1
                if term[t + k - 1][b]:
                    bootstrap = False
                    break
                if trunc[t + k - 1][b] or k == n or t + k == T - 1:
                    break
            if bootstrap:
                a = max(range(len(qo[t + k][b])), key=lambda i: qo[t + k][b][i])
                ret += gamma**k * h_inverse_reference([qt[t + k][b][a]], eps)[0]
            targets[t, b] = h_reference([ret], eps)[0]
            valid[t, b] = not fst[t + 1][b]
    return targets, valid


def random_sequences(T, B, A, seed, end_prob=0.15):
    """Step data and Q-values with episode ends (terminations and truncations), each followed by the env's reset
    step (an episode's final observation, reward 0) and a first observation, as envpool streams them."""
    g = torch.Generator().manual_seed(seed)
    q_online = torch.randn(T, B, A, generator=g) * 5
    q_target = torch.randn(T, B, A, generator=g) * 5
    rewards = torch.randint(-2, 5, (T, B), generator=g).float()
    terminations = torch.zeros(T, B, dtype=torch.bool)
    truncations = torch.zeros(T, B, dtype=torch.bool)
    first = torch.zeros(T, B, dtype=torch.bool)
    ends = torch.rand(T, B, generator=g) < end_prob
    kinds = torch.rand(T, B, generator=g) < 0.5
    for b in range(B):
        t = 0
        while t < T:
            if ends[t, b] and t + 2 < T:
                terminations[t, b], truncations[t, b] = bool(kinds[t, b]), not kinds[t, b]
                rewards[t + 1, b] = 0.0  # the reset step
                first[t + 2, b] = True
                t += 2
            t += 1
    return rewards, q_online, q_target, terminations, truncations, first


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("T,B,A,n", [(2, 1, 2, 1), (8, 3, 4, 3), (21, 16, 6, 5), (81, 5, 18, 5), (12, 4, 3, 20)])
def test_sequence_targets_match_a_float64_loop(mods, name, T, B, A, n):
    inputs = random_sequences(T, B, A, seed=T * 31 + B)
    if T > 8:
        assert inputs[3].any() and inputs[4].any(), "episode ends (both kinds) inside the sequence"
    got, valid = mods[name].nstep_double_q_targets(*inputs, 0.997, n, 1e-3)
    want, want_valid = targets_reference(*inputs, 0.997, n, 1e-3)
    assert got.dtype == torch.float32 and got.shape == (T - 1, B)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    assert torch.equal(valid, want_valid)


def test_the_last_steps_bootstrap_from_the_sequence_end(mods):
    """The last n-1 steps sum fewer rewards and bootstrap from the last observation; a termination cuts the sum."""
    module = mods[EAGER]
    T, B, A = 6, 1, 2
    q = torch.zeros(T, B, A)
    q[:, 0, 1] = 1.0  # the online net prefers action 1 everywhere
    q_target = torch.arange(T * A, dtype=torch.float32).view(T, B, A)  # distinct bootstrap values
    rewards = torch.ones(T, B)
    no = torch.zeros(T, B, dtype=torch.bool)
    h, hinv = module.value_rescale, module.inverse_value_rescale
    got, _ = module.nstep_double_q_targets(rewards, q, q_target, no, no, no, 0.5, 3, 1e-3)
    for t in range(T - 1):
        k = min(3, T - 1 - t)
        raw = sum(0.5**i for i in range(k)) + 0.5**k * hinv(q_target[t + k, 0, 1])
        assert got[t, 0] == pytest.approx(float(h(raw)), rel=1e-6), t
    terminations = no.clone()
    terminations[2, 0] = True
    got, _ = module.nstep_double_q_targets(rewards, q, q_target, terminations, no, no, 0.5, 3, 1e-3)
    assert got[1, 0] == pytest.approx(float(h(torch.tensor(1.5))), rel=1e-6)  # r1 + 0.5 r2, no bootstrap


# ---------------------------------------------------------------- priorities and the sum tree


@pytest.mark.parametrize("name", SCRIPTS)
def test_priority_mix_matches_a_loop(mods, name):
    g = torch.Generator().manual_seed(3)
    abs_td = torch.rand(79, 12, generator=g) * 4
    valid = torch.rand(79, 12, generator=g) < 0.9
    valid[:, 3] = False  # a sequence with no valid step gets priority 0
    got = mods[name].priority_mix(abs_td, valid, 0.9)
    for b in range(12):
        values = [float(abs_td[t, b]) for t in range(79) if valid[t, b]]
        want = 0.9 * max(values) + 0.1 * sum(values) / len(values) if values else 0.0
        assert float(got[b]) == pytest.approx(want, rel=1e-5), b


def check_tree(tree):
    """Every internal node is the sum of its two children (as float32 adds them)."""
    leaves = tree.shape[0] // 2
    parents = torch.arange(1, leaves)
    assert torch.equal(tree[parents], tree[2 * parents] + tree[2 * parents + 1])


def chi_square_bound(dof):
    return dof + 6 * math.sqrt(2 * dof)  # 6 standard deviations of a chi-square with dof degrees of freedom


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("capacity", [37, 1000])
def test_sampler_frequencies_match_p_alpha_by_chi_square(mods, name, capacity):
    module = mods[name]
    g = torch.Generator().manual_seed(capacity)
    priorities = torch.rand(capacity, generator=g) * 10 + 0.01
    priorities[torch.rand(capacity, generator=g) < 0.2] = 0.0  # empty slots
    alpha = 0.9
    tree = module.new_sum_tree(capacity)
    module.tree_update(tree, torch.arange(capacity), priorities**alpha)
    check_tree(tree)
    torch.manual_seed(0)
    draws = torch.cat([module.tree_sample(tree, 100, 0.6)[0] for _ in range(1000)])  # 1e5 draws
    counts = torch.bincount(draws, minlength=capacity).double()
    assert len(counts) == capacity, "a draw outside the slots"
    assert counts[priorities == 0].sum() == 0, "an empty slot was drawn"
    p = priorities.double() ** alpha
    expected = 1e5 * p / p.sum()
    live = expected > 0
    chi2 = float(((counts[live] - expected[live]) ** 2 / expected[live]).sum())
    assert chi2 < chi_square_bound(int(live.sum()) - 1), chi2
    # and not just any distribution: a uniform one is far off
    uniform = torch.full_like(expected[live], 1e5 / int(live.sum()))
    assert float(((counts[live] - uniform) ** 2 / uniform).sum()) > 10 * chi_square_bound(int(live.sum()) - 1)


@pytest.mark.parametrize("name", SCRIPTS)
def test_importance_weights_equal_the_formula(mods, name):
    module = mods[name]
    g = torch.Generator().manual_seed(9)
    priorities = torch.rand(50, generator=g) + 0.05
    priorities[::7] = 0.0
    tree = module.new_sum_tree(50)
    module.tree_update(tree, torch.arange(50), priorities**0.9)
    torch.manual_seed(1)
    index, weights = module.tree_sample(tree, 16, 0.6)
    p = priorities.double() ** 0.9
    probs = p / p.sum()
    n = int((priorities > 0).sum())
    w = (n * probs[index]) ** -0.6
    torch.testing.assert_close(weights.double(), w / w.max(), rtol=1e-5, atol=1e-6)
    assert weights.max() == 1.0 and (weights > 0).all()


class WritesInReverse(TorchDispatchMode):
    """A backend that applies the writes of an indexed store (index_put_) last to first: CUDA promises no order
    between writes to the same element, this CPU happens to apply them first to last."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        args = list(args)
        if func is torch.ops.aten.index_put_.default and len(args[1]) == 1:
            (index,), values = args[1], args[2]
            args[1] = [index.flip(0)]
            if values.dim() and values.shape[0] == index.shape[0]:
                args[2] = values.flip(0)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_slot_written_twice_keeps_its_last_priority_in_any_write_order(mods, name):
    """Issue 16 item 12: a batch that samples a sequence twice writes two priorities to its leaf. The tree keeps the
    one given last, whatever order the device applies the writes in (a plain indexed write keeps the last on this CPU
    and an arbitrary one on CUDA: a seeded GPU run would not repeat itself); every parent is the sum of its children."""
    module = mods[name]
    g = torch.Generator().manual_seed(12)
    start = torch.rand(20, generator=g)
    index = torch.tensor([3, 3, 3, 17, 5, 17, 0, 0, 19, 3])
    values = torch.tensor([2.0, 7.0, 4.0, 0.5, 9.0, 1.5, 0.0, 3.0, 0.25, 6.0])
    for order in [torch.arange(10), torch.arange(9, -1, -1), *(torch.randperm(10, generator=g) for _ in range(5))]:
        trees = []
        for backend in (contextlib.nullcontext, WritesInReverse):
            tree = module.new_sum_tree(20)
            module.tree_update(tree, torch.arange(20), start)
            with backend():
                module.tree_update(tree, index[order], values[order])
            trees.append(tree)
        assert torch.equal(trees[0], trees[1])  # bit for bit
        want = start.clone()
        for i, value in zip(index[order].tolist(), values[order].tolist()):
            want[i] = value  # the last given wins
        tree = trees[0]
        check_tree(tree)
        assert torch.equal(tree[32:52], want)
        assert tree[52:].sum() == 0  # the padding leaves stay empty
    # the store's priority update: leaves get p^alpha (a repeated slot the last one's), the running max follows
    store = module.new_store(2, 2 * 40, 8, 4, (2,), torch.float32)
    module.update_priorities(store, torch.tensor([1, 1, 4]), torch.tensor([2.0, 3.0, 0.5]), 0.9)
    check_tree(store["tree"])
    assert float(store["max_priority"]) == 3.0
    assert float(store["tree"][16 + 1]) == pytest.approx(3.0**0.9)


# ---------------------------------------------------------------- the sequence store and burn-in on real streams


def drive(module, env_id, num_envs, capacity, steps, burn_in, seq_len, overlap, hidden, seed, mask=False):
    """The training loop's acting and storing (random actions, the acting network's LSTM state recorded before every
    observation); returns the store, the network and what the env streamed, per position."""
    length, period = burn_in + seq_len, seq_len - overlap
    envs = module.make_env(env_id, num_envs, seed)
    obs = module.observe(envs.reset()[0], mask)
    torch.manual_seed(seed)
    net = module.QNetwork(obs.shape[1:], envs.action_space.n, hidden)
    frame_shape, dtype = module.frame_shape_of(env_id, mask)
    store = module.new_store(num_envs, capacity, period, hidden, frame_shape, dtype)
    newest = (lambda o: o[:, -1]) if len(frame_shape) == 2 else (lambda o: o)
    zeros = torch.zeros(num_envs)
    module.store_add(store, torch.as_tensor(newest(obs)), zeros == 0, zeros.long(), zeros, zeros.bool(), zeros.bool())
    state = (torch.zeros(num_envs, hidden), torch.zeros(num_envs, hidden))
    prev_a, prev_r, first = zeros.long(), zeros, torch.ones(num_envs, dtype=torch.bool)
    rng = np.random.default_rng(seed)
    rec = dict(obs=[obs], first=[first.numpy()], h=[], c=[], actions=[], rewards=[], terminations=[], truncations=[])
    for it in range(steps):
        if it % period == 0:
            module.store_state(store, module.sequence_slots(store, it), it, *state)
        rec["h"].append(state[0])
        rec["c"].append(state[1])
        with torch.no_grad():
            _, state = net(torch.as_tensor(obs)[None], prev_a[None], prev_r[None], first[None], state)
        actions = rng.integers(0, envs.action_space.n, num_envs)
        next_obs, rewards, term, trunc, info = envs.step(actions)
        obs = module.observe(next_obs, mask)
        first = torch.as_tensor(info["elapsed_step"] == 0)
        data = (torch.as_tensor(actions), torch.as_tensor(rewards, dtype=torch.float32))
        module.store_add(
            store, torch.as_tensor(newest(obs)), first, *data, torch.as_tensor(term), torch.as_tensor(trunc)
        )
        module.add_sequences(store, it + 2, length, period, 0.9)
        prev_a, prev_r = data
        for key, value in zip(rec, (obs, first, None, None, *data, term, trunc)):
            if value is not None:
                rec[key].append(np.asarray(value))
    envs.close()
    stream = {key: np.stack(value, 1) for key, value in rec.items() if key not in ("h", "c")}
    stream["h"], stream["c"] = torch.stack(rec["h"], 1), torch.stack(rec["c"], 1)
    return store, net, stream


def valid_starts(count, length, period, slots):
    """The sequence starts p that can be sampled once `count` frames per env are written."""
    return [p for p in range(0, count, period) if p + length <= count <= p + slots - 3]


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize(
    "env_id,num_envs,capacity,steps,mask",
    [
        ("CartPole-v1", 3, 3 * 64, 300, True),
        ("CartPole-v1", 2, 2 * 400, 250, False),
        ("Breakout-v5", 2, 2 * 48, 250, False),
    ],
)
def test_sequences_replay_the_stream_and_burn_in_rebuilds_the_state(
    mods, name, env_id, num_envs, capacity, steps, mask
):
    """Every sampleable sequence is the env's stream (Atari: envpool's own stacks, episode starts, wrap-around),
    carries the actor's LSTM state at its start, and the burn-in from that state reproduces the actor's state."""
    module = mods[name]
    burn_in, seq_len, overlap, hidden = 6, 10, 2, 16
    length, period = burn_in + seq_len, seq_len - overlap
    store, net, stream = drive(module, env_id, num_envs, capacity, steps, burn_in, seq_len, overlap, hidden, seed=5)
    slots, count = store["frames"].shape[1], steps + 1
    assert slots == capacity // num_envs // period * period
    assert count > 2 * slots or capacity > num_envs * count, "the ring wraps around, or it holds the whole stream"
    assert stream["first"][:, 1:].any(), "episode starts inside the stream"
    starts = valid_starts(count, length, period, slots)
    per_env = slots // period
    index = torch.tensor([e * per_env + (p // period) % per_env for e in range(num_envs) for p in starts])
    leaves = store["tree"][store["tree"].shape[0] // 2 :][: num_envs * per_env]
    assert set(torch.nonzero(leaves).flatten().tolist()) == set(index.tolist()), "exactly the valid sequences"
    assert torch.allclose(leaves[index], torch.tensor(1.0))  # they entered at the running max, 1
    batch = module.sample_sequences(store, index, length)
    assert batch["first"].shape == (length, len(index)) and batch["h"].shape == (len(index), hidden)
    for b, (e, p) in enumerate((e, p) for e in range(num_envs) for p in starts):
        pos = slice(p, p + length)
        np.testing.assert_array_equal(batch["obs"][:, b].numpy(), stream["obs"][e, pos])
        np.testing.assert_array_equal(batch["first"][:, b].numpy(), stream["first"][e, pos])
        for key in ("actions", "rewards", "terminations", "truncations"):
            np.testing.assert_array_equal(batch[key][:-1, b].numpy(), stream[key][e, p : p + length - 1], key)
        if p > 0:
            assert batch["prev_actions"][0, b] == stream["actions"][e, p - 1]
        np.testing.assert_array_equal(batch["prev_actions"][1:, b].numpy(), stream["actions"][e, p : p + length - 1])
        np.testing.assert_array_equal(batch["prev_rewards"][1:, b].numpy(), stream["rewards"][e, p : p + length - 1])
        assert torch.equal(batch["h"][b], stream["h"][e, p]) and torch.equal(batch["c"][b], stream["c"][e, p])
    # burn-in: unrolled from the stored state with unchanged parameters, the state is the actor's at p + burn_in
    with torch.no_grad():
        _, (h, c) = net(*module.part(batch, 0, burn_in), (batch["h"], batch["c"]))
    for b, (e, p) in enumerate((e, p) for e in range(num_envs) for p in starts):
        torch.testing.assert_close(h[b], stream["h"][e, p + burn_in], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(c[b], stream["c"][e, p + burn_in], rtol=1e-5, atol=1e-6)
    # a zero state instead of the stored one gives another state, unless an episode began in the burn-in
    with torch.no_grad():
        _, (h0, _) = net(*module.part(batch, 0, burn_in), (batch["h"] * 0, batch["c"] * 0))
    fresh = batch["first"][:burn_in].any(dim=0)
    assert (~fresh).any() and not torch.allclose(h0[~fresh], h[~fresh], atol=1e-4)


@pytest.mark.parametrize("name", SCRIPTS)
def test_bytes_stored(mods, name):
    module = mods[name]
    store = module.new_store(32, 1_000_000, 40, 512, device="meta")  # shapes and sizes, no 7 GB allocated
    nbytes = sum(t.nbytes for t in store.values())
    assert nbytes == module.store_bytes(32, 1_000_000, 40, 512)
    # by hand: per frame 84x84 uint8 + first, action, reward, termination, truncation (1 + 8 + 4 + 1 + 1 bytes); per
    # sequence its start and LSTM state (8 + 2 * 512 * 4); the sum tree over 2^15 leaves; max priority and count
    assert nbytes == 32 * 31240 * (84 * 84 + 15) + 32 * 781 * (8 + 8 * 512) + 2 * 2**15 * 4 + 4 + 8
    # one 84x84 frame per env step (7 KB), plus the step data and one LSTM state per 40 steps: about 7.2 GB
    assert 7.05e9 < nbytes < 7.3e9, nbytes
    assert store["frames"].shape == (32, 31240, 84, 84) and store["h"].shape == (32 * 781, 512)


@pytest.mark.parametrize("name", SCRIPTS)
def test_actor_epsilons_follow_ape_x(mods, name):
    eps = mods[name].actor_epsilons(8, 0.4, 7.0)
    want = [0.4 ** (1 + 7 * i / 7) for i in range(8)]
    torch.testing.assert_close(eps.double(), torch.tensor(want, dtype=torch.float64), rtol=1e-6, atol=0)
    assert mods[name].actor_epsilons(1, 0.4, 7.0).tolist() == [pytest.approx(0.4)]


# ---------------------------------------------------------------- twin: agreement, compiled functions, graph breaks


def test_twin_math_equals_the_eager_math(mods):
    eager, twin = mods[EAGER], mods[TWIN]
    x = spread(500, seed=4)
    torch.testing.assert_close(twin.value_rescale(x), eager.value_rescale(x), rtol=0, atol=0)
    torch.testing.assert_close(twin.inverse_value_rescale(x), eager.inverse_value_rescale(x), rtol=0, atol=0)
    inputs = random_sequences(30, 7, 5, seed=8)
    got, want = (
        twin.nstep_double_q_targets(*inputs, 0.99, 5, 1e-3),
        eager.nstep_double_q_targets(*inputs, 0.99, 5, 1e-3),
    )
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    abs_td, valid = torch.rand(29, 7), torch.rand(29, 7) < 0.8
    assert torch.equal(twin.priority_mix(abs_td, valid, 0.9), eager.priority_mix(abs_td, valid, 0.9))
    trees = [module.new_sum_tree(100) for module in (eager, twin)]
    for module, tree in zip((eager, twin), trees):
        module.tree_update(tree, torch.arange(100), torch.rand(100, generator=torch.Generator().manual_seed(1)))
        module.tree_update(tree, torch.tensor([5, 5, 9]), torch.tensor([0.0, 2.0, 3.0]))
    assert torch.equal(trees[0], trees[1])
    samples = []
    for module, tree in zip((eager, twin), trees):
        torch.manual_seed(3)
        samples.append(module.tree_sample(tree, 64, 0.6))
    assert torch.equal(samples[0][0], samples[1][0]) and torch.equal(samples[0][1], samples[1][1])


def test_math_and_sampler_compile_whole_and_equal_eager(mods):
    """fullgraph=True: no graph break in the targets, the priority mix, the sum tree's update and walk, the
    sequence gather and the replay write, and their in-place writes functionalized as a captured graph needs: the
    graphs (aot_eager: dynamo and AOT autograd, no kernels to build) give the eager results. Inductor's kernels for
    them are checked against eager in the compiled update below (the replay write: run in the --compile smoke test)."""
    twin = mods[TWIN]
    inputs = random_sequences(20, 6, 4, seed=2)
    compiled = torch.compile(twin.nstep_double_q_targets, fullgraph=True, backend="aot_eager")
    got, want = compiled(*inputs, 0.99, 5, 1e-3), twin.nstep_double_q_targets(*inputs, 0.99, 5, 1e-3)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    assert torch.equal(got[1], want[1])
    abs_td, valid = torch.rand(19, 6), torch.rand(19, 6) < 0.8
    mix = torch.compile(twin.priority_mix, fullgraph=True, backend="aot_eager")(abs_td, valid, 0.9)
    torch.testing.assert_close(mix, twin.priority_mix(abs_td, valid, 0.9))
    tree, reference = twin.new_sum_tree(300), twin.new_sum_tree(300)
    values = torch.rand(300) * (torch.rand(300) < 0.7)
    torch.compile(twin.tree_update, fullgraph=True, backend="aot_eager")(tree, torch.arange(300), values)
    twin.tree_update(reference, torch.arange(300), values)
    assert torch.equal(tree, reference)
    index, weights = torch.compile(twin.tree_sample, fullgraph=True, backend="aot_eager")(tree, 256, 0.6)
    assert (values[index] > 0).all() and weights.max() == 1.0
    p = values[index].double()
    torch.testing.assert_close(weights.double(), (p / p.min()) ** -0.6, rtol=1e-5, atol=1e-6)
    store, _, _ = drive(twin, "CartPole-v1", 2, 2 * 40, 120, 2, 6, 2, 8, seed=1)
    index = torch.tensor([0, 1, 11, 12])
    batch = torch.compile(twin.sample_sequences, fullgraph=True, backend="aot_eager")(store, index, 8)
    for key, value in twin.sample_sequences(store, index, 8).items():
        assert torch.equal(batch[key], value), key
    write = copy.deepcopy(store)
    step = (
        torch.ones(2, 4),
        torch.tensor([True, False]),
        torch.tensor([1, 0]),
        torch.ones(2),
        *torch.zeros(2, 2).bool(),
    )
    torch.compile(twin.store_add, fullgraph=True, backend="aot_eager")(write, *step)
    twin.store_add(store, *step)
    for key, value in store.items():
        assert torch.equal(write[key], value), key


# aot_eager in CI (Dynamo's whole graph, eager's kernels and random numbers); inductor's kernels with -m slow (27 s in a
# cold CI run)
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_policy_step_compiles_whole_and_explores_as_told(mods, backend):
    twin = mods[TWIN]
    torch.manual_seed(0)
    net = twin.QNetwork((2,), 3, 16)
    obs, prev_a, prev_r = torch.randn(64, 2), torch.randint(0, 3, (64,)), torch.randn(64)
    first, h, c = torch.rand(64) < 0.3, torch.randn(64, 16), torch.randn(64, 16)
    with torch.no_grad():
        q, (want_h, want_c) = net(obs[None], prev_a[None], prev_r[None], first[None], (h, c))
    greedy = q[0].argmax(dim=1)
    policy = torch.compile(partial(twin.act, net), fullgraph=True, backend=backend)
    epsilons = torch.zeros(64)
    actions, got_h, got_c = policy(obs, prev_a, prev_r, first, h, c, epsilons)
    assert torch.equal(actions, greedy)
    torch.testing.assert_close(got_h, want_h, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_c, want_c, rtol=1e-5, atol=1e-6)
    with torch._dynamo.config.patch(error_on_recompile=True):  # a new epsilon is data, not a new graph
        epsilons.fill_(1.0)
        draws = torch.cat([policy(obs, prev_a, prev_r, first, h, c, epsilons)[0] for _ in range(20)])
        assert set(draws.tolist()) == {0, 1, 2} and (draws != greedy.repeat(20)).float().mean() > 0.55
        epsilons.copy_(twin.actor_epsilons(64, 0.4, 7.0))
        draws = torch.stack([policy(obs, prev_a, prev_r, first, h, c, epsilons)[0] for _ in range(200)])
        differs = (draws != greedy).float().mean(dim=0)  # about 2/3 of epsilon_i: a random action can be the greedy one
        torch.testing.assert_close(differs[0], torch.tensor(0.4 * 2 / 3), atol=0.1, rtol=0)
        assert differs[-8:].sum() == 0 or differs[-8:].mean() < 0.01


def one_sequence_store(module, seed, num_envs=4, capacity=400, period=2, hidden=16, obs_size=4):
    """A store of the smoke run's shapes (TINY_CARTPOLE) with random data whose only sampleable slot is 3: every draw
    returns it (the compiled sampler's random numbers differ from eager ones, this batch does not)."""
    g = torch.Generator().manual_seed(seed)
    store = module.new_store(num_envs, capacity, period, hidden, (obs_size,), torch.float32)
    for _ in range(12):
        first = torch.rand(num_envs, generator=g) < 0.2
        step = (torch.randint(0, 2, (num_envs,), generator=g), torch.randn(num_envs, generator=g))
        ends = (torch.rand(num_envs, generator=g) < 0.1, torch.rand(num_envs, generator=g) < 0.1)
        module.store_add(store, torch.randn(num_envs, obs_size, generator=g), first, *step, *ends)
    slots = store["starts"].shape[0]
    module.store_state(
        store, torch.arange(slots), 2, torch.randn(slots, hidden, generator=g), torch.randn(slots, hidden, generator=g)
    )
    module.tree_update(store["tree"], torch.tensor([3]), torch.tensor([1.0]))
    return store


# aot_eager in CI: Dynamo's graphs and AOTAutograd's functionalized update, run with eager's kernels. Inductor's
# kernels, which the twin's --compile smoke run below builds and runs, are compared with -m slow (87 s in a cold CI run)
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_update_of_the_twin_equals_the_eager_update(mods, backend):
    """The twin's sample_and_update (tree walk, sequence gather, burn-in, targets, loss, fused Adam, priority
    write-back, masked target copy) compiled, against the eager sample/update/update_priorities and target copy; no
    recompile when the data or the copy flag changes. At the shapes and settings of the --compile smoke run below
    (with inductor, the smoke run then loads these kernels from its cache)."""
    eager, twin = mods[EAGER], mods[TWIN]
    args = args_from_flags(eager, TINY_CARTPOLE)
    torch.manual_seed(0)
    q_network, target_network = eager.QNetwork((4,), 2, 16), eager.QNetwork((4,), 2, 16)
    twin_q, twin_target = copy.deepcopy(q_network), copy.deepcopy(target_network)
    eager_optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate, eps=args.adam_eps)
    twin_optimizer = torch.optim.Adam(twin_q.parameters(), lr=args.learning_rate, eps=args.adam_eps, fused=True)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(twin.sample_and_update, backend=backend)
    for call, copy_target in enumerate([False, True, False]):
        store, twin_store = one_sequence_store(eager, seed=call), one_sequence_store(twin, seed=call)
        index = torch.full((8,), 3)
        batch = eager.sample_sequences(store, index, args.burn_in + args.seq_len)
        assert batch["obs"].shape == (4, 8, 4) and batch["h"].shape == (8, 16)
        hyper = (args.burn_in, args.gamma, args.n_step, args.value_rescale_eps, args.max_grad_norm, args.priority_eta)
        want, priorities = eager.update(q_network, target_network, eager_optimizer, batch, torch.ones(8), *hyper)
        eager.update_priorities(store, index, priorities, args.priority_exponent)
        if copy_target:
            target_network.load_state_dict(q_network.state_dict())
        with torch._dynamo.config.patch(error_on_recompile=call > 0):
            got = compiled(twin_q, twin_target, twin_optimizer, twin_store, args, torch.tensor(copy_target))
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(twin_store["tree"], store["tree"], rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(twin_store["max_priority"], store["max_priority"], rtol=1e-4, atol=1e-6)
        for name, module, twin_module in (("q", q_network, twin_q), ("target", target_network, twin_target)):
            for (key, value), twin_value in zip(module.state_dict().items(), twin_module.state_dict().values()):
                torch.testing.assert_close(twin_value, value, rtol=1e-4, atol=1e-5, msg=f"{name} {key} {call}")
    assert not torch.equal(q_network.lstm.weight_hh, target_network.lstm.weight_hh)
    # the only graph breaks are those torch.compile places around zero_grad(), backward() and the optimizer step
    breaks = dict(torch._dynamo.utils.counters["graph_break"])
    assert sum(breaks.values()) == GRAPH_BREAKS, breaks
    for reason in breaks:
        assert any(own in reason for own in PYTORCH_OWN_BREAKS), reason


# torch 2.13: zero_grad (2: traced once, then again after the restart), backward (1), Optimizer.step's own
# graph_break() (2) and the fused Adam kernel, which torch.compile leaves to eager (2)
GRAPH_BREAKS = 7
PYTORCH_OWN_BREAKS = ("Optimizer.zero_grad", "Tensor.backward()", "torch._dynamo.graph_break()", "fused optimizer")


# ---------------------------------------------------------------- the GPU path on the CPU: devices, host reads, speed


class OnlyMeta(TorchDispatchMode):
    """Records every op that makes a tensor off the meta device (a tensor created without `device=`)."""

    def __init__(self):
        super().__init__()
        self.off_meta = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self.off_meta.append(f"{func} made a {t.device.type} tensor {tuple(t.shape)}")
        return out


def test_the_twin_step_functions_run_on_the_meta_device(mods, monkeypatch):
    """Issue 16 item 4: the policy step, the replay write, the sequence bookkeeping, the sum tree's walk and update,
    the sequence gather, the update (burn-in, targets, loss, Adam, priorities) and the whole sample_and_update run with
    every tensor on `meta`: a host read (.item(), nonzero, ...) raises there, and no op makes a tensor elsewhere (a
    tensor created without `device=` would be a CPU one). The one exception: the fused Adam kernel has no meta kernel,
    so the optimizer here is Adam's foreach form (capturable, as on CUDA)."""
    twin = mods[TWIN]
    meta, E, H, A, B = torch.device("meta"), 4, 16, 3, 8
    empty = lambda *shape, dtype=torch.float32: torch.empty(*shape, dtype=dtype, device=meta)
    flags = lambda: empty(E, dtype=torch.bool)
    adam = importlib.import_module("torch.optim.adam")
    supported = adam._get_capturable_supported_devices
    monkeypatch.setattr(
        adam, "_get_capturable_supported_devices", lambda supports_xla=True: [*supported(supports_xla), "meta"]
    )
    q_network, target_network = twin.QNetwork((2,), A, H).to(meta), twin.QNetwork((2,), A, H).to(meta)
    optimizer = torch.optim.Adam(q_network.parameters(), lr=1e-3, eps=1e-3, foreach=True, capturable=True)
    store = twin.new_store(E, E * 40, 4, H, (2,), torch.float32, meta)
    args = twin.Args(burn_in=2, seq_len=4, overlap=2, batch_size=B, hidden_size=H)
    with OnlyMeta() as mode:
        assert torch.arange(2).device.type == "cpu" and mode.off_meta  # the check sees a tensor made without device=
        mode.off_meta.clear()
        obs, prev_actions, state = empty(E, 2), empty(E, dtype=torch.long), (empty(E, H), empty(E, H))
        actions, h, c = twin.act(q_network, obs, prev_actions, empty(E), flags(), *state, empty(E))
        twin.store_add(store, empty(E, 2), flags(), actions, empty(E), flags(), flags())
        twin.store_state(store, twin.sequence_slots(store, 8), 8, h, c)
        twin.add_sequences(store, 14, 6, 2, 0.9)
        index, weights = twin.tree_sample(store["tree"], B, 0.6)
        batch = twin.sample_sequences(store, index, 6)
        hyper = (args.burn_in, args.gamma, args.n_step, args.value_rescale_eps, args.max_grad_norm, args.priority_eta)
        out, priorities = twin.update(q_network, target_network, optimizer, batch, weights, *hyper)
        twin.update_priorities(store, index, priorities, 0.9)
        out_too = twin.sample_and_update(
            q_network, target_network, optimizer, store, args, torch.tensor(True, device=meta)
        )
    assert mode.off_meta == []
    for t in (actions, h, c, index, weights, *batch.values(), *out.values(), *out_too.values(), priorities):
        assert t.device == meta
    assert actions.shape == (E,) and index.shape == weights.shape == priorities.shape == (B,)
    assert batch["obs"].shape == (6, B, 2) and batch["h"].shape == (B, H) and set(out) == {"loss", "q_values"}


def step_arrays(seed, num_envs=3):
    """A step's host arrays as the twin uploads them: Atari obs stacks, episode starts, rewards, ends."""
    rng = np.random.default_rng(seed)
    obs = rng.integers(0, 256, (num_envs, 4, 84, 84), dtype=np.uint8)
    flags = [rng.random(num_envs) < 0.5 for _ in range(3)]
    return obs, flags[0], rng.standard_normal(num_envs).astype(np.float32), *flags[1:]


def test_packed_lays_a_step_out_in_one_buffer_and_pins_it_for_a_gpu(mods, monkeypatch):
    """Issue 42: the twin's step upload. Each array has a view in the host buffer and one in the device copy, end to
    end at 16-byte boundaries (float32 and bool views of the bytes); the reset's arrays are there at once, and
    upload() sends a step's in one copy (float64 rewards as float32, as torch.as_tensor(..., dtype=float32) makes
    them). For a GPU the host buffer is pinned and the copy is made on the GPU."""
    twin = mods[TWIN]
    reset = step_arrays(0)
    upload, host, on_device = twin.packed(reset, torch.device("cpu"))
    for x, in_host, in_device in zip(reset, host, on_device, strict=True):
        assert in_host.dtype == in_device.dtype == torch.from_numpy(x).dtype and in_device.is_contiguous()
        assert np.array_equal(in_host.numpy(), x) and np.array_equal(in_device.numpy(), x)
    starts = [view.storage_offset() * view.element_size() for view in on_device]  # in bytes
    assert starts == [0, 3 * 4 * 84 * 84, 3 * 4 * 84 * 84 + 16, 3 * 4 * 84 * 84 + 32, 3 * 4 * 84 * 84 + 48]
    assert len({view.untyped_storage().data_ptr() for view in on_device}) == 1  # one buffer: one copy
    step = step_arrays(1)
    upload(*step[:2], step[2].astype(np.float64), *step[3:])
    for x, in_device in zip(step, on_device, strict=True):
        assert np.array_equal(in_device.numpy(), x)
    made, zeros = [], torch.zeros
    monkeypatch.setattr(
        torch, "zeros", lambda *shape, pin_memory, dtype: made.append(pin_memory) or zeros(*shape, dtype=dtype)
    )
    monkeypatch.setattr(torch, "zeros_like", lambda t, device: made.append(device) or zeros(t.shape, dtype=t.dtype))
    twin.packed(reset, torch.device("cuda"))
    assert made == [True, torch.device("cuda")]


# the twin's host reads at the tiny regression flags (tests/regression.py R2D2: 150 iterations of 4 envs, a gradient
# step every other iteration from env step 200), by line; the same with --cudagraphs
HOST_READS = {
    # the actions go to the env once per iteration: envpool steps on numpy actions (.numpy() of the CPU copy is free)
    f"cpu at {TWIN}.py: next_obs, rewards, terminations, truncations, infos = envs.step(actions.cpu().numpy())": 150,
    f"numpy at {TWIN}.py: next_obs, rewards, terminations, truncations, infos = envs.step(actions.cpu().numpy())": 150,
    # the losses, both in one read, at the log points (every 100 env steps) after a new gradient step: 300, ..., 600
    "tolist at bookkeeping.py: values = torch.stack([v.detach().float() for v in values]).tolist()": 4,
    # numpy's views of the step upload's host buffer, made once (a host tensor's: no sync)
    f"numpy at {TWIN}.py: host_arrays = [view.numpy() for view in views(host)]": 5,
}


# with --compile the compiler reads the 0-d CPU target-copy flag as it traces the update (not a GPU's)
COMPILE_READS = {
    f"item at {TWIN}.py: out = update_step(copy_yes if updates % args.target_network_frequency == 0 else copy_no)": 1
}


def pinned_host_reads(flags):
    """tests/test_gpu_path.py counts the --cudagraphs and --compile --cudagraphs runs."""
    return {**HOST_READS, **(COMPILE_READS if "--compile" in flags else {})}


# the twin's copies of host data to the device in that run, by line (tests/gpu_standin.py uploads())
UPLOADS = {
    # issue 42: one upload a step (150) and one of the reset: the step's obs, episode starts, rewards and ends packed
    # into one host buffer, pinned where the device is a GPU, sent in one non_blocking copy
    f"non_blocking copy_ at {TWIN}.py: up.copy_(host, non_blocking=True) from the buffer made at {TWIN}.py: host = "
    'torch.zeros(int(starts[-1]), dtype=torch.uint8, pin_memory=device.type == "cuda")': 151,
    # once, at the reset: the buffer's layout (numpy's arrays as tensors, no copy), the eager script's first store write
    f"from host data at {TWIN}.py: tensors = [torch.from_numpy(x) for x in arrays]": 5,
    f"from host data at {TWIN}.py: to_store = lambda x, dtype=None: torch.as_tensor(x, dtype=dtype)"
    ".to(store_device)": 6,
}


def pinned_uploads(flags):
    """The same with --cudagraphs and --compile --cudagraphs (tests/test_gpu_path.py counts them): a CUDA graph's
    input copies are tensordict's, not the script's."""
    return UPLOADS


def test_host_reads_and_uploads_of_the_twin_are_the_pinned_ones(mods, tmp_path):
    """Issue 16 item 3: a new host read in the twin's loop fails here, naming its line; issue 42: so does a new copy of
    host data to the device (the step's went up in six copies from pageable memory, 906 in this run)."""
    with host_reads() as counts, uploads() as copies:
        run_main(mods[TWIN], list(PAIRS[EAGER]), tmp_path)
    assert dict(counts) == pinned_host_reads([])
    assert dict(copies) == pinned_uploads([])


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


# CartPole at the tiny sizes with the defaults' 20 iterations per gradient step (640 / 32): 200 iterations of 4 envs,
# gradient steps at env steps 240, 320, ..., 720 (iterations 60, 80, ..., 180)
PER_20_ITERATIONS = ("--env-id", "CartPole-v1", "--num-envs", "4", "--hidden-size", "16", "--burn-in", "1")
PER_20_ITERATIONS += ("--seq-len", "3", "--overlap", "1", "--batch-size", "8", "--train-frequency", "80")
PER_20_ITERATIONS += ("--buffer-size", "400", "--learning-starts", "200", "--target-network-frequency", "10")
PER_20_ITERATIONS += (
    "--total-timesteps",
    "800",
)


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("measure_burnin", [None, 0])
def test_steps_per_second_leave_out_the_update_warmup_and_capture(mods, name, measure_burnin, tmp_path, monkeypatch):
    """Issue 16 item 6: steps/s are measured from --measure-burnin iterations after learning starts. A fake clock: an
    env step takes 1 s, a Python call of the update 1000 s (the twin's under --cudagraphs: its two warm-up calls and
    the capture, which runs it twice; a replay runs no Python), the eager's first three calls alike. At the default
    --measure-burnin none of them is in the window: steps/s are 4 envs per second exactly; with 0 the window opens as
    the first gradient step's iteration begins."""
    module = mods[name]
    clock = Clock()
    monkeypatch.setattr(bk.time, "time", clock)
    make_env = module.make_env

    def make_timed_env(*args, **kwargs):
        envs = make_env(*args, **kwargs)
        step = envs.step

        def timed_step(actions):
            clock.now += 1.0
            return step(actions)

        envs.step = timed_step
        return envs

    monkeypatch.setattr(module, "make_env", make_timed_env)
    slow_name = "sample_and_update" if name == TWIN else "update"
    slow_function, python_calls = getattr(module, slow_name), []

    def slow_update(*args, **kwargs):
        python_calls.append(clock.now)
        if name == TWIN or len(python_calls) <= 3:
            clock.now += 1000.0
        return slow_function(*args, **kwargs)

    monkeypatch.setattr(module, slow_name, slow_update)
    flags = [*PER_20_ITERATIONS] + ([] if measure_burnin is None else ["--measure-burnin", str(measure_burnin)])
    in_process = partial(run_main, cudagraphs=True) if name == TWIN else main_in_process  # the twin on the stand-in
    line, _ = in_process(module, flags, tmp_path)
    assert line["status"] == "ok" and line["steps"] == 800 and line["updates"] == 7
    slow = 4000.0 if name == TWIN else 3000.0
    if name == TWIN:
        assert len(python_calls) == 4  # 2 warm-up calls, the capture's 2 runs; the 4 later calls replay
    if measure_burnin is None:
        assert line["sps"] == pytest.approx(4.0, rel=1e-9)  # iterations 160-199: 4 env steps per second
        assert module.Args().measure_burnin == 100
    else:
        assert line["sps"] == pytest.approx((800 - 240) / (140 + slow), rel=1e-9)  # from iteration 60 on


def test_the_default_burnin_covers_the_capture_at_the_default_train_frequency(mods):
    """CudaGraphModule(warmup=3) captures the update at its 3rd call: 2 gradient steps (of 640 / 32 = 20 iterations
    each) after learning starts at the defaults; the default --measure-burnin leaves out more than 3 of them."""
    for name in SCRIPTS:
        args = mods[name].Args()
        assert args.measure_burnin > 3 * args.train_frequency // args.num_envs


@pytest.mark.parametrize("name", SCRIPTS)
def test_track_logs_cleanrl_dqn_keys_every_100_steps(mods, name, tmp_path, fake_wandb):
    """Issue 17 item 5: with --track, wandb gets the DQN family's keys (R2D2 has no CleanRL script): charts/SPS every
    100 env steps, losses/td_loss and losses/q_values there after a new gradient step, the values the results line
    reports at the end; charts/episodic_return and charts/episodic_length per game (CartPole pays 1 per step: a game's
    length is its return)."""
    line, _ = (run_main if name == TWIN else main_in_process)(mods[name], [*TINY_CARTPOLE, "--track"], tmp_path)
    keys = {"charts/SPS", "charts/episodic_return", "charts/episodic_length", "losses/td_loss", "losses/q_values"}
    assert fake_wandb.keys() == keys and fake_wandb.finished
    games = [data for _, data in fake_wandb.logs if "charts/episodic_return" in data]
    assert len(games) == line["episodes"] >= 10
    assert all(data["charts/episodic_length"] == data["charts/episodic_return"] for data in games)
    assert isinstance(games[0]["charts/episodic_length"], int)
    assert [step for step, data in fake_wandb.logs if "charts/SPS" in data] == [100, 200, 300, 400, 500, 600]
    losses = [(step, data) for step, data in fake_wandb.logs if "losses/td_loss" in data]
    assert [step for step, _ in losses] == [300, 400, 500, 600]  # the first gradient step is at env step 200
    step, last = losses[-1]
    assert last["losses/td_loss"] == line["losses"]["loss"] and last["losses/q_values"] == line["losses"]["q_values"]


# ---------------------------------------------------------------- scripts end to end


def last_mean(line, tmp_path, k=20):
    returns = [score for _, score in curve_points(line, tmp_path)]
    return float(np.mean(returns[-k:])), len(returns)


@pytest.mark.parametrize("name,flags", [(EAGER, ()), (TWIN, ())])
def test_smoke_tiny_budget_on_breakout(name, flags, tmp_path):
    proc, lines = run_script(name, *TINY_ATARI, "200", *flags, tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = lines
    assert_finite_results_line(line, name)
    assert_summary_matches(proc.stdout, line, tmp_path / "results.jsonl")
    assert line["steps"] == 200 and line["mode"] == "train" and line["buffer_device"] == "cpu"
    assert line["compile"] is ("--compile" in flags) and line["cudagraphs"] is False
    assert line["updates"] == (200 - 40) // 4 and line["env_id"] == "Breakout-v5"
    assert line["buffer_bytes"] == 400 * (84 * 84 + 15) + 100 * (8 + 2 * 32 * 4) + 2 * 128 * 4 + 12
    curve = read_curve(line, tmp_path).splitlines()
    assert curve[0] == "step,wall_s,return" and len(curve) == line["episodes"] + 1


@pytest.mark.parametrize("name,flags", [(EAGER, ()), (TWIN, ("--compile",))])
def test_smoke_tiny_budget_on_cartpole(name, flags, tmp_path):
    """Both files end to end on the vector path; the twin with --compile (policy step and update compiled)."""
    proc, lines = run_script(name, *TINY_CARTPOLE, *flags, "--save-model", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = lines
    assert_finite_results_line(line, name)
    assert_summary_matches(proc.stdout, line, tmp_path / "results.jsonl")
    assert line["steps"] == 600 and line["updates"] == (600 - 200) // 8 and line["env_id"] == "CartPole-v1"
    assert line["compile"] is ("--compile" in flags) and line["episodes"] >= 10
    assert len(read_curve(line, tmp_path).splitlines()) == line["episodes"] + 1
    # the checkpoint plays full episodes
    checkpoint = tmp_path / line["run_name"] / f"{name}.pt"
    proc, lines = run_script(name, "--eval-checkpoint", str(checkpoint), "--eval-episodes", "3", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    evaluation = lines[-1]
    assert evaluation["mode"] == "eval" and evaluation["status"] == "ok"
    assert evaluation["episodes"] == 3 and 8 <= evaluation["mean_return"] <= 500
    assert evaluation["steps"] > 0 and evaluation["env_id"] == "CartPole-v1"
    assert_summary_matches(proc.stdout, evaluation, tmp_path / "results.jsonl")


@pytest.mark.parametrize("name", SCRIPTS)
def test_runs_are_deterministic(name, tmp_path):
    runs = []
    for i in range(2):
        (tmp_path / str(i)).mkdir()
        proc, lines = run_script(name, *TINY_CARTPOLE, tmp_path=tmp_path / str(i))
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(lines[0])
    assert runs[0]["updates"] == 50 and runs[0]["episodes"] >= 10
    for key in ("losses", "mean_return", "episodes", "steps"):
        assert runs[0][key] == runs[1][key], key
    curves = [read_curve(line, tmp_path / str(i)) for i, line in enumerate(runs)]
    assert [row.split(",")[::2] for row in curves[0].splitlines()] == [
        row.split(",")[::2] for row in curves[1].splitlines()
    ]


@pytest.mark.parametrize("name", SCRIPTS)
def test_non_finite_loss_stops_the_run_as_diverged(name, tmp_path):
    # a huge step size: the weights blow up after the first steps, the Q-values and the loss overflow
    proc, lines = run_script(name, *TINY_CARTPOLE, "--learning-rate", "1e30", tmp_path=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    [line] = lines  # parsed strictly: no NaN in the file
    assert line["status"] == "diverged" and line["message"].startswith("loss diverged at step ")
    assert f"{name}.py: {line['message']}" in proc.stderr
    assert_summary_matches(proc.stdout, line, tmp_path / "results.jsonl")


# ---------------------------------------------------------------- bad input


BAD_INPUTS = [
    (("--env-id", "NotAGame-v5"), "--env-id"),
    (("--env-id", "HalfCheetah-v4"), "--env-id"),
    (("--env-id", "Pendulum-v1"), "--env-id"),  # continuous actions
    (("--env-id", "Pong-v5", "--mask-velocity", "True"), "--mask-velocity"),
    (("--batch-size", "100000"), "--batch-size"),
    (("--buffer-size", "1000"), "--buffer-size"),
    (("--buffer-size", "0"), "--buffer-size"),
    (("--batch-size", "-1"), "--batch-size"),
    (("--num-envs", "0"), "--num-envs"),
    (("--seq-len", "0"), "--seq-len"),
    (("--n-step", "0"), "--n-step"),
    (("--burn-in", "-1"), "--burn-in"),
    (("--overlap", "80"), "--overlap"),
    (("--train-frequency", "0"), "--train-frequency"),
    (("--target-network-frequency", "0"), "--target-network-frequency"),
    (("--gamma", "1.5"), "--gamma"),
    (("--learning-starts", "100"), "--learning-starts"),
    (("--learning-starts", "10000000"), "--learning-starts"),
    (("--total-timesteps", "10"), "--total-timesteps"),
    (("--buffer-device", "tpu"), "--buffer-device"),
    (("--buffer-device", "cuda"), "--buffer-device"),
    (("--buffer-size", "100000000000"), "--buffer-size"),  # 700 TB: more than this machine has
    (("--learning-rate", "-1"), "--learning-rate"),
    (("--learning-rate", "0"), "--learning-rate"),
]


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("flags,flag", BAD_INPUTS)
def test_bad_input_exits_2_with_one_line(mods, name, flags, flag, capsys, tmp_path):
    args = args_from_flags(mods[name], flags)
    assert_main_exits_2_with_one_line(mods[name], name, args, flag, capsys, tmp_path)


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("where", ["a folder", "under a file"])
def test_a_results_file_that_cannot_be_written_exits_2_with_one_line(mods, name, where, capsys, tmp_path):
    """--results-file naming a folder, or a path under a file: one line, exit 2, before any work; nothing written."""
    (tmp_path / "a_file").write_text("")
    results = tmp_path if where == "a folder" else tmp_path / "a_file" / "results.jsonl"
    with pytest.raises(SystemExit) as exit_info:
        mods[name].main(args_from_flags(mods[name], ("--results-file", str(results), "--cuda", "False")))
    assert exit_info.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith(f"{name}.py: error: --results-file {results}"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"] and (tmp_path / "a_file").read_text() == ""


@pytest.mark.parametrize("flags", [("--cudagraphs",), ("--cudagraphs", "--buffer-device", "cpu")])
def test_cudagraphs_without_cuda_exits_2_from_the_command_line(flags, tmp_path):
    proc, lines = run_script(TWIN, *TINY_CARTPOLE, *flags, tmp_path=tmp_path)
    assert proc.returncode == 2
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert err == [f"{TWIN}.py: error: --cudagraphs needs CUDA, and none is available"], proc.stderr
    assert lines == []


def test_classic_control_and_other_atari_games_are_accepted(mods):
    for name in SCRIPTS:
        for env_id in ("Pong-v5", "CartPole-v1", "Acrobot-v1"):
            mods[name].check_env_id(env_id)  # no exit


def test_scripts_import_without_side_effects():
    for name in SCRIPTS:
        assert name in sys.modules or load_script(name)


# ---------------------------------------------------------------- learning


@pytest.mark.parametrize("name", [EAGER])
def test_learns_velocity_masked_cartpole_short(name, tmp_path):
    """CI check: the small-task settings (CARTPOLE above) on CartPole-v1 without its velocities learn within 30k
    steps (about 30 s). Random play averages about 22. Last-20 means measured at 30k, seeds 1-4: 261, 259, 145, 353;
    the bar leaves room for another CPU's float rounding (the 300k bar of issue 9 is the slow test's)."""
    proc, lines = run_script(name, *CARTPOLE, "--total-timesteps", "30000", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    mean, episodes = last_mean(lines[0], tmp_path)
    assert episodes >= 20 and mean >= 100, (mean, episodes)


@pytest.mark.slow
@pytest.mark.parametrize("name,flags", [(EAGER, ()), (TWIN, ("--compile",))])
def test_learns_velocity_masked_cartpole_within_300k_steps(name, flags, tmp_path):
    """Issue 9's bar: on CartPole-v1 without its velocities, the mean of the last 20 episodes is at least 150 after
    300k steps, with the small-task settings (CARTPOLE above). Measured, seed 1, on a shared 2-core CPU
    (one thread each, other jobs running):
    eager: 273 s under pytest (676 s beside other jobs), last-20 mean 315 at 300k (100-episode mean 348); the curve's
    last-20 mean is >= 150 from 80k on (202 at 20k, 131 at 60k);
    twin --compile: 181 s under pytest (compiling included), last-20 mean 440 at 300k (100-episode mean 372);
    >= 150 from 40k on (141 at 20k).
    """
    proc, lines = run_script(name, *CARTPOLE, "--total-timesteps", "300000", *flags, tmp_path=tmp_path, timeout=3000)
    assert proc.returncode == 0, proc.stderr[-3000:]
    mean, episodes = last_mean(lines[0], tmp_path)
    assert episodes >= 20 and mean >= 150, (mean, episodes)
