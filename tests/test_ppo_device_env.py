"""PPO with CartPole-v1 on the device and many seeds at once (leanrl/ppo_device_env.py, issue 49): its env and RNG
are pqn_device_env.py's (whose tests prove them against gymnasium and splitmix64's definition), its network and init
ppo_torchcompile.py's; GAE over the seed-major storage against the float64 reference, the loss of each seed against
the twin's loss of that seed alone, the categorical draw from a uniform, the clipping per seed; seed k of a batch
trained as seed k alone (a variant that clips or normalises advantages across seeds, or draws by batch position,
caught); compiled against eager; the whole iteration captured on the CPU stand-in; host reads; the script (smoke,
save and evaluate a seed, bad input) and learning."""

import copy
import csv

import gymnasium as gym
import pytest
import torch
from conftest import (
    args_from_flags,
    assert_finite_results_line,
    assert_main_exits_2_with_one_line,
    load_script,
    main_in_process,
    run_script,
)
from gpu_standin import CONTRACTS, host_reads, run_main
from reference import gae_reference, random_ppo_minibatch, random_rollout
from test_gpu_path import same_run
from test_many_seeds import per_seed_updates, seed_curve
from test_pqn_device_env import random_states

NAME = "ppo_device_env"
script, twin, pqn = load_script(NAME), load_script("ppo_torchcompile"), load_script("pqn_device_env")

# 4 iterations of 8 envs x 16 steps, 2 epochs of 2 minibatches (of 64): 16 updates
ENVS, STEPS, ITERATIONS = 8, 16, 4
TINY = ["--num-envs", str(ENVS), "--num-steps", str(STEPS), "--total-timesteps", str(ITERATIONS * ENVS * STEPS),
        "--update-epochs", "2", "--num-minibatches", "2", "--save-model"]  # fmt: skip


@pytest.fixture(autouse=True)
def one_torch_thread(monkeypatch):
    # the MLPs are tiny: a second intra-op thread only adds synchronisation on a busy 2-core machine
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


# ---------------------------------------------------------------- the env, the RNG and the network: the tested ones


def test_the_env_and_the_rng_are_pqn_device_envs_bit_for_bit():
    """cartpole_step and cartpole_reset on 3,000 random states at every threshold and time limit, and the
    counter-based draws of many seeds, counters and streams: equal to pqn_device_env.py's, which
    test_pqn_device_env.py compares with gymnasium's CartPole-v1 and test_many_seeds.py with splitmix64."""
    states, elapsed, actions = random_states(3000, seed=4)
    uniform = torch.rand(3000, 4, generator=torch.Generator().manual_seed(4))
    got = script.cartpole_step(states, elapsed, actions, script.cartpole_reset(uniform))
    want = pqn.cartpole_step(states, elapsed, actions, pqn.cartpole_reset(uniform))
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    seeds = torch.tensor([1, 2, 3, 1000, -5])
    for counter in (0, 1, 77, 2**40):
        for stream in (0, 1, 2, 3):
            got = script.counter_bits(seeds, torch.tensor([counter]), stream, 300)
            assert torch.equal(got, pqn.counter_bits(seeds, torch.tensor([counter]), stream, 300))


def test_each_seeds_agent_is_the_twins_and_agent_outputs_runs_each_on_its_own_obs():
    """Agent(4, 2) after torch.manual_seed(s) holds the twin's initial parameters for seed s (CleanRL's network and
    init); agent_outputs over three stacked agents gives each agent's logits and value of its own obs."""
    spaces = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")])
    agents = []
    for seed in (3, 4, 5):
        torch.manual_seed(seed)
        agents.append(script.Agent(4, 2))
        torch.manual_seed(seed)
        want = twin.Agent(spaces).state_dict()
        for key, value in agents[-1].state_dict().items():
            assert torch.equal(value, want[key]), key
    params = torch.func.stack_module_state(agents)[0]
    obs = torch.randn(3, 10, 4)
    logits, value = script.agent_outputs(copy.deepcopy(agents[0]).to("meta"), params, obs)
    for k, agent in enumerate(agents):
        torch.testing.assert_close(logits[k], agent.actor(obs[k]))
        torch.testing.assert_close(value[k], agent.critic(obs[k]).squeeze(-1))


# ---------------------------------------------------------------- the math, per seed


@pytest.mark.parametrize("shape", [(3, 37, 4), (1, 128, 4), (5, 16, 2)])
def test_gae_over_the_seed_major_storage_matches_the_float64_reference(shape):
    """advantages_and_returns on (N, T, B) storage: each seed's advantages and returns are gae_reference of its own
    (T, B) rollout, bootstrapped from its own next value and done flags."""
    N, T, B = shape
    rollouts = [random_rollout(T, B, seed=100 * k + T, done_prob=0.3) for k in range(N)]
    rewards, values, dones, next_value, next_done = (torch.stack(x) for x in zip(*rollouts))
    advantages, returns = torch.zeros(N, T, B), torch.zeros(N, T, B)
    fake_agent = lambda obs: (None, next_value)  # noqa: E731  (the bootstrap value of the next obs)
    script.advantages_and_returns(fake_agent, rewards, dones, values, advantages, returns, 0.99, 0.95, None, next_done)
    for k, rollout in enumerate(rollouts):
        want = gae_reference(*rollout, 0.99, 0.95)
        torch.testing.assert_close(advantages[k].double(), want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(returns[k].double(), want + rollout[1].double(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("norm_adv", [True, False])
@pytest.mark.parametrize("clip_vloss", [True, False])
def test_each_seeds_loss_is_the_twins_loss_of_that_seed_alone(norm_adv, clip_vloss):
    """ppo_loss on three seeds' minibatches (3, 128) at once: each seed's loss and statistics equal the twin's
    ppo_loss (tested against the float64 reference in test_ppo.py) of that seed's minibatch alone: the means and the
    advantages' normalisation are the seed's own (a normalisation over all three fails it)."""
    batches = [random_ppo_minibatch(128, seed=seed) for seed in (1, 2, 3)]
    batches[1] = [x * 3 + 1 for x in batches[1]]  # another scale: normalising across seeds would show
    stacked = [torch.stack(x) for x in zip(*batches)]
    loss, stats = script.ppo_loss(*stacked, 0.2, 0.01, 0.5, norm_adv, clip_vloss)
    for k, batch in enumerate(batches):
        want_loss, want = twin.ppo_loss(*batch, 0.2, 0.01, 0.5, norm_adv, clip_vloss)
        torch.testing.assert_close(loss[k], want_loss)
        for key, value in want.items():
            torch.testing.assert_close(stats[key][k], value, msg=key)


@pytest.mark.parametrize("probs", [[0.3, 0.7], [0.02, 0.5, 0.48], [1.0, 0.0]])
def test_sample_actions_draws_each_action_with_its_probability(probs):
    """Uniform draws on a fine grid of [0, 1): each action is drawn for a share of them equal to its softmax
    probability (to the grid's step), and its log-probability is log_softmax's."""
    logits = torch.tensor(probs).log().clamp(min=-1e4).expand(30000, -1)
    uniform = (torch.arange(30000) + 0.5) / 30000
    actions, logprobs = script.sample_actions(logits, uniform)
    shares = torch.bincount(actions, minlength=len(probs)) / 30000
    torch.testing.assert_close(shares, torch.tensor(probs), atol=1e-4, rtol=0)
    torch.testing.assert_close(logprobs, logits.log_softmax(-1).gather(1, actions[:, None]).squeeze(1))


def test_clipping_per_seed_is_clip_grad_norm_of_each_seed_alone():
    """Three seeds' gradients stacked, at norms above and below the bound: each seed's are clip_grad_norm_ of its own
    gradients (a norm over all seeds would shrink the small seed's too)."""
    shapes = [(64, 4), (64,), (2, 64)]
    scales = (10.0, 0.01, 1.0)
    grads = [torch.randn(3, *shape) * torch.tensor(scales).view(-1, *[1] * len(shape)) for shape in shapes]
    want = []
    for k in range(3):
        params = [torch.zeros(shape, requires_grad=True) for shape in shapes]
        for param, grad in zip(params, grads):
            param.grad = grad[k].clone()
        torch.nn.utils.clip_grad_norm_(params, 0.5)
        want.append([param.grad for param in params])
    script.clip_grad_norm_per_seed(grads, 0.5)
    for k in range(3):
        for got, expected in zip(grads, want[k]):
            torch.testing.assert_close(got[k], expected)


# ---------------------------------------------------------------- seed k in a batch is seed k alone


def run_of(seed_flags, folder, monkeypatch):
    folder.mkdir()
    calls = per_seed_updates(monkeypatch, script)
    line, _ = main_in_process(script, [*TINY, *seed_flags], folder)
    run_dir = folder / line["run_name"]
    checkpoint = torch.load(run_dir / f"{NAME}.pt", weights_only=True)
    return dict(line=line, dir=run_dir, checkpoint=checkpoint, updates=torch.stack(calls))


def mismatches(batch, alone):
    """What of seed 2 differs between the batch (its second seed) and the run of seed 2 alone."""
    found = []
    if seed_curve(batch["dir"], 2) != seed_curve(alone["dir"], 2):
        found.append("curve")
    if not torch.allclose(batch["updates"][:, :, 1], alone["updates"][:, :, 0], rtol=1e-4, atol=1e-5):
        found.append("losses")
    for key, value in alone["checkpoint"]["model"].items():
        if not torch.allclose(batch["checkpoint"]["models"][key][1], value, rtol=1e-4, atol=1e-5):
            found.append(f"params {key}")
            break
    return found


def test_seed_2_of_seeds_1_2_3_is_trained_as_seed_2_alone(tmp_path, monkeypatch):
    """16 updates: seed 2's return curve is the same episode for episode, its losses and statistics at every update
    and its final parameters equal the one-seed run's to float32 rounding (batched matmuls); the other seeds learned
    something else; the checkpoint's "model" is the first seed's agent, "models" every seed's."""
    batch = run_of(["--seed", "1", "--num-seeds", "3"], tmp_path / "batch", monkeypatch)
    monkeypatch.undo()
    alone = run_of(["--seed", "2"], tmp_path / "alone", monkeypatch)
    assert batch["updates"].shape == (16, len(script.LOGGED), 3) and alone["updates"].shape[2] == 1
    assert mismatches(batch, alone) == []
    assert len(seed_curve(alone["dir"], 2)) > 10
    assert seed_curve(batch["dir"], 1) != seed_curve(batch["dir"], 2) != seed_curve(batch["dir"], 3)
    assert batch["checkpoint"]["seeds"] == [1, 2, 3] and alone["checkpoint"]["seeds"] == [2]
    for key, value in batch["checkpoint"]["model"].items():
        assert torch.equal(value, batch["checkpoint"]["models"][key][0]), key


def clip_across_seeds(grads, max_norm):
    """A wrong clip: one norm over every seed's gradients, as clip_grad_norm_ on the stacked parameters."""
    norm = torch.stack([g.norm() for g in grads]).norm()
    for g in grads:
        g.mul_((max_norm / (norm + 1e-6)).clamp(max=1.0))


def normalise_across_seeds(newlogprob, oldlogprob, entropy, newvalue, oldvalue, advantages, returns, clip_coef,
                           ent_coef, vf_coef, norm_adv, clip_vloss, ppo_loss=script.ppo_loss):  # fmt: skip
    """A wrong loss: the advantages normalised over every seed's minibatch together."""
    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    return ppo_loss(newlogprob, oldlogprob, entropy, newvalue, oldvalue, advantages, returns, clip_coef, ent_coef,
                    vf_coef, False, clip_vloss)  # fmt: skip


def draws_by_position(seeds, counter, stream, n, counter_bits=script.counter_bits):
    """A wrong RNG: a seed's draws keyed by its position in the batch, not by its seed."""
    return counter_bits(torch.arange(len(seeds)), counter, stream, n)


WRONG = [("clip_grad_norm_per_seed", clip_across_seeds), ("ppo_loss", normalise_across_seeds),
         ("counter_bits", draws_by_position)]  # fmt: skip


@pytest.mark.parametrize("name,wrong", WRONG, ids=["clip-across", "normalise-across", "draw-by-position"])
def test_a_batch_that_ties_the_seeds_together_fails_the_comparison(name, wrong, tmp_path, monkeypatch):
    """The comparison above can fail: clipping by the norm of all seeds' gradients, normalising the advantages over
    all seeds, or drawing by batch position makes seed 2 of the batch differ from seed 2 alone."""
    monkeypatch.setattr(script, name, wrong)
    batch = run_of(["--seed", "1", "--num-seeds", "3"], tmp_path / "batch", monkeypatch)
    monkeypatch.undo()
    alone = run_of(["--seed", "2"], tmp_path / "alone", monkeypatch)
    assert mismatches(batch, alone)


# ---------------------------------------------------------------- compiled, captured, host reads

SEEDS3 = [*TINY, "--seed", "5", "--num-seeds", "3"]


# compiled with aot_eager in CI (Dynamo's graphs and AOTAutograd's functionalized update, run with eager's kernels);
# inductor's kernels, which --compile runs, with -m slow
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_three_seeds_compiled_equal_three_seeds_eager_and_compile_once(backend, tmp_path, monkeypatch):
    """--compile with --num-seeds 3: every seed's episodes are the eager run's (the draws are integer math, the same
    numbers compiled), the losses to float rounding; its three graphs (rollout step, GAE, update) compile in the first
    iteration and nothing recompiles after."""
    (tmp_path / "eager").mkdir()
    (tmp_path / "compiled").mkdir()
    plain, _ = main_in_process(script, SEEDS3, tmp_path / "eager")
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: compile_(fn, **{**kwargs, "backend": backend}))
    calls, iteration = [], script.iteration

    def counted(*args, **kwargs):
        calls.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
        with torch._dynamo.config.patch(error_on_recompile=len(calls) > 1):
            return iteration(*args, **kwargs)

    monkeypatch.setattr(script, "iteration", counted)
    compiled, _ = main_in_process(script, [*SEEDS3, "--compile"], tmp_path / "compiled")
    assert calls == [0, 3, 3, 3] and torch._dynamo.utils.counters["stats"]["unique_graphs"] == 3
    curves = [(tmp_path / d / line["run_name"] / "returns.csv").read_text().splitlines() for d, line in
              (("eager", plain), ("compiled", compiled))]  # fmt: skip
    drop_wall = lambda rows: [row.split(",")[::2] + row.split(",")[3:] for row in rows]  # noqa: E731
    assert drop_wall(curves[0]) == drop_wall(curves[1]) and plain["episodes"] > 40
    for key, value in plain["losses"].items():
        assert compiled["losses"][key] == pytest.approx(value, rel=1e-3, abs=1e-6), key


# the host reads of a run, by line: the log point's read of the ended episodes and of the losses, once an iteration
READ = "ended = torch.stack([ended_returns, ended_lengths.float()]).cpu().numpy()"
HOST_READS = {
    f"cpu at {NAME}.py: {READ}": ITERATIONS,
    f"numpy at {NAME}.py: {READ}": ITERATIONS,
    "tolist at bookkeeping.py: values = torch.stack([v.detach().float() for v in values]).tolist()": ITERATIONS,
}


@pytest.mark.parametrize("flags", [[], ["--compile"]], ids=["cudagraphs", "compile-cudagraphs"])
def test_the_whole_iteration_captured_gives_the_numbers_of_the_run_without(flags, tmp_path):
    """--cudagraphs with three seeds on the CPU stand-in (tests/gpu_standin.py): one CudaGraphModule, the whole
    iteration, captured in iteration 2 (within --measure-burnin) with no input and no host read in it, replayed
    after (its counter moves on in the graph: fresh draws); the run's curve and losses are those of the same run
    uncaptured, and the host reads are the log points' only."""
    want = run_main(script, [*SEEDS3, *flags], tmp_path / "plain", cudagraphs="uncaptured")
    with host_reads() as reads:
        got = run_main(script, [*SEEDS3, *flags], tmp_path / "graphs", cudagraphs=True)
    same_run(got, want)
    [contract] = CONTRACTS
    assert contract.name == "iteration" and contract.calls == ITERATIONS and contract.captured_at == 2
    assert contract.violations(max_bytes_in=0) == [] and contract.captured_at < script.Args.measure_burnin
    assert dict(reads) == HOST_READS and len(set(got[0]["seeds"]["mean_return"])) == 3


# ---------------------------------------------------------------- the script


def test_smoke_save_and_evaluate_a_seed_in_gymnasiums_cartpole(tmp_path):
    """A tiny run of seeds 3 and 4 as a subprocess: a results line with each seed's figures, the curve's seed column;
    the checkpoint played in gymnasium's CartPole-v1 by this script (--eval-seed 4) and, its first seed's agent, by
    ppo.py (the pair's format)."""
    proc, lines = run_script(NAME, *TINY, "--seed", "3", "--num-seeds", "2", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [line] = lines
    assert_finite_results_line(line, NAME)
    assert line["steps"] == ITERATIONS * ENVS * STEPS and line["seeds"]["seed"] == [3, 4]
    assert line["losses"]["learning_rate"] == pytest.approx(2.5e-4 / ITERATIONS)
    rows = list(csv.reader((tmp_path / line["run_name"] / "returns.csv").open()))
    assert rows[0] == ["step", "wall_s", "return", "seed"] and {row[3] for row in rows[1:]} == {"3", "4"}
    checkpoint = tmp_path / line["run_name"] / f"{NAME}.pt"
    for player, flags in ((NAME, ["--eval-seed", "4"]), ("ppo", [])):
        proc, lines = run_script(player, "--eval-checkpoint", str(checkpoint), "--eval-episodes", "2", *flags,
                                 tmp_path=tmp_path)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert lines[-1]["mode"] == "eval" and lines[-1]["episodes"] == 2 and lines[-1]["mean_return"] > 0


BAD_INPUTS = [
    (["--env-id", "Acrobot-v1"], "--env-id"),
    (["--num-seeds", "0"], "--num-seeds"),
    (["--target-kl", "0.02"], "--target-kl"),
    (["--capture-video", "True"], "--capture-video"),
    (["--cudagraphs", "True"], "--cudagraphs"),
    (["--num-minibatches", "3"], "--num-minibatches"),
    (["--total-timesteps", "100"], "--total-timesteps"),
]


@pytest.mark.parametrize("args,flag", BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_exits_2_with_one_line(args, flag, capsys, tmp_path):
    assert_main_exits_2_with_one_line(script, NAME, args_from_flags(script, args), flag, capsys, tmp_path)


def test_learns_cartpole_in_two_seeds_at_once(tmp_path):
    """Seeds 1 and 2 in one run, 32 envs x 32 steps (CleanRL's 512 steps an iteration, in shorter rollouts), 80k steps
    each, --compile. Measured on the 2-core AMD EPYC (torch 2.13.0+cpu, another job on the other core): each seed's
    last-100 mean 184-216 (seeds 1-6, three runs of two); a random policy gets about 22. The bar, 100, is 4.5x random
    with half the lowest seed's margin. Wall time 7-8 s with a warm compile cache, 52 s cold."""
    flags = ["--num-envs", "32", "--num-steps", "32", "--total-timesteps", "81920", "--compile", "--num-seeds", "2"]
    line, _ = main_in_process(script, flags, tmp_path)
    assert min(line["seeds"]["mean_return"]) >= 100, line["seeds"]
