"""CartPole PQN pair: Q(lambda) returns against a float64 reference written from the paper's definition, the policy
step, the twin against the eager script (the same returns, the same update from the same batch, compiled whole,
no recompile), the twin's GPU path on the CPU stand-in (host reads pinned), the scripts on CPU (smoke, save and
evaluate, bad input, divergence, determinism, --track keys, steps/s burn-in) and learning on CartPole-v1."""

import copy
import csv
import importlib
import math
from types import SimpleNamespace
from unittest import mock

import pytest
import torch
import tyro
from conftest import (
    assert_finite_results_line,
    assert_summary_matches,
    check_bad_input,
    load_script,
    main_in_process,
    run_script,
)
from gpu_standin import CONTRACTS, host_reads, run_main
from reference import q_lambda_returns_reference, random_rollout
from regression import PAIRS
from test_gpu_path import MAX_BYTES_IN, same_run

from leanrl import bookkeeping as bk

EAGER, TWIN = "pqn", "pqn_torchcompile"
SCRIPTS = [EAGER, TWIN]
eager, twin = load_script(EAGER), load_script(TWIN)
MODULES = {EAGER: eager, TWIN: twin}

# tests/regression.py's flags: 6 iterations of 4 envs x 32 steps, 4 epochs of 4 minibatches of 32 each
TINY = list(PAIRS[EAGER])
ENVS, STEPS, ITERATIONS, UPDATES = 4, 32, 6, 16


def rollout(T, B, seed):
    """random_rollout with episode ends inside the rollout and at its end, in both kinds of env column."""
    rewards, values, dones, next_value, next_done = random_rollout(T, B, seed, done_prob=0.15)
    values, next_value = values * 5, next_value * 5  # max-Q values of the size a CartPole Q-network reaches
    if T > 2:
        dones[T // 2, 0] = 1.0  # an episode ends inside the rollout
    next_done[0] = 1.0  # ... and one at its end
    if B > 1:
        next_done[-1] = 0.0  # ... and one runs on past it
    return rewards, values, dones, next_value, next_done


# ---------------------------------------------------------------- Q(lambda) returns


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("shape", [(1, 3), (7, 2), (33, 5), (128, 4)])
@pytest.mark.parametrize("gamma,q_lambda", [(0.99, 0.65), (0.9, 0.0), (0.5, 1.0)])
def test_q_lambda_returns_match_the_papers_definition(name, shape, gamma, q_lambda):
    """Against the lambda-weighted mix of n-step returns in float64 (tests/reference.py), lambda 0 (one-step
    Q-learning targets) and 1 (the discounted return, bootstrapped at the rollout's end) included."""
    inputs = rollout(*shape, seed=shape[0] * 10 + shape[1])
    got = MODULES[name].q_lambda_returns(*inputs, gamma, q_lambda)
    assert got.shape == shape and got.dtype == torch.float32
    # float32 tolerances: the doubling scan adds the same terms in another order than the recursion
    torch.testing.assert_close(got, q_lambda_returns_reference(*inputs, gamma, q_lambda).float())


@pytest.mark.parametrize("name", SCRIPTS)
def test_q_lambda_returns_by_hand(name):
    """Three steps of one env worked by hand (gamma 0.5, lambda 0.5): the episode ends after step 1 (dones[2] = 1), a
    new one runs past the rollout's end and bootstraps from next_value 8."""
    rewards, values = torch.tensor([[1.0], [2.0], [3.0]]), torch.tensor([[0.0], [4.0], [100.0]])
    dones, next_value, next_done = torch.tensor([[0.0], [0.0], [1.0]]), torch.tensor([8.0]), torch.tensor([0.0])
    got = MODULES[name].q_lambda_returns(rewards, values, dones, next_value, next_done, 0.5, 0.5)
    # R2 = 3 + 0.5 * 8 = 7; R1 = 2 (its episode ended); R0 = 1 + 0.5 * (0.5 * R1 + 0.5 * values[1]) = 2.5
    torch.testing.assert_close(got, torch.tensor([[2.5], [2.0], [7.0]]))


@pytest.mark.parametrize("shape", [(128, 4), (64, 16), (5, 3)])
def test_twin_q_lambda_returns_equal_eager(shape):
    inputs = rollout(*shape, seed=7)
    torch.testing.assert_close(twin.q_lambda_returns(*inputs, 0.99, 0.65), eager.q_lambda_returns(*inputs, 0.99, 0.65))


def test_twin_returns_of_rollout_compile_whole_once_to_the_reference():
    """What the twin compiles: the bootstrap value max_a Q(next_obs) and the returns over the rollout storage, written
    in place; one graph (fullgraph), no recompile on a new rollout."""
    torch.manual_seed(0)
    q_network = twin.QNetwork(4, 2)
    compiled = torch.compile(twin.returns_of_rollout, fullgraph=True)
    for call in range(2):
        rewards, values, dones, _, next_done = rollout(STEPS, ENVS, seed=call)
        next_obs, returns = torch.randn(ENVS, 4), torch.zeros(STEPS, ENVS)
        with torch._dynamo.config.patch(error_on_recompile=call > 0):
            compiled(q_network, rewards, dones, values, returns, 0.99, 0.65, next_obs, next_done)
        next_value = q_network(next_obs).max(dim=1).values.detach()
        want = q_lambda_returns_reference(rewards, values, dones, next_value, next_done, 0.99, 0.65)
        torch.testing.assert_close(returns, want.float())


# ---------------------------------------------------------------- epsilon schedule and policy step


@pytest.mark.parametrize("name", SCRIPTS)
def test_linear_schedule_decays_over_its_fraction_then_stays(name):
    schedule = MODULES[name].linear_schedule
    for t, want in [(0, 1.0), (50000, 0.81), (125000, 0.525), (250000, 0.05), (400000, 0.05)]:
        assert schedule(1.0, 0.05, 250000.0, t) == pytest.approx(want, abs=1e-12), t


@pytest.mark.parametrize("name", SCRIPTS)
def test_epsilon_greedy_explores_at_the_rate_epsilon_and_gives_max_q(name):
    torch.manual_seed(0)
    q_network = MODULES[name].QNetwork(4, 3)
    obs = torch.randn(4000, 4)
    with torch.no_grad():
        q_values = q_network(obs)
        for epsilon in (0.0, 0.3, 1.0):
            actions, values = MODULES[name].epsilon_greedy(q_network, obs, torch.tensor(epsilon))
            torch.testing.assert_close(values, q_values.max(dim=1).values)  # the greedy value, whatever the action
            # a random action differs from the greedy one with probability epsilon * (1 - 1/3); sd ~0.007
            assert abs((actions != q_values.argmax(dim=1)).float().mean().item() - epsilon * 2 / 3) < 0.03, epsilon
    assert torch.bincount(actions, minlength=3).tolist() != [4000, 0, 0] and actions.dtype == torch.long


def test_twin_policy_step_writes_the_storage_as_eager_and_compiles_whole():
    """The same draws as the eager script's epsilon-greedy step (same seed), written into the step's storage row; one
    graph (fullgraph) that an epsilon changed in place and a new step index do not recompile."""
    torch.manual_seed(0)
    q_network = twin.QNetwork(4, 2)
    obs, step_index = torch.randn(STEPS, ENVS, 4), torch.arange(STEPS)
    actions, values, epsilon = torch.zeros(STEPS, ENVS, dtype=torch.long), torch.zeros(STEPS, ENVS), torch.ones(())
    compiled = torch.compile(twin.policy_step, backend="eager", fullgraph=True)
    for call, (step, value) in enumerate([(0, 1.0), (5, 0.5), (31, 0.05)]):
        epsilon.fill_(value)
        torch.manual_seed(step)
        with torch.no_grad():
            want_actions, want_values = eager.epsilon_greedy(q_network, obs[step], value)
        torch.manual_seed(step)
        with torch._dynamo.config.patch(error_on_recompile=call > 0):
            got = compiled(q_network, obs, actions, values, epsilon, step_index[step : step + 1])
        assert torch.equal(got, want_actions) and torch.equal(actions[step], want_actions)
        assert torch.equal(values[step], want_values)


# ---------------------------------------------------------------- the update


def random_batch(n, seed, scale):
    g = torch.Generator().manual_seed(seed)
    return dict(
        obs=torch.randn(n, 4, generator=g),
        actions=torch.randint(0, 2, (n,), generator=g),
        returns=torch.randn(n, generator=g) * scale,
    )


# compiled with aot_eager in CI: Dynamo's graph and AOTAutograd's functionalized update, run with eager's kernels.
# Inductor's kernels, which the twin's --compile runs in this file build and run, are compared with -m slow (26 s in a
# cold CI run)
@pytest.mark.parametrize(
    "compiled",
    [None, "aot_eager", pytest.param("inductor", marks=pytest.mark.slow)],
    ids=["twin", "twin-compiled", "twin-inductor"],
)
def test_twin_update_equals_eager_update(compiled):
    """Same init, same minibatches: the eager update (torch.optim.RAdam, float lr) and the twin's (the flat batch and
    the minibatch's indices, torch.optim's functional radam on its own state, a tensor lr) give the same losses and
    parameters over 8 steps: RAdam's first steps without the adaptive term and its rectified ones after step 5, with
    the gradient norm clipped (large returns) and not. Compiled as the script compiles it: backward traced, one graph
    (fullgraph), capturable RAdam; the lr changed in place recompiles nothing."""
    torch.manual_seed(0)
    q_e = eager.QNetwork(4, 2)
    q_t = copy.deepcopy(q_e)
    opt_e = torch.optim.RAdam(q_e.parameters(), lr=2.5e-4)
    opt_t = twin.make_radam(list(q_t.parameters()), torch.tensor(2.5e-4), capturable=compiled is not None)
    update = twin.update
    if compiled:
        torch._dynamo.config.trace_autograd_ops = True  # as main does (the conftest fixture restores it)
        update = torch.compile(twin.update, fullgraph=True, backend=compiled)
    clipped = 0
    for step in range(8):
        flat = random_batch(128, step, scale=100.0 if step % 2 else 1.0)
        mb_inds = torch.randperm(128, generator=torch.Generator().manual_seed(step))[:32]
        want = eager.update(q_e, opt_e, {k: v[mb_inds] for k, v in flat.items()}, 10.0)
        # clip_grad_norm_ left the grads at norm 10 * norm / (norm + 1e-6) where it clipped them
        clipped += bool(torch.nn.utils.get_total_norm([p.grad for p in q_e.parameters()]) > 9.99)
        with torch._dynamo.config.patch(error_on_recompile=step > 0):
            got = update(q_t, opt_t, flat["obs"], flat["actions"], flat["returns"], mb_inds, max_grad_norm=10.0)
        assert got.shape == (2,)  # one stacked output: [TD loss, mean Q]
        torch.testing.assert_close(got, torch.stack(want), rtol=1e-5, atol=1e-5)
        opt_e.param_groups[0]["lr"] = 1e-3 / (step + 1)
        opt_t["lr"].fill_(1e-3 / (step + 1))
    assert 0 < clipped < 8  # both kinds of step
    for (key, value), param in zip(q_e.state_dict().items(), q_t.state_dict().values()):
        torch.testing.assert_close(param, value, rtol=1e-4, atol=1e-6, msg=key)


def test_twin_steps_run_on_the_meta_device_without_host_reads():
    """The policy step, the returns and the update with a capturable RAdam on the meta device, which has no data: a host
    read (.item(), a data-dependent branch) raises there, and a tensor made on the CPU fails to meet the storage."""
    meta = torch.device("meta")
    radam = importlib.import_module("torch.optim.radam")  # its capturable step checks the device: let meta through
    supported = radam._get_capturable_supported_devices
    q_network = twin.QNetwork(4, 2).to(meta)
    obs, actions = torch.zeros(STEPS, ENVS, 4, device=meta), torch.zeros(STEPS, ENVS, dtype=torch.long, device=meta)
    values, rewards, dones, returns = (torch.zeros(STEPS, ENVS, device=meta) for _ in range(4))
    with_meta = lambda supports_xla=True: [*supported(supports_xla), "meta"]  # noqa: E731
    with host_reads() as reads, mock.patch.object(radam, "_get_capturable_supported_devices", with_meta):
        step = torch.arange(STEPS, device=meta)[2:3]
        action = twin.policy_step(q_network, obs, actions, values, torch.ones((), device=meta), step)
        twin.returns_of_rollout(q_network, rewards, dones, values, returns, 0.99, 0.65, obs[0], dones[0])
        optimizer = twin.make_radam(list(q_network.parameters()), torch.tensor(2.5e-4, device=meta), capturable=True)
        flat = obs.flatten(0, 1), actions.view(-1), returns.view(-1)
        for mb_inds in torch.randperm(STEPS * ENVS, device=meta).split(32)[:2]:  # RAdam's state made, then used
            stats = twin.update(q_network, optimizer, *flat, mb_inds, 10.0)
    assert action.device == stats.device == meta and stats.shape == (2,) and not reads, reads


# ---------------------------------------------------------------- the GPU path on the CPU stand-in

# the host reads of a twin run at the TINY flags, by line: the actions of each env step (once to the host, and numpy
# of the host copy) and one read of the losses and the lr per iteration; a new read fails here, naming its line
STEP = "next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())"
HOST_READS = {
    f"cpu at pqn_torchcompile.py: {STEP}": ITERATIONS * STEPS,
    f"numpy at pqn_torchcompile.py: {STEP}": ITERATIONS * STEPS,
    "tolist at bookkeeping.py: values = torch.stack([v.detach().float() for v in values]).tolist()": ITERATIONS,
}


def pinned_host_reads(flags):
    """The host reads of a twin run at the TINY flags and these flags: the same with --cudagraphs and --compile
    --cudagraphs (tests/test_gpu_path.py counts those runs)."""
    return HOST_READS


def test_host_reads_of_the_twin_are_the_pinned_ones(tmp_path):
    """Every read of a tensor to the host in a twin run (RAdam capturable as on CUDA), counted by line; the runs with
    --cudagraphs and --compile --cudagraphs are counted in tests/test_gpu_path.py."""
    with host_reads() as reads:
        line, _ = run_main(twin, TINY, tmp_path)
    assert line["status"] == "ok" and line["steps"] == ITERATIONS * ENVS * STEPS
    assert dict(reads) == pinned_host_reads([])


def test_cudagraphs_capture_every_step_within_the_default_burnin(tmp_path):
    """The twin's own RAdam (capturable under --cudagraphs) is captured, the run gives the numbers of the run without
    CUDA graphs, and every graph is captured within --measure-burnin's default: the returns, called once an
    iteration, at their 5th call."""
    want = run_main(twin, TINY, tmp_path / "plain")
    got = run_main(twin, TINY, tmp_path / "graphs", cudagraphs=True, force_capturable=False)
    same_run(got, want)
    calls = {"policy_step": STEPS, "returns_of_rollout": 1, "update": UPDATES}  # per iteration
    captured_in = {c.name: math.ceil(c.captured_at / calls[c.name]) for c in CONTRACTS}
    assert set(captured_in) == set(calls) and all(c.violations(MAX_BYTES_IN[TWIN]) == [] for c in CONTRACTS)
    assert captured_in["returns_of_rollout"] == 5 and max(captured_in.values()) < twin.Args.measure_burnin


# ---------------------------------------------------------------- the scripts


def check_run(name, proc, lines, tmp_path, flags=()):
    assert proc.returncode == 0, proc.stderr[-3000:]
    [line] = lines
    assert_finite_results_line(line, name)
    assert_summary_matches(proc.stdout, line, tmp_path / "results.jsonl")
    assert line["compile"] == ("--compile" in flags) and line["cudagraphs"] is False
    rows = list(csv.reader((tmp_path / line["run_name"] / "returns.csv").open()))
    assert rows[0] == ["step", "wall_s", "return"] and len(rows) - 1 == line["episodes"]
    return line


@pytest.mark.parametrize("name,flags", [(EAGER, []), (TWIN, ["--compile"])], ids=["eager", "twin-compile"])
def test_smoke_cartpole_save_and_evaluate(name, flags, tmp_path):
    """A tiny run as a subprocess: its results line, summary and curve; the lr annealed and epsilon decayed as
    CleanRL's; the checkpoint, in the eager script's format, played by the other script of the pair."""
    proc, lines = run_script(name, *TINY, *flags, "--save-model", tmp_path=tmp_path)
    line = check_run(name, proc, lines, tmp_path, flags)
    assert line["steps"] == ITERATIONS * ENVS * STEPS and line["episodes"] > 10
    assert set(line["losses"]) == {"td_loss", "q_values", "learning_rate"}
    assert line["losses"]["learning_rate"] == pytest.approx(2.5e-4 / ITERATIONS)  # the last iteration's
    assert line["epsilon"] == pytest.approx(0.05)  # at half the run, and stays
    checkpoint = tmp_path / line["run_name"] / f"{name}.pt"
    weights = torch.load(checkpoint, weights_only=True)["model"]
    assert weights.keys() == eager.QNetwork(4, 2).state_dict().keys()
    player = TWIN if name == EAGER else EAGER
    proc, lines = run_script(player, "--eval-checkpoint", str(checkpoint), "--eval-episodes", "2", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert lines[-1]["mode"] == "eval" and lines[-1]["episodes"] == 2 and lines[-1]["mean_return"] > 0


def test_same_seed_same_numbers_and_the_compiled_twin_as_the_twin(tmp_path):
    """Same seed on CPU: the same losses, episodes and curves twice (eager, twin). The twin with --compile draws what
    the twin draws, so its episodes are the twin's; its losses agree to float rounding: inductor's kernels, and RAdam
    capturable (bias corrections in float32 tensors, not Python floats), over 96 updates (measured: 2.7e-4 relative)."""
    runs = {}
    for key, name, flags in [("e1", EAGER, []), ("e2", EAGER, []), ("t1", TWIN, []), ("t2", TWIN, [])]:
        (tmp_path / key).mkdir()
        runs[key] = main_in_process(MODULES[name], [*TINY, "--seed", "3", *flags], tmp_path / key)
    (tmp_path / "c").mkdir()
    runs["c"] = main_in_process(twin, [*TINY, "--seed", "3", "--compile"], tmp_path / "c")
    for a, b in [("e1", "e2"), ("t1", "t2")]:
        assert runs[a][0]["losses"] == runs[b][0]["losses"] and runs[a][1] == runs[b][1], a
    (plain, curve), (compiled, compiled_curve) = runs["t1"], runs["c"]
    assert compiled_curve == curve and compiled["episodes"] == plain["episodes"] > 10
    for key, value in plain["losses"].items():
        assert compiled["losses"][key] == pytest.approx(value, rel=1e-3), key


BAD_INPUTS = [
    (["--env-id", "Pendulum-v1"], "--env-id"),  # continuous actions
    (["--env-id", "FrozenLake-v1"], "--env-id"),  # discrete observations
    (["--env-id", "Breakout-v5"], "--env-id"),  # an Atari (envpool) id
    (["--env-id", "NoSuchEnv-v0"], "--env-id"),
    (["--total-timesteps", "500"], "--total-timesteps"),  # less than one iteration of 4 x 128
    (["--num-minibatches", "3"], "--num-minibatches"),  # does not divide 512
    (["--num-envs", "0"], "--num-envs"),
    (["--update-epochs", "0"], "--update-epochs"),
    (["--max-grad-norm", "0"], "--max-grad-norm"),
    (["--learning-rate", "-1"], "--learning-rate"),
    (["--exploration-fraction", "0"], "--exploration-fraction"),
    (["--q-lambda", "1.5"], "--q-lambda"),
    (["--gamma", "-0.1"], "--gamma"),
]


SUBPROCESS_CASES = [(EAGER, *BAD_INPUTS[0]), (EAGER, *BAD_INPUTS[4]), (TWIN, ["--cudagraphs"], "--cudagraphs")]


@pytest.mark.parametrize("name,args,flag", SUBPROCESS_CASES, ids=[f"{n} {' '.join(a)}" for n, a, _ in SUBPROCESS_CASES])
def test_bad_input_exits_2_with_one_line(name, args, flag, tmp_path):
    check_bad_input(name, args, flag, tmp_path)


@pytest.mark.parametrize("name", SCRIPTS)
@pytest.mark.parametrize("args,flag", BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_main_rejects_bad_input(name, args, flag, capsys, tmp_path):
    """Every case in-process (a subprocess each would only repeat the runs above): one line, exit 2, nothing written."""
    cli = tyro.cli(MODULES[name].Args, args=[*args, "--no-cuda", "--results-file", str(tmp_path / "results.jsonl")])
    with pytest.raises(SystemExit) as exit_info:
        MODULES[name].main(cli)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"{name}.py: error: ") and flag in err, err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_file_that_is_not_a_checkpoint_of_the_script_exits_2(name, capsys, tmp_path):
    """DQN's checkpoint (its MLP has no LayerNorm) is refused before any run starts."""
    path = tmp_path / "dqn.pt"
    torch.save({"args": {"env_id": "CartPole-v1"}, "model": load_script("dqn").QNetwork(4, 2).state_dict()}, path)
    cli = tyro.cli(MODULES[name].Args, args=["--eval-checkpoint", str(path), "--no-cuda"])
    cli.results_file = str(tmp_path / "results.jsonl")
    with pytest.raises(SystemExit) as exit_info:
        MODULES[name].main(cli)
    assert exit_info.value.code == 2 and "--eval-checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "results.jsonl").exists()


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_real_divergence_is_reported_in_strict_json(name, tmp_path):
    """A learning rate of 1e30 wrecks the Q-network in the first update: the run stops at the first log point (the
    end of the first iteration), exit 1, status diverged, a message naming the step and the loss."""
    proc, lines = run_script(name, *TINY, "--learning-rate", "1e30", tmp_path=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    [line] = lines  # run_script parsed it as strict JSON
    assert line["status"] == "diverged" and line["steps"] == ENVS * STEPS
    assert line["message"].startswith(f"loss diverged at step {ENVS * STEPS}: ") and line["message"] in proc.stderr
    assert None in line["losses"].values() or not all(map(math.isfinite, line["losses"].values()))
    assert_summary_matches(proc.stdout, line, tmp_path / "results.jsonl")


@pytest.mark.parametrize("name", SCRIPTS)
def test_steps_per_second_leave_the_burnin_iterations_out(name, tmp_path, monkeypatch):
    """A fake clock: the first iteration's first update (where the twin compiles) takes 100 s, every update 1 s, the
    env no time. With --measure-burnin 2, steps/s are those of iterations 3 to 6."""
    module, clock = MODULES[name], SimpleNamespace(now=1000.0)
    update = module.update

    def timed_update(*args, **kwargs):
        clock.now += 100.0 if clock.now == 1000.0 else 1.0
        return update(*args, **kwargs)

    monkeypatch.setattr(bk, "time", SimpleNamespace(time=lambda: clock.now))
    monkeypatch.setattr(module, "update", timed_update)
    line, _ = main_in_process(MODULES[name], [*TINY, "--measure-burnin", "2"], tmp_path)
    assert line["sps"] == pytest.approx((ITERATIONS - 2) * ENVS * STEPS / ((ITERATIONS - 2) * UPDATES))


@pytest.mark.parametrize("name", SCRIPTS)
def test_track_logs_cleanrls_keys_every_iteration(name, tmp_path, fake_wandb):
    """With --track, CleanRL's pqn.py keys at every iteration (losses/td_loss, losses/q_values, charts/learning_rate,
    charts/SPS) and the episodes' charts; the last log point's values are those of the results line."""
    line, _ = main_in_process(MODULES[name], [*TINY, "--track"], tmp_path)
    keys = {"losses/td_loss", "losses/q_values", "charts/learning_rate", "charts/SPS"}
    assert fake_wandb.keys() == keys | {"charts/episodic_return", "charts/episodic_length"}
    logs = [(step, data) for step, data in fake_wandb.logs if "losses/td_loss" in data]
    assert [step for step, _ in logs] == [ENVS * STEPS * i for i in range(1, ITERATIONS + 1)]
    lrs = [data["charts/learning_rate"] for _, data in logs]
    assert lrs == pytest.approx([2.5e-4 * (1 - i / ITERATIONS) for i in range(ITERATIONS)])
    assert logs[-1][1]["losses/td_loss"] == line["losses"]["td_loss"] and fake_wandb.finished


# ---------------------------------------------------------------- learning
# CartPole-v1: the best return is 500; a random policy gets about 22.


def learn(name, flags, steps, seed, tmp_path):
    proc, lines = run_script(name, "--total-timesteps", str(steps), "--seed", str(seed), *flags, tmp_path=tmp_path,
                             timeout=3600)  # fmt: skip
    return check_run(name, proc, lines, tmp_path, flags)


def test_learns_cartpole_in_51k_steps(tmp_path):
    """CleanRL's settings on a 51,200-step budget (100 iterations; epsilon reaches 0.05 at half of it), the eager
    script (the twin's runs equal its own compiled and captured ones, tested above; a compile here would cost more
    than the run). Mean of the last 100 episodes, measured on a 2-core AMD EPYC under heavy load (130-190 s a run):
    101.4, 59.4, 49.6 for seeds 1, 2, 3 (at 20,480 steps seeds 2 and 3 had collapsed to one action, 9.6 and 9.5). The
    bar, 35, is above a random policy's 22 and under every measured seed."""
    line = learn(EAGER, [], 51200, 1, tmp_path)
    assert line["mean_return"] >= 35, line["mean_return"]


@pytest.mark.slow
@pytest.mark.parametrize("name,flags", [(EAGER, []), (TWIN, ["--compile"])], ids=["eager", "twin-compile"])
def test_reaches_475_on_cartpole_at_500k_steps(name, flags, tmp_path):
    """The issue's bar, CleanRL's defaults: the mean of the last 100 episodes at 500k steps is at least 475.
    Measured (seed 1, a 2-core AMD EPYC shared with other jobs, load average about 14): eager 500.0 (the mean first
    reached 475 at step 259,124), 2,903 s; twin --compile 500.0 (first 475 at step 340,048), 4,167 s."""
    line = learn(name, flags, 500000, 1, tmp_path)
    assert line["mean_return"] >= 475, line["mean_return"]
