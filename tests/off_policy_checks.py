"""The checks that the SAC and TD3 pairs share (tests/test_sac_continuous_action.py and
tests/test_td3_continuous_action.py): the same replay-buffer twin layout (two Q-networks stacked for vmap), the same
tiny budgets and the same run bookkeeping. Each test file calls them with its pair's own networks and flags."""

import copy

import numpy as np
import pytest
import torch
from conftest import (
    args_from_flags,
    assert_finite_results_line,
    assert_main_exits_2_with_one_line,
    assert_same_runs_and_eager_format_checkpoints,
    assert_summary_matches,
    curve_points,
    read_curve,
    run_script,
)
from tensordict import TensorDict

# 300 steps, learning from step 100: 200 updates of batch 32 (100 with the actor), enough to run every part
TINY = ("--learning-starts", "100", "--total-timesteps", "300", "--batch-size", "32", "--buffer-size", "1000")
TINY += ("--measure-burnin", "10")
# CI's learning budget: CleanRL's hyper-parameters but for 500 random steps (CleanRL: 5000 for SAC, 25000 for TD3)
# and batches of 64 (not 256): 3500 updates
QUICK = ["--learning-starts", "500", "--total-timesteps", "4000", "--batch-size", "64"]


def random_batch(n, seed, obs_dim=5, act_dim=3):
    g = torch.Generator().manual_seed(seed)
    terminated = (torch.rand(n, generator=g) < 0.3).float()
    if n > 1:
        terminated[0], terminated[1] = 1.0, 0.0  # one terminated transition, one truncated or running
    return dict(
        obs=torch.randn(n, obs_dim, generator=g),
        actions=torch.rand(n, act_dim, generator=g) * 2 - 1,
        rewards=torch.randn(n, generator=g),
        next_obs=torch.randn(n, obs_dim, generator=g),
        terminations=terminated,
    )


# ---------------------------------------------------------------- twin against eager


def networks(actor_class, q_class, obs_dim=5, act_dim=3, seed=0):
    """The eager script's actor (actions in [-2, 1]) and its two Q-networks, seeded."""
    torch.manual_seed(seed)
    actor = actor_class(obs_dim, -np.ones(act_dim) * 2, np.ones(act_dim))
    return actor, q_class(obs_dim, act_dim), q_class(obs_dim, act_dim)


def stacked(q_class, qf1, qf2, obs_dim=5, act_dim=3):
    """The twin's Q-networks: copies of qf1 and qf2 stacked, and the meta-device network (the twin's q_class) they
    run through."""
    params = TensorDict.from_modules(copy.deepcopy(qf1), copy.deepcopy(qf2), as_module=True)
    return params, q_class(obs_dim, act_dim).to("meta")


def vmap_over_stacked_q_params_equals_the_two_networks(twin, networks, stacked):
    _, qf1, qf2 = networks()
    params, qnet = stacked(qf1, qf2)
    b = random_batch(33, 1)
    got = twin.q_values(qnet, params, b["obs"], b["actions"])
    want = torch.stack([qf1(b["obs"], b["actions"]).view(-1), qf2(b["obs"], b["actions"]).view(-1)])
    assert got.shape == (2, 33)
    torch.testing.assert_close(got, want)
    # and the gradients reach each network's own slice of the stack
    (got * torch.tensor([[1.0], [-2.0]])).sum().backward()
    (want * torch.tensor([[1.0], [-2.0]])).sum().backward()
    torch.testing.assert_close(params["fc1", "weight"].grad[0], qf1.fc1.weight.grad)
    torch.testing.assert_close(params["fc3", "bias"].grad[1], qf2.fc3.bias.grad)


def compiled_train_step_equals_the_uncompiled_one(twin, twin_learner, call_train_step, backend, n_stats, compared):
    """The twin's whole update (buffer write, sampling, the updates, fused targets) compiled on CPU as one graph each
    (fullgraph, torch.autograd.grad traced as the script has it), against the same function run eagerly, step by
    step; inductor draws its random numbers as eager does (fallback_random), so both see the same batches and noise.
    Both variants (with and without the actor) compile once; later calls recompile nothing.

    call_train_step(fn, learner, count, transition, policy_update, call): the pair's call of train_step in its call-th
    step; n_stats: the statistics it stacks (without the actor, with it); compared: the learner's modules, whose
    state dicts must agree at 1e-5, and tensors, at 1e-6. Returns the eagerly run learner."""
    ref, comp = twin_learner(), twin_learner()
    g = torch.Generator().manual_seed(0)
    fill = dict(
        obs=torch.randn(64, 4, generator=g),
        actions=torch.rand(64, 1, generator=g) * 6 - 3,
        rewards=torch.randn(64, generator=g),
        next_obs=torch.randn(64, 4, generator=g),
        terminations=(torch.rand(64, generator=g) < 0.2).float(),
    )
    counts = [twin.buffer_add(L["buffer"], torch.zeros((), dtype=torch.long), fill) for L in (ref, comp)]
    torch._dynamo.reset()
    compiled = torch.compile(twin.train_step, fullgraph=True, backend=backend)
    modules, tensors = compared
    with torch._inductor.config.patch(fallback_random=True), torch._dynamo.config.patch(trace_autograd_ops=True):
        for call, policy_update in enumerate([False, True, False, True, False]):
            transition = {k: v[call : call + 1] for k, v in random_batch(6, 10 + call, 4, 1).items()}
            torch.manual_seed(call)
            counts[0], want = call_train_step(twin.train_step, ref, counts[0], transition, policy_update, call)
            torch.manual_seed(call)
            with torch._dynamo.config.patch(error_on_recompile=call > 1):
                counts[1], got = call_train_step(compiled, comp, counts[1], transition, policy_update, call)
            assert int(counts[1]) == int(counts[0]) == 65 + call
            # one stacked tensor of statistics, in STATS order
            assert got.shape == want.shape == (n_stats[policy_update],)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
            for key in modules:
                torch.testing.assert_close(comp[key].state_dict(), ref[key].state_dict(), rtol=1e-4, atol=1e-5)
            for key in tensors:
                torch.testing.assert_close(comp[key], ref[key], rtol=1e-4, atol=1e-6)
    return ref


# ---------------------------------------------------------------- scripts as subprocesses


def smoke_tiny_budget(name, flags, tmp_path):
    """The default env (HalfCheetah-v4) runs the tiny budget: a finite results line, its summary and its return curve.
    Returns the results line."""
    proc, lines = run_script(name, *TINY, *flags, tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = lines
    assert_finite_results_line(line, name)
    assert_summary_matches(proc.stdout, line, tmp_path / "results.jsonl")
    assert line["env_id"] == "HalfCheetah-v4" and line["mode"] == "train" and line["steps"] == 300
    assert line["compile"] is ("--compile" in flags) and line["cudagraphs"] is False
    # HalfCheetah-v4's XML uses MuJoCo 4's deprecated settotalmass: the scripts drop exactly that warning
    assert "settotalmass" not in proc.stderr + proc.stdout and not (tmp_path / "MUJOCO_LOG.TXT").exists()
    curve = read_curve(line, tmp_path).splitlines()
    assert curve[0] == "step,wall_s,return" and len(curve) == line["episodes"] + 1
    return line


def runs_are_deterministic_and_the_checkpoint_evaluates(name, q_network, actor_key, tmp_path):
    """Same seed, same machine, on CPU: the same losses, episodes and weights twice; the saved actor (actor_key: one
    of its weights) plays, and the twin saves the eager script's checkpoint format (q_network: an eager Q-network)."""
    runs = []
    for i in range(2):
        (tmp_path / str(i)).mkdir()
        proc, lines = run_script(
            name, *TINY, "--env-id", "InvertedPendulum-v4", "--save-model", tmp_path=tmp_path / str(i)
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "Warning" not in proc.stderr, proc.stderr[-3000:]  # none a user must learn to ignore
        runs.append(lines[0])
    assert_same_runs_and_eager_format_checkpoints(name, TINY, runs, tmp_path, q_network)

    tmp_path = tmp_path / "1"
    checkpoint_path = tmp_path / runs[1]["run_name"] / f"{name}.pt"
    assert not list(checkpoint_path.parent.glob("*.tmp")), "the checkpoint is written atomically"
    checkpoint = torch.load(checkpoint_path, weights_only=True)
    assert checkpoint["args"]["env_id"] == "InvertedPendulum-v4" and actor_key in checkpoint["actor"]
    proc, lines = run_script(name, "--eval-checkpoint", str(checkpoint_path), "--eval-episodes", "3", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = lines[-1]
    assert line["mode"] == "eval" and line["status"] == "ok" and line["env_id"] == "InvertedPendulum-v4"
    assert line["episodes"] == 3 and line["mean_return"] > 0 and line["steps"] > 0
    assert_summary_matches(proc.stdout, line, tmp_path / "results.jsonl")


def non_finite_loss_stops_the_run_as_diverged(name, lr_flag, tmp_path):
    # a huge step size (lr_flag: the Q-networks' learning rate): the Q-weights blow up after the first steps, the
    # Q-values and the loss overflow
    proc, lines = run_script(name, *TINY, "--env-id", "InvertedPendulum-v4", lr_flag, "1e30", tmp_path=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    [line] = lines  # parsed strictly: no NaN in the file
    assert line["status"] == "diverged" and line["message"].startswith("loss diverged at step ")
    assert f"{name}.py: {line['message']}" in proc.stderr
    assert None in line["losses"].values()
    assert_summary_matches(proc.stdout, line, tmp_path / "results.jsonl")


# ---------------------------------------------------------------- bad input


def bad_input_exits_2_with_one_line(module, name, flags, extra, flag, capsys, tmp_path):
    """main() with these flags stops with exit code 2 and one line naming the flag (extra: ("--compile", "True") for
    the twin compiled: it checks its input before it compiles anything)."""
    args = args_from_flags(module, (*flags, *extra))
    assert getattr(args, "compile", False) is bool(extra)
    assert_main_exits_2_with_one_line(module, name, args, flag, capsys, tmp_path)


def results_file_that_cannot_be_written_exits_2(module, name, extra, where, capsys, tmp_path):
    """--results-file naming a folder, or a file under a plain file: one line naming the flag, exit 2, and nothing
    written (no results line, no run folder)."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "plain").write_text("not a folder\n")
    results_file = tmp_path / "folder" if where == "a-folder" else tmp_path / "plain" / "results.jsonl"
    args = args_from_flags(module, extra)
    args.results_file, args.cuda = str(results_file), False
    with pytest.raises(SystemExit) as exit_info:
        module.main(args)
    assert exit_info.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith(f"{name}.py: error: --results-file {results_file}"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "plain"]
    assert not any((tmp_path / "folder").iterdir())
    assert (tmp_path / "plain").read_text() == "not a folder\n"


def bad_input_from_the_command_line(name, flags, flag, tmp_path):
    proc, lines = run_script(name, *TINY, *flags, tmp_path=tmp_path, timeout=120)
    assert proc.returncode == 2
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith(f"{name}.py: error: ") and flag in err[0], proc.stderr
    assert "Traceback" not in proc.stderr and lines == []
    if flag == "--cudagraphs":
        assert err[0] == f"{name}.py: error: --cudagraphs needs CUDA, and none is available"


# ---------------------------------------------------------------- learning
# InvertedPendulum-v4: the best return is 1000 (1000 steps balanced); uniform random actions get about 6-8.


def learn(name, flags, tmp_path):
    """Train on InvertedPendulum-v4; returns (results line, mean of the last 10 episodic returns)."""
    proc, lines = run_script(name, "--env-id", "InvertedPendulum-v4", *flags, tmp_path=tmp_path, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Warning" not in proc.stderr, proc.stderr[-3000:]  # none a user must learn to ignore, compiled or not
    line = lines[0]
    assert_finite_results_line(line, name)
    assert_summary_matches(proc.stdout, line, tmp_path / "results.jsonl")
    assert line["compile"] is ("--compile" in flags)
    returns = [score for _, score in curve_points(line, tmp_path)]
    return line, sum(returns[-10:]) / len(returns[-10:])
