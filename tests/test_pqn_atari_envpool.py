"""PQN Atari (envpool): Q(lambda) against a float64 reference, twin against eager, the scripts end to end on CPU."""

import copy
import json
import math
import re
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import pytest
import torch
from conftest import (
    ROOT,
    args_from_flags,
    assert_finite_results_line,
    assert_main_exits_2_with_one_line,
    assert_summary_matches,
    load_script,
    read_curve,
    run_script,
    strict_json,
)
from reference import q_lambda_returns_reference, random_rollout

from leanrl import bookkeeping as bk

EAGER, TWIN = "pqn_atari_envpool", "pqn_atari_envpool_torchcompile"
SCRIPTS = (EAGER, TWIN)


@pytest.fixture(scope="module")
def mods():
    return {name: load_script(name) for name in SCRIPTS}


@pytest.fixture
def twin_settings():
    """The twin switches TF32 on for the process: leave the other tests as they were."""
    precision = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(precision)


# ---------------------------------------------------------------- Q(lambda) returns, epsilon, the network


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("q_lambda", [0.0, 0.65, 1.0])
@pytest.mark.parametrize("shape", [(1, 5), (2, 4), (128, 8), (37, 3), (300, 1)])
def test_q_lambda_returns_match_float64_reference(mods, name, q_lambda, shape):
    T, B = shape
    rewards, values, dones, next_value, next_done = random_rollout(T, B, seed=T * 100 + B, done_prob=0.1)
    next_done[0] = 1.0  # an episode end at the rollout's end (env 0), and one inside it (env B - 1)
    if T > 1:
        dones[T // 2, -1] = 1.0
    assert next_done.sum() < B or B == 1, "the input must also bootstrap at the rollout's end"
    got = mods[name].q_lambda_returns(rewards, values, dones, next_value, next_done, 0.99, q_lambda)
    want = q_lambda_returns_reference(rewards, values, dones, next_value, next_done, 0.99, q_lambda)
    assert got.shape == (T, B) and got.dtype == torch.float32
    # float32 sums of up to ~1/(1 - gamma) terms of size ~1 with lambda = 1: relative error ~1e-5 at most
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def test_q_lambda_returns_of_the_twin_equal_the_eager_loop(mods):
    for T, B in [(1, 3), (2, 8), (128, 8), (1000, 2)]:
        rollout = random_rollout(T, B, seed=T + B, done_prob=0.2)
        eager = mods[EAGER].q_lambda_returns(*rollout, 0.9, 0.65)
        twin = mods[TWIN].q_lambda_returns(*rollout, 0.9, 0.65)
        torch.testing.assert_close(twin, eager, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", SCRIPTS)
def test_q_lambda_returns_bootstrap_only_where_the_episode_goes_on(mods, name):
    # two steps; env 0's second step ends its episode, env 1's first one does
    rewards, values = torch.tensor([[1.0, 1.0], [2.0, 2.0]]), torch.tensor([[5.0, 5.0], [3.0, 3.0]])
    dones, next_value, next_done = torch.tensor([[0.0, 0.0], [0.0, 1.0]]), torch.tensor([10.0, 10.0]), torch.ones(2)
    next_done[1] = 0.0
    got = mods[name].q_lambda_returns(rewards, values, dones, next_value, next_done, 0.5, 0.5)
    # env 0: R_1 = 2 (no bootstrap), R_0 = 1 + 0.5 * (0.5 * 2 + 0.5 * 3); env 1: R_1 = 2 + 0.5 * 10, R_0 = 1
    torch.testing.assert_close(got, torch.tensor([[2.25, 1.0], [2.0, 7.0]]))


@pytest.mark.parametrize("name", SCRIPTS)
def test_linear_schedule_is_cleanrls(mods, name):
    schedule = partial(mods[name].linear_schedule, 1.0, 0.01, 1000)
    assert [schedule(t) for t in (0, 500, 1000, 5000)] == pytest.approx([1.0, 0.505, 0.01, 0.01])


def test_epsilon_greedy_is_greedy_at_0_uniform_at_1_and_the_same_in_both(mods):
    torch.manual_seed(0)
    q_network = mods[EAGER].QNetwork(4)
    obs = torch.randint(0, 256, (512, 4, 84, 84), dtype=torch.uint8)
    with torch.no_grad():
        q_values = q_network(obs)
        greedy, _ = mods[EAGER].epsilon_greedy(q_network, obs, 0.0)
        torch.manual_seed(1)
        explored, values = mods[EAGER].epsilon_greedy(q_network, obs, 1.0)
        torch.manual_seed(1)
        twin_explored, twin_values = mods[TWIN].epsilon_greedy(q_network, obs, torch.tensor([1.0]))
    torch.testing.assert_close(greedy, q_values.argmax(dim=1))
    torch.testing.assert_close(values, q_values.max(dim=1).values)  # the greedy value, whatever the action
    counts = torch.bincount(explored, minlength=4)
    assert counts.min() > 512 / 4 * 0.6, counts  # every action drawn, about uniformly
    torch.testing.assert_close(twin_explored, explored)
    torch.testing.assert_close(twin_values, values)


def test_q_network_is_the_nature_cnn_with_layernorm_the_same_in_both(mods):
    nets = []
    for name in SCRIPTS:
        torch.manual_seed(3)
        nets.append(mods[name].QNetwork(6))
    layers = [type(m).__name__ for m in nets[0].network]
    assert layers.count("LayerNorm") == 4 and layers.count("Conv2d") == 3 and layers.count("Linear") == 2
    for (key, a), b in zip(nets[0].state_dict().items(), nets[1].state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=key)
    out = nets[0](torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8))
    assert out.shape == (5, 6) and out.isfinite().all()


# ---------------------------------------------------------------- the twin's step functions, compiled


def rollout_storage(T, B, seed):
    """The twin's storage after a rollout: T + 1 rows of observations and (reward, done), with episode ends."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randint(0, 256, (T + 1, B, 4, 84, 84), generator=g, dtype=torch.uint8)
    env_out = torch.stack([torch.randn(T + 1, B, generator=g), (torch.rand(T + 1, B, generator=g) < 0.3).float()], 1)
    obs, env_out = as_received(obs, env_out)
    return obs, env_out, torch.zeros(T, B, dtype=torch.long), torch.zeros(T, B)


def as_received(obs, env_out):
    """obs (T + 1, B, 4, 84, 84) and env_out (T + 1, 2, B) as the twins lay them out (issue 40: one copy a step): views
    of one byte buffer, a row per step and env of the obs bytes, then the reward and done as float32."""
    rows = torch.cat([obs.flatten(2), env_out.transpose(1, 2).contiguous().view(torch.uint8)], 2)
    obs_bytes = obs[0, 0].numel()
    return rows[..., :obs_bytes].view(obs.shape), rows[..., obs_bytes:].view(torch.float32).permute(0, 2, 1)


def test_policy_step_and_q_lambda_of_the_twin_compile_whole_and_equal_eager(mods):
    eager, twin = mods[EAGER], mods[TWIN]
    torch.manual_seed(0)
    q_network = twin.QNetwork(4)
    T, B = 5, 3
    obs, env_out, actions, values = rollout_storage(T, B, seed=1)
    epsilons = torch.tensor([1.0, 0.5, 0.5, 0.0, 0.2])
    compiled_policy = torch.compile(twin.policy_step, fullgraph=True, backend="aot_eager")
    steps = torch.arange(T)
    for step in range(T):
        # same generator state for both: the same coins and random actions
        torch.manual_seed(step)
        with torch.no_grad():
            want = eager.epsilon_greedy(q_network, obs[step], epsilons[step].item())
        torch.manual_seed(step)
        with torch._dynamo.config.patch(error_on_recompile=step > 0):  # every step and epsilon runs the one graph
            action = compiled_policy(q_network, obs, actions, values, epsilons, steps[step : step + 1])
        torch.testing.assert_close(action, want[0])
        torch.testing.assert_close(actions[step], want[0])
        torch.testing.assert_close(values[step], want[1])

    # bootstrap + Q(lambda) over the storage equal the eager script's, which keeps (T, B) rewards and dones
    returns = torch.zeros(T, B)
    compiled_targets = torch.compile(twin.q_lambda_targets, fullgraph=True, backend="aot_eager")
    for iteration in range(2):
        with torch._dynamo.config.patch(error_on_recompile=iteration > 0):
            compiled_targets(q_network, obs, env_out, values, returns, 0.99, 0.65)
        with torch.no_grad():
            next_value = q_network(obs[T]).max(dim=1).values
        rewards, dones, next_done = env_out[1:, 0], env_out[:T, 1], env_out[T, 1]
        assert dones[1:].sum() > 0
        want = eager.q_lambda_returns(rewards, values, dones, next_value, next_done, 0.99, 0.65)
        torch.testing.assert_close(returns, want, rtol=1e-5, atol=1e-5)
        env_out[:, 0] += 1.0  # the next iteration's rewards: same graph, new numbers


def test_compiled_update_of_the_twin_equals_the_eager_update_and_breaks_only_where_pytorch_does(mods):
    """The twin gathers its minibatch inside the update from the whole flat batch, the eager update gets it gathered:
    the same steps, the same weights after them. The graphs dynamo makes are pinned, so that a new break fails here.
    (dynamo's graphs run as they are: inductor's numbers are the regression cases' and the GPU-path test's.)"""
    from torch._dynamo.utils import counters

    eager, twin = mods[EAGER], mods[TWIN]
    torch.manual_seed(0)
    q_network = eager.QNetwork(4)
    twin_network = copy.deepcopy(q_network)
    initial = copy.deepcopy(q_network.state_dict())
    eager_optimizer = torch.optim.RAdam(q_network.parameters(), lr=2.5e-4)
    twin_optimizer = torch.optim.RAdam(twin_network.parameters(), lr=torch.tensor(2.5e-4))
    g = torch.Generator().manual_seed(0)
    batch = torch.randint(0, 256, (24, 4, 84, 84), generator=g, dtype=torch.uint8)
    batch = (batch, torch.randint(0, 4, (24,), generator=g), torch.randn(24, generator=g))
    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    counters.clear()
    twin_update = partial(torch.compile(twin.update, backend=counting_backend), twin_network, twin_optimizer, *batch)
    for iteration in range(3):
        # a minibatch is a view into one permutation, as in the scripts: another storage offset must not recompile
        mb_inds = torch.randperm(24, generator=torch.Generator().manual_seed(iteration)).split(8)[iteration]
        # the first call compiles; later ones, with the lr annealed in place in between, must not recompile
        with torch._dynamo.config.patch(error_on_recompile=iteration > 0):
            want = eager.update(q_network, eager_optimizer, *(x[mb_inds] for x in batch), max_grad_norm=10.0)
            got = twin_update(mb_inds, max_grad_norm=10.0)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        eager_optimizer.param_groups[0]["lr"] = 2.5e-4 / (iteration + 2)
        twin_optimizer.param_groups[0]["lr"].fill_(2.5e-4 / (iteration + 2))
    for (key, want), got in zip(q_network.state_dict().items(), twin_network.state_dict().values()):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=key)
        assert not torch.equal(want, initial[key]), f"{key} was not updated"
    breaks = {reason.splitlines()[0]: count for reason, count in counters["graph_break"].items()}
    # torch 2.13 cuts the update into 4 graphs (the loss, the gradient clipping, RAdam's step, the stacked output):
    # loss.backward() is not traced (1) and Optimizer.step's wrapper calls torch._dynamo.graph_break() before and after
    # the step (2). Optimizer.zero_grad would add one more ("marked as skipped"): the twin sets the grads to None.
    assert breaks == {"Unsupported Tensor.backward() call": 1, "Call to `torch._dynamo.graph_break()`": 2}, breaks
    assert len(graphs) == 4


# ---------------------------------------------------------------- episode accounting, bad input


@pytest.mark.parametrize("name", SCRIPTS)
def test_episode_accounting_on_a_scripted_env(mods, name, monkeypatch, tmp_path, capsys, twin_settings):
    """A game ends on its last life or at the time limit, never on a lost life; its score is the raw rewards' sum.
    (The PPO Atari test's scripted env: the same envpool-shaped script of lives, time limits and game overs.)"""
    from test_ppo_atari_envpool import ScriptedAtari

    module = mods[name]
    monkeypatch.setattr(module, "make_env", ScriptedAtari)
    args = module.Args(num_envs=2, num_steps=8, total_timesteps=16, num_minibatches=1, update_epochs=1, cuda=False)
    args.results_file = str(tmp_path / "results.jsonl")
    module.main(args)
    (line,) = [strict_json(text) for text in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert line["status"] == "ok" and line["episodes"] == 3 and line["mean_return"] == pytest.approx(8.0)
    curve = read_curve(line, tmp_path).splitlines()
    assert [(int(row.split(",")[0]), float(row.split(",")[2])) for row in curve[1:]] == ScriptedAtari.WANT
    assert_summary_matches(capsys.readouterr().out, line, args.results_file)


BAD_INPUTS = [
    (("--env-id", "NotAGame-v5"), "--env-id"),
    (("--env-id", "CartPole-v1"), "--env-id"),  # envpool knows it, but it is no Atari game
    (("--total-timesteps", "100"), "--total-timesteps"),
    (("--num-envs", "0"), "--num-envs"),
    (("--num-steps", "-1"), "--num-steps"),
    (("--update-epochs", "0"), "--update-epochs"),
    (("--num-minibatches", "3"), "--num-minibatches"),
    (("--learning-rate", "-1"), "--learning-rate"),
    (("--q-lambda", "1.5"), "--q-lambda"),
    (("--exploration-fraction", "0"), "--exploration-fraction"),
    (("--eval-epsilon", "2"), "--eval-epsilon"),
]


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("flags,flag", BAD_INPUTS, ids=[flags[0] for flags, _ in BAD_INPUTS])
def test_bad_input_exits_2_with_one_line(mods, name, flags, flag, capsys, tmp_path):
    args = args_from_flags(mods[name], flags)
    assert_main_exits_2_with_one_line(mods[name], name, args, flag, capsys, tmp_path)


def test_cudagraphs_without_cuda_exits_2_with_one_line_from_the_command_line(tmp_path):
    proc, lines = run_script(TWIN, "--cudagraphs", tmp_path=tmp_path)
    assert proc.returncode == 2 and lines == [] and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip() == f"{TWIN}.py: error: --cudagraphs needs CUDA, and none is available"


# ---------------------------------------------------------------- the scripts end to end


def scores(curve):
    """The (step, return) rows of a returns.csv, without the wall time."""
    return [(row.split(",")[0], row.split(",")[2]) for row in curve.splitlines()[1:]]


def tiny_flags():
    """The flags of this pair's seeded regression case: 10 iterations of 2 envs x 32 steps, 2 epochs of 2 minibatches;
    Breakout games end (seed 1: two, one of them scoring)."""
    from regression import PAIRS

    return list(PAIRS[EAGER])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The eager script and the twin (both saving their model), side by side, one thread each."""

    def run(name):
        tmp = tmp_path_factory.mktemp(name)
        proc, lines = run_script(name, *tiny_flags(), "--save-model", tmp_path=tmp)
        assert proc.returncode == 0, proc.stderr[-3000:]
        (line,) = lines
        assert_finite_results_line(line, name)
        assert line["compile"] is False and line["cudagraphs"] is False and line["steps"] == 640
        assert_summary_matches(proc.stdout, line, tmp / "results.jsonl")
        return tmp, line, read_curve(line, tmp)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(SCRIPTS, pool.map(run, SCRIPTS)))


def test_twin_plays_and_learns_like_the_eager_script(runs):
    """The twin without flags is the same algorithm: with the same seed it draws the same coins and random actions and
    takes the same greedy ones from the same weights, so the same games end with the same scores; the Q(lambda) returns
    are summed in another order, so the losses agree to float32 rounding rather than bitwise."""
    _, eager, eager_curve = runs[EAGER]
    _, twin, twin_curve = runs[TWIN]
    assert scores(twin_curve) == scores(eager_curve)
    assert any(float(score) > 0 for _, score in scores(eager_curve)), "no game scored: compare something that can"
    assert (twin["mean_return"], twin["episodes"]) == (eager["mean_return"], eager["episodes"]) and eager["episodes"]
    assert set(eager["losses"]) == {"td_loss", "q_values"}
    for key, value in eager["losses"].items():
        assert twin["losses"][key] == pytest.approx(value, rel=1e-3, abs=1e-6), key


def test_the_recorded_compiled_twin_plays_like_the_eager_script():
    """The regression cases (tests/regression.py, re-run and compared by tests/test_regression.py) hold the numbers of
    the twin --compile: inductor's kernels, aten's RNG on CPU (fallback_random): the same games as the eager script,
    the losses to float32 rounding. Compiling with inductor takes minutes on a 2-core CPU: it is not run here again."""
    golden = json.loads((ROOT / "tests" / "data" / "regression.json").read_text())
    eager, compiled = golden[EAGER], golden[f"{TWIN} --compile"]
    assert compiled["curve"] == eager["curve"] and compiled["episodes"] == eager["episodes"] > 0
    for key, value in eager["losses"].items():
        assert compiled["losses"][key] == pytest.approx(value, rel=1e-2, abs=1e-5), key


def test_checkpoint_plays_full_games(runs):
    tmp, line, _ = runs[TWIN]
    checkpoint = tmp / line["run_name"] / f"{TWIN}.pt"
    state = torch.load(checkpoint, weights_only=True)["model"]
    load_script(EAGER).QNetwork(4).load_state_dict(state)  # strict: the eager script's network loads the twin's
    proc, lines = run_script(TWIN, "--eval-checkpoint", str(checkpoint), "--eval-episodes", "1", tmp_path=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    evaluation = lines[-1]
    assert evaluation["mode"] == "eval" and evaluation["status"] == "ok"
    assert evaluation["episodes"] == 1 and math.isfinite(evaluation["mean_return"])
    assert evaluation["steps"] > 0 and evaluation["env_id"] == "Breakout-v5"
    summary = assert_summary_matches(proc.stdout, evaluation, tmp / "results.jsonl")
    assert Path(summary["run_dir"]) == checkpoint.parent  # an evaluation reports the checkpoint's folder


def test_a_diverged_run_stops_with_a_strict_json_line(tmp_path):
    # an lr of 1e30 really diverges: RAdam's first steps move the weights by about lr x the gradient, the Q-values
    # leave float32's range and the TD loss is infinite at the first log point
    flags = ("--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2", "--total-timesteps", "64")

    def run(name):
        (tmp_path / name).mkdir()
        return run_script(name, *flags, "--learning-rate", "1e30", tmp_path=tmp_path / name)

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip(SCRIPTS, pool.map(run, SCRIPTS)))
    for name, (proc, lines) in results.items():
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr
        (line,) = lines  # run_script parsed it with a strict JSON parser: no NaN, no Infinity
        assert line["status"] == "diverged" and line["steps"] == 32
        match = re.fullmatch(r"loss diverged at step 32: (\w+)=(nan|inf|-inf)", line["message"])
        assert match, line["message"]
        assert f"{name}.py: {line['message']}" in proc.stderr
        assert line["losses"][match[1]] is None  # the non-finite loss is written as null
        assert_summary_matches(proc.stdout, line, tmp_path / name / "results.jsonl")


# ---------------------------------------------------------------- the GPU path: host reads, the steps/s window

# Every read of a tensor to the host in a run of the twin at the regression flags (10 iterations of 2 envs x 32
# steps), by script line: the action of each env step, to step the envs: 320 (.cpu(), then .numpy() of the host copy,
# which reads nothing more but is counted on the same line); the logged losses once per iteration, in one read, where
# bookkeeping's check_finite checks them: 10; RAdam's constructor checks its tensor lr (0 <= lr) once: 1.
# numpy's view of the step upload's pinned host buffer, made once, is counted too (.numpy() of a host tensor: no sync).
TWIN_HOST_READS = {
    "cpu at pqn_atari_envpool_torchcompile.py: env_groups[group].send(action.cpu().numpy())": 320,
    "numpy at pqn_atari_envpool_torchcompile.py: env_groups[group].send(action.cpu().numpy())": 320,
    "tolist at bookkeeping.py: values = torch.stack([v.detach().float() for v in values]).tolist()": 10,
    "__bool__ at pqn_atari_envpool_torchcompile.py: optimizer = optim.RAdam(": 1,
    "numpy at pqn_atari_envpool_torchcompile.py: host = staging.numpy()  # numpy's views of it, made once (a host "
    "tensor's: no sync)": 1,
}

# The twin's copies of host data to the device in that run, by line (tests/gpu_standin.py uploads()), the same with
# --cudagraphs and --compile --cudagraphs (a CUDA graph's input copies are tensordict's, not the script's):
# - issue 40: one copy a (group's) env step, 320: numpy writes the step's obs, reward and done into the group's rows of
#   one host buffer (pinned on a GPU) laid out as the storage's rows, sent straight into row step + 1 non_blocking;
# - the iteration's epsilons, a list made a tensor and copied in: 10; the reset's obs: 1.
STEP_UPLOAD = (
    f"non_blocking copy_ at {TWIN}.py: received[step + 1, columns].copy_(staging[columns], non_blocking=True) from "
    f"the buffer made at {TWIN}.py: staging = torch.zeros(received.shape[1:], dtype=torch.uint8, "
    'pin_memory=device.type == "cuda")'
)
EPSILONS = f"{TWIN}.py: epsilons.copy_(torch.tensor(schedule), non_blocking=True)  # (trick: the iteration's epsilons "
EPSILONS += "in one copy)"
UPLOADS = {
    STEP_UPLOAD: 320,
    f"from host data at {EPSILONS}": 10,
    f"non_blocking copy_ at {EPSILONS} from the buffer made at no script line": 10,
    f"from host data at {TWIN}.py: obs[-1] = torch.as_tensor(np.concatenate([envs.reset()[0] for envs in env_groups]),"
    " device=device)": 1,
}


def pinned_uploads(flags):
    """tests/test_gpu_path.py counts the --cudagraphs and --compile --cudagraphs runs."""
    return UPLOADS


def test_host_reads_of_the_twin_are_the_pinned_ones_and_burnin_covers_the_captures(
    mods, monkeypatch, tmp_path, twin_settings
):
    """Under the CUDA-graph stand-in: a new read of a tensor to the host (a sync on a GPU) fails here, naming its line.
    And --measure-burnin at its default leaves every warm-up call (compiling, with --compile) and capture out of
    steps/s: each made to take 1000 s, each env step 0.01 s, steps/s is 2 envs / 0.01 s exactly. Issue 40: and a new
    copy of host data to the device fails here (the env step went up in two copies)."""
    from gpu_standin import host_reads, run_main, uploads
    from tensordict.nn import CudaGraphModule
    from test_ppo_atari_envpool import FakeClock

    module = mods[TWIN]
    clock = FakeClock()
    monkeypatch.setattr(bk, "time", clock)
    make_env, slow_calls = module.make_env, []

    def timed_make_env(*args, **kwargs):
        envs = make_env(*args, **kwargs)
        recv = envs.recv

        def timed_recv(*args, reset=False, **kwargs):  # the twin steps its envs with send and recv (reset: untimed)
            clock.now += 0.0 if reset else 0.01
            return recv(*args, reset=reset, **kwargs)

        envs.recv = timed_recv
        return envs

    class SlowWarmUps(CudaGraphModule):
        def __call__(self, *args, **kwargs):
            if self.counter < self._warmup:  # a warm-up call or the capture
                clock.now += 1000.0
                slow_calls.append(self)
            return super().__call__(*args, **kwargs)

    monkeypatch.setattr(module, "make_env", timed_make_env)
    monkeypatch.setattr(module, "CudaGraphModule", SlowWarmUps)
    flags = tiny_flags()
    del flags[flags.index("--measure-burnin") : flags.index("--measure-burnin") + 2]
    with host_reads() as reads, uploads() as copies:
        line, _ = run_main(module, flags, tmp_path, cudagraphs=True)
    assert line["status"] == "ok" and line["steps"] == 640
    assert dict(reads) == TWIN_HOST_READS
    assert dict(copies) == UPLOADS
    assert len(slow_calls) == 9  # three graphs, warmup=3 calls each (the last the capture)
    assert line["sps"] == pytest.approx(2 / 0.01)
