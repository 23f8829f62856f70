"""The replay buffer of the SAC and TD3 pairs (the four scripts define the same one): wrap-around, uniform sampling
of the filled rows only, the twins' device-side count compiling whole, and gymnasium 1.x autoreset's true final
observations kept for truncated transitions. Also the twins' Adam written as tensor ops, against torch.optim.Adam."""

import functools
import math

import numpy as np
import pytest
import torch
from conftest import load_script

EAGERS = ("sac_continuous_action", "td3_continuous_action")
TWINS = tuple(f"{name}_torchcompile" for name in EAGERS)
SCRIPTS = EAGERS + TWINS
MODULES = {name: load_script(name) for name in SCRIPTS}


def numbered(rows, obs_dim=3, act_dim=2, start=0):
    """Transitions whose every field holds its row number (so a sampled row says where it came from)."""
    ids = torch.arange(start, start + rows, dtype=torch.float32)
    return dict(
        obs=ids[:, None].expand(rows, obs_dim).clone(),
        actions=ids[:, None].expand(rows, act_dim).clone(),
        rewards=ids.clone(),
        next_obs=ids[:, None].expand(rows, obs_dim).clone() + 0.5,
        terminations=(ids % 2 == 0).float(),
    )


def start_count(name):
    return torch.zeros((), dtype=torch.long) if name in TWINS else 0


@pytest.mark.parametrize("name", SCRIPTS)
def test_buffer_add_wraps_around_and_overwrites_the_oldest_rows(name):
    module = MODULES[name]
    buffer = module.make_buffer(5, 3, 2, "cpu")
    assert set(buffer) == {"obs", "actions", "rewards", "next_obs", "terminations"}
    assert buffer["obs"].shape == (5, 3) and buffer["actions"].shape == (5, 2) and buffer["rewards"].shape == (5,)
    count = start_count(name)
    for start in (0, 2, 4):  # 3 vector steps of 2 envs: rows 0-1, 2-3, then 4 and (wrapped) 0
        count = module.buffer_add(buffer, count, numbered(2, start=start))
    assert int(count) == 6
    assert buffer["rewards"].tolist() == [5.0, 1.0, 2.0, 3.0, 4.0]
    assert buffer["obs"][0].tolist() == [5.0] * 3 and buffer["next_obs"][0].tolist() == [5.5] * 3
    assert buffer["actions"][4].tolist() == [4.0, 4.0] and buffer["terminations"].tolist() == [0, 0, 1, 0, 1]


@pytest.mark.parametrize("name", SCRIPTS)
def test_buffer_samples_only_filled_rows_uniformly(name):
    module = MODULES[name]
    buffer = module.make_buffer(100, 3, 2, "cpu")
    count = module.buffer_add(buffer, start_count(name), numbered(10))
    torch.manual_seed(0)
    batch = module.buffer_sample(buffer, count, 20000)
    rows = batch["rewards"].long()
    assert rows.min() == 0 and rows.max() == 9, "only the 10 filled rows"
    # a row's fields stay together
    assert torch.equal(batch["obs"][:, 0], batch["rewards"]) and torch.equal(batch["next_obs"][:, 1], rows + 0.5)
    freq = torch.bincount(rows, minlength=10).float() / 20000
    assert (freq - 0.1).abs().max() < 0.015, freq  # about 7 standard deviations of a binomial(20000, 0.1) share
    # once full, every row can be drawn
    count = module.buffer_add(buffer, count, numbered(95, start=10))
    assert int(count) == 105
    rows = module.buffer_sample(buffer, count, 20000)["rewards"].long()
    assert set(rows.tolist()) == set(range(5, 105))


@pytest.mark.parametrize("name", TWINS)
def test_twin_buffer_functions_compile_whole(name):
    twin = MODULES[name]
    buffer = twin.make_buffer(50, 3, 2, "cpu")
    add = torch.compile(twin.buffer_add, fullgraph=True)
    sample = torch.compile(twin.buffer_sample, fullgraph=True)
    count = torch.zeros((), dtype=torch.long)
    with torch._dynamo.config.patch(error_on_recompile=False):
        count = add(buffer, count, numbered(4))
    with torch._dynamo.config.patch(error_on_recompile=True):
        for start in range(4, 60, 4):
            count = add(buffer, count, numbered(4, start=start))
        assert int(count) == 60 and buffer["rewards"][:10].tolist() == list(range(50, 60))
        rows = sample(buffer, count, 4096)["rewards"].long()
    assert rows.min() >= 10 and rows.max() <= 59 and len(set(rows.tolist())) == 50


@pytest.mark.parametrize("name", SCRIPTS)
def test_truncated_transitions_keep_their_true_final_observation(name, monkeypatch):
    """Three InvertedPendulum envs with a 6-step limit and random actions: episodes end by termination (the pole
    falls) and by truncation. The buffer must hold each step's true next obs, not the obs the autoreset began the next
    episode with, and mark only the terminated transitions."""
    module = MODULES[name]
    monkeypatch.setattr(module.gym, "make", functools.partial(module.gym.make, max_episode_steps=6))
    envs = module.make_envs("InvertedPendulum-v4", 3)
    buffer = module.make_buffer(200, 4, 1, "cpu")
    count = start_count(name)
    rng = np.random.default_rng(0)
    obs, _ = envs.reset(seed=0)
    seen = {"terminated": 0, "truncated": 0}
    ended = np.zeros((60, 3), dtype=bool)
    for step in range(60):
        actions = rng.uniform(-3, 3, size=(3, 1)).astype(np.float32)
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        transition = dict(
            obs=torch.as_tensor(obs, dtype=torch.float32),
            actions=torch.as_tensor(actions),
            rewards=torch.as_tensor(rewards, dtype=torch.float32),
            next_obs=torch.as_tensor(module.real_next_obs(next_obs, infos), dtype=torch.float32),
            terminations=torch.as_tensor(terminations, dtype=torch.float32),
        )
        count = module.buffer_add(buffer, count, transition)
        rows = slice(3 * step, 3 * step + 3)
        for i in range(3):
            if terminations[i] or truncations[i]:
                final = torch.as_tensor(infos["final_obs"][i], dtype=torch.float32)
                assert torch.equal(buffer["next_obs"][rows][i], final)
                assert not torch.equal(buffer["next_obs"][rows][i], torch.as_tensor(next_obs[i], dtype=torch.float32))
                seen["terminated" if terminations[i] else "truncated"] += 1
            else:
                assert torch.equal(buffer["next_obs"][rows][i], torch.as_tensor(next_obs[i], dtype=torch.float32))
            assert buffer["terminations"][rows][i] == float(terminations[i])  # truncation does not stop the bootstrap
        ended[step] = terminations | truncations
        obs = next_obs  # the next transition starts from the reset obs where an episode ended
    envs.close()
    assert seen["terminated"] >= 3 and seen["truncated"] >= 3, seen
    # one env's consecutive transitions chain up (obs = the previous next obs) except across an episode end
    obs_rows, next_rows = buffer["obs"][3:180].view(59, 3, 4), buffer["next_obs"][:177].view(59, 3, 4)
    chained = (obs_rows == next_rows).all(-1).numpy()
    assert (chained == ~ended[:59]).all()


# ---------------------------------------------------------------- the twins' Adam


@pytest.mark.parametrize("name", TWINS)
def test_twin_adam_step_equals_torch_adam_in_float64(name):
    """The twins step Adam with tensor ops (so that it compiles into the update's graph); over 20 steps of gradients of
    mixed scales it moves float32 parameters as torch.optim.Adam moves float64 copies, compiled whole as well."""
    module = MODULES[name]
    g = torch.Generator().manual_seed(0)
    shapes = [(4, 3), (3,), (1,)]
    start = [torch.randn(shape, generator=g) for shape in shapes]
    grads = [[torch.randn(shape, generator=g) * 10.0 ** torch.randint(-3, 2, (), generator=g) for shape in shapes]
             for _ in range(20)]  # fmt: skip
    reference = [p.double().requires_grad_() for p in start]
    torch_adam = torch.optim.Adam(reference, lr=3e-3)
    eager_params, compiled_params = [p.clone() for p in start], [p.clone() for p in start]
    eager_adam = module.make_adam(eager_params, lr=3e-3)
    compiled_adam = module.make_adam(compiled_params, lr=3e-3)
    compiled_step = torch.compile(module.adam_step, fullgraph=True)
    for i, step_grads in enumerate(grads):
        for p, grad in zip(reference, step_grads):
            p.grad = grad.double()
        torch_adam.step()
        module.adam_step(eager_adam, step_grads)
        with torch._dynamo.config.patch(error_on_recompile=i > 0):  # the step count is data, not a new graph
            compiled_step(compiled_adam, step_grads)
    for p, e, c, s in zip(reference, eager_params, compiled_params, start):
        torch.testing.assert_close(e, p.detach().float(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(c, p.detach().float(), rtol=1e-5, atol=1e-6)
        assert (e - s).abs().min() > 1e-3, "every parameter moved"
    assert eager_adam["step"].item() == compiled_adam["step"].item() == 20


@pytest.mark.parametrize("name", SCRIPTS)
def test_buffer_sample_draws_exact_uniform_rows_past_2_to_the_24(name):
    """Uniform over 1.5 * 2**24 filled rows, exactly. A float32 draw in [0, 1) scaled by the size (the twins' sampler
    once) has 2**24 values for more rows than that: past row 2**24 it rounds to even rows only (the odd ones are never
    drawn), and below it the values split unevenly over rows. Chi-square over the four cells (below or past 2**24) x
    (even or odd row), 2**18 draws; the twins draw 62-bit integers modulo the size (bias size / 2**62)."""
    size, draws = 3 * 2**23, 2**18
    # a zero-width obs keeps the buffer's row count; the rewards carry each row's number
    buffer = dict(obs=torch.empty(size, 0), rewards=torch.arange(size, dtype=torch.int32))
    count = torch.tensor(size) if name in TWINS else size
    torch.manual_seed(0)
    rows = MODULES[name].buffer_sample(buffer, count, draws)["rewards"].long()
    assert rows.min() >= 0 and rows.max() < size
    observed = torch.bincount((rows >= 2**24).long() * 2 + rows % 2, minlength=4).double()
    expected = torch.tensor([1 / 3, 1 / 3, 1 / 6, 1 / 6], dtype=torch.float64) * draws
    chi2 = ((observed - expected) ** 2 / expected).sum().item()
    assert chi2 < 25, (observed.tolist(), chi2)  # 3 degrees of freedom: p = 1.7e-5 at 25


@pytest.mark.parametrize("name", SCRIPTS)
def test_buffer_sample_favours_no_rows_at_a_million(name):
    """At 10**6 rows a float32 draw times the size maps 17 of its 2**24 values to some rows and 16 to the others: those
    rows would take 78.75% of the draws instead of their 77.72% share of the rows (25 standard deviations at 2**20)."""
    size, draws = 10**6, 2**20
    grid = torch.arange(2**24, dtype=torch.float32) / 2**24  # every value torch.rand draws in float32
    favoured = torch.bincount((grid * size).long(), minlength=size) == 17
    buffer = dict(obs=torch.empty(size, 0), rewards=torch.arange(size, dtype=torch.int32))
    count = torch.tensor(size) if name in TWINS else size
    torch.manual_seed(0)
    rows = MODULES[name].buffer_sample(buffer, count, draws)["rewards"].long()
    share, want = favoured[rows].double().mean().item(), favoured.double().mean().item()
    assert abs(share - want) < 5 * math.sqrt(want * (1 - want) / draws), (share, want)
